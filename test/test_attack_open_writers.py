"""Attacks on the registry of open writers and its claim horizon (DESIGN.md "The insert-only
queue", step 1: src/shared/open_writers.cpp, src/enqueue/generation_stamp.cpp, the test-build
claim seam). The promise: a claim never passes a row that a transaction in progress at the claim
later commits below the claim's horizon. Each test fails if its attack works; the ones marked
xfail are attacks that work on the current code."""

import threading

import psycopg
import pytest

from harness.wait import wait_until
from test_open_writers import MODES, Relay, committed_ids, insert, lsn, reset
from test_open_writers import pg  # noqa: F401 (fixture)


@pytest.fixture(autouse=True)
def empty(pg):
    yield
    pg.sql("DROP TRIGGER IF EXISTS a_user ON gen")
    pg.sql("DROP TRIGGER IF EXISTS z_user ON gen")
    reset(pg)


def finish(relay, pg):
    """With every writer ended, one claim reaches the WAL insert position: all that is left."""
    relay.claim()
    relay.close()
    return relay.claimed


def wal_insert(c):
    return c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]


# -- attacks that work ------------------------------------------------------------------------------

@pytest.mark.xfail(strict=True, reason="an UPDATE of order_lsn does not go through the BEFORE INSERT "
                   "trigger: its transaction is in no registry entry (DESIGN.md L3, refusing UPDATE of a "
                   "generation, is not built yet)")
def test_an_update_in_progress_that_lowers_a_stamp_is_not_passed(pg):
    # B committed above A's open stamp; U (in progress at the claim) moves B's order_lsn below the
    # horizon and commits; once A commits the cursor is past B's new stamp: B is never claimed.
    relay = Relay(pg)
    with pg.connect() as a, pg.connect() as b, pg.connect() as u:
        early = wal_insert(u)
        a.execute("BEGIN")
        insert(a, "a")
        b_id, _ = insert(b, "b")
        u.execute("BEGIN")
        u.execute("UPDATE gen SET order_lsn = %s WHERE id = %s", (early, b_id))
        horizon, ids = relay.claim()
        assert ids == [] and lsn(horizon) > lsn(early)
        u.execute("COMMIT")
        a.execute("COMMIT")
    assert finish(relay, pg) == committed_ids(pg), "every committed row is claimed once"


@pytest.mark.xfail(strict=True, reason="a user's BEFORE INSERT trigger that fires after ours (its name sorts "
                   "later) can lower order_lsn below the transaction's registered lowest stamp")
def test_a_user_trigger_after_ours_cannot_put_a_row_below_its_registered_stamp(pg):
    pg.sql("CREATE OR REPLACE FUNCTION user_restamp() RETURNS trigger LANGUAGE plpgsql AS $$ "
           "BEGIN IF NEW.label = 'late' THEN NEW.order_lsn := '0/1'; END IF; RETURN NEW; END $$")
    pg.sql("CREATE TRIGGER z_user BEFORE INSERT ON gen FOR EACH ROW EXECUTE FUNCTION user_restamp()")
    relay = Relay(pg)
    with pg.connect() as a, pg.connect() as b:
        a.execute("BEGIN")
        insert(a, "late")
        insert(b, "b")
        relay.claim()
        a.execute("COMMIT")
    assert finish(relay, pg) == committed_ids(pg), "every committed row is claimed once"


# -- attacks that do not work (the registry holds) --------------------------------------------------

def test_a_user_trigger_before_ours_cannot_set_the_stamp_or_the_writer(pg):
    pg.sql("CREATE OR REPLACE FUNCTION user_forge() RETURNS trigger LANGUAGE plpgsql AS $$ "
           "BEGIN NEW.order_lsn := '0/1'; NEW.writer := '3'; RETURN NEW; END $$")
    pg.sql("CREATE TRIGGER a_user BEFORE INSERT ON gen FOR EACH ROW EXECUTE FUNCTION user_forge()")
    relay = Relay(pg)
    with pg.connect() as a, pg.connect() as b:
        a.execute("BEGIN")
        _, a_stamp = insert(a, "a")
        insert(b, "b")
        assert relay.claim() == (a_stamp, [])
        a.execute("COMMIT")
    assert finish(relay, pg) == committed_ids(pg)
    assert pg.value("SELECT count(*) FROM gen WHERE order_lsn = '0/1' OR writer = '3'") == 0


def test_insert_select_and_copy_of_many_rows_hold_the_horizon_at_their_first_row(pg):
    relay = Relay(pg)
    with pg.connect() as a, pg.connect() as c, pg.connect() as b:
        a.execute("BEGIN")
        first = a.execute("INSERT INTO gen (label) SELECT 'a' || i FROM generate_series(1, 500) i "
                          "RETURNING order_lsn::text").fetchall()[0][0]
        c.execute("BEGIN")
        with c.cursor().copy("COPY gen (label) FROM STDIN") as copy:
            copy.write("".join(f"c{i}\n" for i in range(500)))
        copy_first = c.execute("SELECT min(order_lsn)::text FROM gen").fetchone()[0]
        insert(b, "b")
        horizon, ids = relay.claim()
        assert horizon == min(first, copy_first, key=lsn) and ids == []
        a.execute("COMMIT")
        relay.claim()
        c.execute("COMMIT")
    assert finish(relay, pg) == committed_ids(pg)
    assert len(relay.claimed) == 1001


def test_rollback_prepared_and_commit_prepared_from_other_backends_between_claims(pg):
    relay = Relay(pg)
    with pg.connect() as a, pg.connect() as b, pg.connect() as other:
        a.execute("BEGIN")
        _, first = insert(a, "rolled back")
        a.execute("PREPARE TRANSACTION 'rb'")
        a.execute("BEGIN")
        _, second = insert(a, "kept")
        a.execute("PREPARE TRANSACTION 'cp'")
        insert(b, "b")
        assert relay.claim() == (first, [])
        other.execute("ROLLBACK PREPARED 'rb'")
        assert relay.claim() == (second, [])
        other.execute("COMMIT PREPARED 'cp'")
    assert finish(relay, pg) == committed_ids(pg)


def test_max_prepared_transactions_filled_twice_keeps_every_entry(pg):
    # 4 = max_prepared_transactions: one that wrote nothing, three writers; ended by another
    # backend (no callback frees their entries), then 4 more: the next PREPAREs find room, so the
    # horizon is their lowest stamp, not 0 (a dropped entry would count as lowest 0).
    relay = Relay(pg)
    with pg.connect() as w, pg.connect() as other:
        for round_ in range(2):
            stamps = []
            w.execute("BEGIN")
            w.execute("SELECT pg_current_xact_id()")
            w.execute(f"PREPARE TRANSACTION 'none{round_}'")
            for i in range(3):
                w.execute("BEGIN")
                stamps.append(insert(w, f"p{round_}{i}")[1])
                w.execute(f"PREPARE TRANSACTION 'p{round_}{i}'")
            with pytest.raises(psycopg.errors.OutOfMemory, match="maximum number of prepared"):
                w.execute("BEGIN")
                insert(w, "one too many")
                w.execute("PREPARE TRANSACTION 'full'")
            w.execute("ROLLBACK")
            assert relay.claim()[0] == stamps[0]
            for i in (2, 1, 0):
                other.execute(f"COMMIT PREPARED 'p{round_}{i}'")
            other.execute(f"ROLLBACK PREPARED 'none{round_}'")
    assert finish(relay, pg) == committed_ids(pg)
    assert len(relay.claimed) == 6


@pytest.mark.parametrize("end", ["cancel", "terminate"])
def test_a_writer_cancelled_or_terminated_mid_transaction_holds_nothing_after(pg, end):
    relay = Relay(pg)
    a = pg.connect()
    a.execute("BEGIN")
    _, a_stamp = insert(a, "a")
    assert relay.claim()[0] == a_stamp
    with pg.connect() as killer:
        def sleep():
            try:
                a.execute("SELECT pg_sleep(60)")
            except psycopg.Error:
                pass

        sleeping = threading.Thread(target=sleep, daemon=True)
        sleeping.start()
        wait_until(lambda: pg.value("SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = %s",
                                    (a.info.backend_pid,)), 10, "the writer sleeping")
        fn = "pg_cancel_backend" if end == "cancel" else "pg_terminate_backend"
        killer.execute(f"SELECT {fn}(%s)", (a.info.backend_pid,))
        sleeping.join(30)
    with pg.connect() as b:
        b_id, _ = insert(b, "b")
    # The aborted transaction's entry is gone (or names a transaction no longer in progress)
    # before any ROLLBACK from the client.
    wait_until(lambda: b_id in relay.claim()[1] or b_id in relay.claimed, 10, "b claimed")
    a.close()
    assert finish(relay, pg) == committed_ids(pg) == [b_id]


def test_serializable_writers_and_claims(pg):
    relay = Relay(pg)
    relay.conn.execute("SET default_transaction_isolation = serializable")
    with pg.connect() as a, pg.connect() as b:
        for c in (a, b):
            c.execute("SET default_transaction_isolation = serializable")
        a.execute("BEGIN")
        a.execute("SELECT count(*) FROM gen")
        _, a_stamp = insert(a, "a")
        b.execute("BEGIN")
        insert(b, "b")
        b.execute("COMMIT")
        assert relay.claim() == (a_stamp, [])
        a.execute("COMMIT")
        relay.conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        relay.claim()  # a claim in a transaction that took its snapshot already
        relay.conn.execute("COMMIT")
    assert finish(relay, pg) == committed_ids(pg)


def test_a_savepoint_first_insert_then_prepare_and_commit_prepared_elsewhere(pg):
    relay = Relay(pg)
    with pg.connect() as a, pg.connect() as b, pg.connect() as other:
        a.execute("BEGIN")
        a.execute("SAVEPOINT s1")
        _, first = insert(a, "x")
        a.execute("RELEASE SAVEPOINT s1")
        a.execute("SAVEPOINT s2")
        insert(a, "y")
        a.execute("ROLLBACK TO SAVEPOINT s2")
        a.execute("PREPARE TRANSACTION 'sp'")
        insert(b, "b")
        assert relay.claim() == (first, [])
        other.execute("COMMIT PREPARED 'sp'")
    assert finish(relay, pg) == committed_ids(pg)


@pytest.mark.parametrize("mode", MODES)
def test_prepared_transactions_ended_by_other_backends_under_concurrent_claims(pg, mode):
    """Writers PREPARE (some with no generation row, some with a savepoint rolled back) and leave
    the transaction to a finisher in another backend that commits or rolls it back later, out of
    order, with max_prepared_transactions (4) often full; others commit, roll back or are
    cancelled mid-transaction. A claim runs in a loop: every committed row once, none else."""
    import queue
    import random

    stop = threading.Event()
    errors = []
    handed = queue.Queue()
    ended = []

    def writer(seed):
        rnd = random.Random(seed)
        try:
            with pg.connect() as c:
                for n in range(60):
                    c.execute("BEGIN")
                    if rnd.random() < 0.15:
                        c.execute("SELECT pg_current_xact_id()")  # a transaction that writes nothing
                    else:
                        for _ in range(rnd.randint(1, 3)):
                            c.execute("SAVEPOINT s")
                            insert(c, f"{seed}-{n}")
                            c.execute("ROLLBACK TO SAVEPOINT s" if rnd.random() < 0.3 else "RELEASE SAVEPOINT s")
                    end = rnd.random()
                    if end < 0.5:
                        gid = f"x{seed}-{n}"
                        try:
                            c.execute(f"PREPARE TRANSACTION '{gid}'")
                            handed.put((gid, rnd.random() < 0.7))
                        except psycopg.errors.OutOfMemory:  # max_prepared_transactions reached
                            pass
                    elif end < 0.65:
                        c.execute("ROLLBACK")
                    else:
                        c.execute("COMMIT")
        except Exception as e:  # reported below
            errors.append(e)

    def finisher():
        rnd = random.Random(99)
        pending = []
        try:
            with pg.connect() as c:
                while not stop.is_set() or pending or not handed.empty():
                    try:
                        pending.append(handed.get(timeout=0.01))
                    except queue.Empty:
                        pass
                    if pending and (len(pending) >= 3 or rnd.random() < 0.3 or stop.is_set()):
                        gid, commit = pending.pop(rnd.randrange(len(pending)))
                        c.execute(f"{'COMMIT' if commit else 'ROLLBACK'} PREPARED '{gid}'")
                        ended.append(gid)
        except Exception as e:  # reported below
            errors.append(e)

    writers = [threading.Thread(target=writer, args=(s,)) for s in range(3)]
    done = threading.Thread(target=finisher)
    relay = Relay(pg, mode)
    for t in writers + [done]:
        t.start()
    while any(t.is_alive() for t in writers):
        relay.claim()
    stop.set()
    done.join(60)
    assert not errors
    assert len(ended) > 20 and pg.value("SELECT count(*) FROM pg_prepared_xacts") == 0
    finish(relay, pg)
    relay.assert_each_committed_row_once(pg)
