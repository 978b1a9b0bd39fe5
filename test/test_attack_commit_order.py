"""Attacks on commit order's locks and its no-op WAL (issue 15 items 3 and 4, merge e64b124):
a least-privileged enqueuer (only EXECUTE on outbox.enqueue, PREPARE TRANSACTION allowed), one
that may also DELETE its rows, and a superuser's mistakes. Each test fails if its attack works."""

import uuid

import psycopg
import pytest

from harness.lock_waits import InThread, waiting_on_lock
from harness.pg_cluster import PgCluster
from harness.wait import wait_until
from test_commit_order import (APP, CANCELLER, KEY_LOCK_CLASS, create_roles, enqueue,
                               key_lock_limit, our_locks_of, our_locks_of_prepared, published_order, session)
from test_commit_order import topic  # noqa: F401 (fixture)


# A test of 0.3.0's table (rows deleted or changed by hand, its triggers): its own cluster of
# that version (existing installs keep it until they update); the rest runs on the default.
OLD_TABLE = pytest.mark.parametrize("pg", ["0.3.0"], indirect=True)


@pytest.fixture(scope="module")
def pg(request):
    with PgCluster(settings={"outbox.workers": "0", "max_prepared_transactions": "10"},
                   create_extension=getattr(request, "param", True)) as cluster:
        create_roles(cluster)
        yield cluster


@pytest.fixture(autouse=True)
def no_prepared_left(pg):
    """A failed attack may leave a prepared transaction behind, holding locks on outbox.events
    that would hang the next test: roll it back."""
    yield
    for (gid,) in pg.sql("SELECT gid FROM pg_prepared_xacts"):
        pg.sql(f"ROLLBACK PREPARED '{gid}'")


def enqueue_many(c, topic, label, keys):
    c.execute("SELECT count(outbox.enqueue(%s, 'k' || i, %s::text)) FROM generate_series(1, %s) i",
              (topic, label, keys))


def waiting_for(pg, c, lock_class):
    return our_locks_of(pg, c).get((lock_class, False), 0) > 0 and waiting_on_lock(pg, c)


# -- (b) one role stalls every other role's enqueues -----------------------------------------

@pytest.mark.parametrize("waiter", ["COMMIT", "PREPARE TRANSACTION"])
def test_a_prepared_key_with_a_waiting_committer_stalls_no_other_key(pg, topic, waiter):
    gid, gid2 = "stall-" + topic, "stall2-" + topic
    p, q, many, victim = session(pg, APP), session(pg, APP), session(pg, APP), session(pg, CANCELLER, "5s")
    with p, q, many, victim:
        p.execute("BEGIN")
        enqueue(p, topic, "k1", "P")
        p.execute(f"PREPARE TRANSACTION '{gid}'")
        q.execute("BEGIN")
        enqueue(q, topic, "k1", "Q")
        waiting_q = InThread(q, "COMMIT" if waiter == "COMMIT" else f"PREPARE TRANSACTION '{gid2}'")
        error, waiting_many = None, None
        try:
            wait_until(lambda: waiting_for(pg, q, KEY_LOCK_CLASS), what="Q waiting for the prepared key")
            many.execute("BEGIN")
            enqueue_many(many, topic, "M", key_lock_limit(pg) + 1)
            waiting_many = InThread(many, "COMMIT")
            wait_until(lambda: waiting_on_lock(pg, many), what="the many-key commit waiting")
            try:
                enqueue(victim, topic, "unrelated", "V")  # autocommit: its commit takes the Share lock
            except psycopg.errors.LockNotAvailable as e:
                error = e
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
            waiting_q.join()
            if waiter != "COMMIT":
                pg.sql(f"COMMIT PREPARED '{gid2}'")
            if waiting_many is not None:
                waiting_many.join()
    assert error is None, f"another role's enqueue of an unrelated key stalled: {error}"
    assert published_order(pg, topic, "k1")[:2] == ["P", "Q"]


def test_a_committer_of_many_keys_is_not_overtaken_by_a_later_prepared_key(pg, topic):
    # P2 prepares one of the bulk commit's keys while the bulk commit waits for P1's key: P2's
    # PREPARE waits for the bulk commit (the prepare gate), so P1's COMMIT PREPARED lets the bulk
    # commit through, and it sorts before P2. (A PREPARE that went first could be waited for
    # again, and so on forever by rotating prepared transactions.)
    g1, g2 = "rot1-" + topic, "rot2-" + topic
    p1, p2, many = session(pg, APP), session(pg, APP), session(pg, APP)
    with p1, p2, many:
        p1.execute("BEGIN")
        enqueue(p1, topic, "k1", "P1")
        p1.execute(f"PREPARE TRANSACTION '{g1}'")
        many.execute("BEGIN")
        enqueue_many(many, topic, "M", key_lock_limit(pg) + 1)
        committer = InThread(many, "COMMIT")
        preparing = None
        try:
            wait_until(lambda: waiting_for(pg, many, KEY_LOCK_CLASS), what="the bulk commit waiting for k1")
            p2.execute("BEGIN")
            enqueue(p2, topic, "k2", "P2")  # prepared while the bulk commit waits: it came later
            preparing = InThread(p2, f"PREPARE TRANSACTION '{g2}'")
            wait_until(lambda: waiting_on_lock(pg, p2), what="P2's PREPARE waiting for the bulk commit")
            pg.sql(f"COMMIT PREPARED '{g1}'")
            committer.join()
        finally:
            if committer.thread.is_alive():
                pg.sql(f"COMMIT PREPARED '{g1}'")
                committer.thread.join(60)
            if preparing is not None:
                preparing.join()
                pg.sql(f"COMMIT PREPARED '{g2}'")
    assert published_order(pg, topic, "k1") == ["P1", "M"]
    assert published_order(pg, topic, "k2") == ["M", "P2"]


def test_two_prepared_transactions_of_one_key_commit_in_commit_prepared_order(pg, topic):
    # P2 enqueued first (lower stamp), P1 prepares first: P2's PREPARE waits for P1's key and
    # re-stamps above it, across a restart in between.
    g1, g2 = "pp1-" + topic, "pp2-" + topic
    p1, p2 = session(pg, APP), session(pg, APP)
    with p1, p2:
        p2.execute("BEGIN")
        enqueue(p2, topic, "k", "P2")
        p1.execute("BEGIN")
        enqueue(p1, topic, "k", "P1")
        p1.execute(f"PREPARE TRANSACTION '{g1}'")
        preparing = InThread(p2, f"PREPARE TRANSACTION '{g2}'")
        try:
            wait_until(lambda: waiting_for(pg, p2, KEY_LOCK_CLASS), what="P2's PREPARE waiting for P1's key")
        finally:
            pg.sql(f"COMMIT PREPARED '{g1}'")
        preparing.join()
    pg.restart()
    assert our_locks_of_prepared(pg, g2) == {KEY_LOCK_CLASS: 1}
    with session(pg, APP) as c:
        c.execute("BEGIN")
        enqueue(c, topic, "k", "C")
        committer = InThread(c, "COMMIT")
        try:
            wait_until(lambda: waiting_for(pg, c, KEY_LOCK_CLASS), what="C waiting for the prepared P2")
        finally:
            pg.sql(f"COMMIT PREPARED '{g2}'")
        committer.join()
    assert published_order(pg, topic, "k") == ["P1", "P2", "C"]


@OLD_TABLE
def test_prepared_at_the_limit_restamped_survives_a_restart_in_order(pg, topic):
    # Exactly max_locks/2 keys, re-stamped after deleting most of its rows of k1, prepared, the
    # server restarted: its key locks come back, a commit of k1 (few keys) and one of many keys
    # wait for it, and both sort after it.
    gid = "lim-" + topic
    limit = key_lock_limit(pg)
    p, a = session(pg, CANCELLER), session(pg, APP)
    with p, a:
        p.execute("BEGIN")
        ids = p.execute("SELECT array_agg(id ORDER BY i) FROM (SELECT i, outbox.enqueue(%s, 'k1', 'P-' || i) id "
                        "FROM generate_series(1, 5000) i) e", (topic,)).fetchone()[0]
        p.execute("DELETE FROM outbox.events WHERE event_id = ANY(%s)", (ids[:-1],))
        enqueue_many(p, topic, "P", limit)  # k1 .. k<limit>: exactly the limit
        enqueue(a, topic, "k1", "A")
        p.execute(f"PREPARE TRANSACTION '{gid}'")
    pg.restart()
    assert our_locks_of_prepared(pg, gid) == {KEY_LOCK_CLASS: limit}
    q, many = session(pg, APP), session(pg, APP)
    with q, many:
        q.execute("BEGIN")
        enqueue(q, topic, "k1", "Q")
        many.execute("BEGIN")
        enqueue_many(many, topic, "M", limit + 1)
        cq, cm = InThread(q, "COMMIT"), InThread(many, "COMMIT")
        try:
            wait_until(lambda: waiting_on_lock(pg, q) and waiting_on_lock(pg, many), what="both commits waiting")
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
        cq.join()
        cm.join()
    order = published_order(pg, topic, "k1")
    assert order[:2] == ["A", "P-5000"] and order[2] == "P" and sorted(order[3:]) == ["M", "Q"]


def test_many_key_committers_and_a_prepared_key_do_not_deadlock(pg, topic):
    gid = "dl-" + topic
    p, m1, m2, victim = session(pg, APP), session(pg, APP), session(pg, APP), session(pg, CANCELLER, "5s")
    with p, m1, m2, victim:
        p.execute("BEGIN")
        enqueue(p, topic, "k3", "P")
        p.execute(f"PREPARE TRANSACTION '{gid}'")
        for c, label in ((m1, "M1"), (m2, "M2")):
            c.execute("BEGIN")
            enqueue_many(c, topic, label, key_lock_limit(pg) + 5)
        c1, c2 = InThread(m1, "COMMIT"), InThread(m2, "COMMIT")
        try:
            wait_until(lambda: waiting_for(pg, m1, KEY_LOCK_CLASS) and waiting_for(pg, m2, KEY_LOCK_CLASS),
                       what="both many-key commits waiting for the prepared key alone")
            enqueue(victim, topic, "unrelated", "V")
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
        c1.join()
        c2.join()
    k3, k1 = published_order(pg, topic, "k3"), published_order(pg, topic, "k1")
    assert k3[0] == "P" and k3[1:] == k1, "one commit order for every key of the two"


# -- (d) errors at pre-commit / pre-prepare leave nothing behind -------------------------------

def test_a_refused_prepare_leaves_the_session_clean(pg, topic):
    with session(pg, APP) as c:
        c.execute("BEGIN")
        enqueue_many(c, topic, "x", key_lock_limit(pg) + 1)
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            c.execute(f"PREPARE TRANSACTION 'refused-{topic}'")
        assert our_locks_of(pg, c) == {}
        # The next transaction of the session starts with an empty list: one key prepares.
        c.execute("BEGIN")
        enqueue(c, topic, "k1", "one")
        c.execute(f"PREPARE TRANSACTION 'after-{topic}'")
        assert our_locks_of_prepared(pg, f"after-{topic}") == {KEY_LOCK_CLASS: 1}
        pg.sql(f"COMMIT PREPARED 'after-{topic}'")
    assert published_order(pg, topic, "k1") == ["one"]


def test_a_bulk_commit_timed_out_at_a_prepared_key_leaves_the_session_clean(pg, topic):
    # The lock_timeout ends the wait for the key after the global lock was given back: the abort
    # takes everything with it, the session's next commit goes at once.
    gid = "to-" + topic
    with session(pg, APP) as p, session(pg, APP, lock_timeout="1s") as many:
        p.execute("BEGIN")
        enqueue(p, topic, "k2", "P")
        p.execute(f"PREPARE TRANSACTION '{gid}'")
        try:
            many.execute("BEGIN")
            enqueue_many(many, topic, "M", key_lock_limit(pg) + 1)
            with pytest.raises(psycopg.errors.LockNotAvailable):
                many.execute("COMMIT")
            assert our_locks_of(pg, many) == {}
            many.execute("BEGIN")
            enqueue(many, topic, "k1", "after")
            many.execute("COMMIT")
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
    assert published_order(pg, topic, "k1") == ["after"]
    assert published_order(pg, topic, "k2") == ["P"]


@OLD_TABLE
def test_an_error_in_the_restamp_leaves_the_session_clean(pg, topic):
    # A superuser's trigger on outbox.events fails while the commit re-stamps: the commit fails,
    # the role, search_path and locks are the session's own again, the next commit is in order.
    pg.sql("CREATE FUNCTION public.co_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
           "IF current_setting('co.fail', true) = 'on' THEN RAISE EXCEPTION 'co_fail'; END IF; RETURN NEW; END $$")
    pg.sql("CREATE TRIGGER co_fail AFTER UPDATE ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.co_fail()")
    try:
        t1, t2 = session(pg, APP), session(pg, APP)
        with t1, t2:
            t1.execute("SET search_path = public")
            t1.execute("BEGIN")
            enqueue(t1, topic, "k", "B")
            t1.execute("SET LOCAL co.fail = 'on'")
            enqueue(t2, topic, "k", "A")
            with pytest.raises(psycopg.errors.RaiseException):
                t1.execute("COMMIT")
            assert t1.execute("SELECT current_user, current_setting('search_path')").fetchone() == (APP, "public")
            assert our_locks_of(pg, t1) == {}
            t1.execute("BEGIN")
            enqueue(t1, topic, "k", "C")
            enqueue(t2, topic, "k", "D")
            t1.execute("COMMIT")
    finally:
        pg.sql("DROP TRIGGER co_fail ON outbox.events")
        pg.sql("DROP FUNCTION public.co_fail()")
    assert published_order(pg, topic, "k") == ["A", "D", "C"]


# -- subtransaction shapes ---------------------------------------------------------------------

def test_plpgsql_exception_blocks_and_rolled_back_released_savepoints(pg, topic):
    t1, t2 = session(pg, APP), session(pg, APP)
    with t1, t2:
        t1.execute("BEGIN")
        t1.execute("DO $$ BEGIN "
                   f"PERFORM outbox.enqueue('{topic}', 'k', 'B1'::text); "
                   f"BEGIN PERFORM outbox.enqueue('{topic}', 'k', 'lost'::text); RAISE EXCEPTION 'x'; "
                   f"EXCEPTION WHEN OTHERS THEN PERFORM outbox.enqueue('{topic}', 'k', 'B2'::text); END; "
                   "END $$")
        t1.execute("SAVEPOINT a")
        enqueue(t1, topic, "k", "lost")
        t1.execute("SAVEPOINT b")
        enqueue(t1, topic, "k", "lost")
        t1.execute("RELEASE b")
        t1.execute("ROLLBACK TO a")
        enqueue(t1, topic, "k", "B3")
        enqueue(t2, topic, "k", "A")
        t1.execute("COMMIT")
    assert published_order(pg, topic, "k") == ["A", "B1", "B2", "B3"]


# -- (c) the no-op WAL loop ----------------------------------------------------------------------

PAD = 128 * 1024 * 1024


@OLD_TABLE
def test_a_stamp_set_ahead_of_the_wal_does_not_make_the_commit_write_it(pg, topic):
    pg.sql("CREATE FUNCTION public.co_ahead() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
           f"NEW.order_lsn := pg_current_wal_insert_lsn() + {PAD}; RETURN NEW; END $$")
    pg.sql("CREATE TRIGGER co_ahead BEFORE INSERT ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.co_ahead()")
    try:
        with session(pg, APP) as c:
            before = pg.value("SELECT pg_current_wal_insert_lsn()")
            c.execute("BEGIN")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
                enqueue(c, topic, "k", "x")
            assert "may set it" in e.value.diag.message_hint
            c.execute("ROLLBACK")
            written = pg.value("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (before,))
    finally:
        pg.sql("DROP TRIGGER co_ahead ON outbox.events")
        pg.sql("DROP FUNCTION public.co_ahead()")
    assert written < PAD // 4, f"one enqueue's commit wrote {written} bytes of WAL"


@OLD_TABLE
def test_a_stamp_set_below_the_wal_is_refused_and_changes_nothing(pg, topic):
    # A superuser's trigger that sets order_lsn below the WAL insert position: across a restart
    # (stripes are zero) such a row would sort before its key's rows committed in the previous run.
    # Refused like a stamp ahead of the WAL; the refused statement leaves no row; other enqueues
    # (a duplicate event_id the trigger sees too, a batch) are untouched.
    pg.sql("CREATE FUNCTION public.co_low() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
           f"IF NEW.topic = '{topic}' AND NEW.key = 'low' THEN NEW.order_lsn := '0/1'; END IF; RETURN NEW; END $$")
    pg.sql("CREATE TRIGGER co_low BEFORE INSERT ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.co_low()")
    event_id = str(uuid.uuid4())
    try:
        with session(pg, APP) as c:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
                c.execute("SELECT outbox.enqueue(%s, 'a', 'A0'::text), outbox.enqueue(%s, 'low', 'L'::text)",
                          (topic, topic))
            assert "below the WAL insert position" in e.value.diag.message_primary
            assert "may set it" in e.value.diag.message_hint
            assert pg.value("SELECT count(*) FROM outbox.events WHERE topic = %s", (topic,)) == 0
            c.execute("BEGIN")
            enqueue(c, topic, "a", "A1")
            c.execute("SAVEPOINT s")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                enqueue(c, topic, "low", "L")
            c.execute("ROLLBACK TO SAVEPOINT s")
            assert c.execute("SELECT outbox.enqueue(%s, 'a', 'A2'::text, NULL, %s)",
                             (topic, event_id)).fetchone()[0] is not None
            # ON CONFLICT DO NOTHING: the trigger set the duplicate's stamp, nothing was inserted.
            assert c.execute("SELECT outbox.enqueue(%s, 'low', 'dup'::text, NULL, %s)",
                             (topic, event_id)).fetchone()[0] is None
            c.execute("SELECT count(outbox.enqueue(%s, 'b' || i %% 3, i::text)) FROM generate_series(1, 50) i",
                      (topic,))
            c.execute("COMMIT")
    finally:
        pg.sql("DROP TRIGGER co_low ON outbox.events")
        pg.sql("DROP FUNCTION public.co_low()")
    assert published_order(pg, topic, "a") == ["A1", "A2"]
    assert published_order(pg, topic, "low") == []
    assert pg.value("SELECT count(*) FROM outbox.events WHERE topic = %s AND key LIKE 'b%%'", (topic,)) == 50


@OLD_TABLE
def test_deleted_rows_pad_at_most_a_byte_each(pg, topic):
    # A role that may delete its rows: a re-stamp of 200,000 rows, all but one deleted, pads the
    # WAL by at most about a byte per row (DESIGN.md "Commit order"), not by the rows' size.
    rows = 200000
    t1, t2 = session(pg, CANCELLER), session(pg, APP)
    with t1, t2:
        t1.execute("BEGIN")
        ids = t1.execute("SELECT array_agg(id) FROM (SELECT outbox.enqueue(%s, 'k', 'B'::text) id "
                         "FROM generate_series(1, %s)) e", (topic, rows)).fetchone()[0]
        t1.execute("DELETE FROM outbox.events WHERE event_id = ANY(%s)", (ids[:-1],))
        enqueue(t2, topic, "k", "A")
        before = pg.value("SELECT pg_current_wal_insert_lsn()")
        t1.execute("COMMIT")
        written = pg.value("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (before,))
    assert written < 2 * rows + 64 * 1024
    assert published_order(pg, topic, "k") == ["A", "B"]


# -- a superuser's trigger that enqueues while the commit re-stamps ------------------------------

@OLD_TABLE
def test_an_enqueue_from_a_trigger_at_the_restamp_keeps_commit_order(pg, topic):
    # The restamp's UPDATE fires a superuser's AFTER UPDATE trigger that enqueues for key 'audit'
    # (then waits on a gate): that row is noted after the keys were locked. T3 commits 'audit'
    # meanwhile; whatever commits first must sort first.
    gate = 4242
    pg.sql("CREATE FUNCTION public.co_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
           f"IF NEW.topic = '{topic}' AND NEW.key = 'k' THEN "
           "PERFORM outbox.enqueue(NEW.topic, 'audit', 'T1'::text); "
           f"PERFORM pg_catalog.pg_advisory_xact_lock({gate}); END IF; RETURN NULL; END $$")
    pg.sql("CREATE TRIGGER co_audit AFTER UPDATE ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.co_audit()")
    try:
        holder, t1, t2, t3 = session(pg), session(pg, APP), session(pg, APP), session(pg, APP)
        with holder, t1, t2, t3:
            holder.execute(f"SELECT pg_advisory_lock({gate})")
            t1.execute("BEGIN")
            enqueue(t1, topic, "k", "B")
            enqueue(t2, topic, "k", "A")  # T1's commit re-stamps B
            c1 = InThread(t1, "COMMIT")
            released = False
            try:
                wait_until(lambda: not c1.thread.is_alive() or waiting_on_lock(pg, t1),
                           what="T1's commit failed, or in the trigger at the gate")
                c3 = InThread(t3, f"SELECT outbox.enqueue('{topic}', 'audit', 'T3'::text)")
                wait_until(lambda: not c3.thread.is_alive() or waiting_on_lock(pg, t3), what="T3 done or waiting")
                t3_first = not c3.thread.is_alive()
                holder.execute(f"SELECT pg_advisory_unlock({gate})")
                released = True
            finally:
                if not released:
                    holder.execute(f"SELECT pg_advisory_unlock({gate})")
            c1.thread.join(60)
            c3.join()
            t1_failed = c1.error is not None
    finally:
        pg.sql("DROP TRIGGER co_audit ON outbox.events")
        pg.sql("DROP FUNCTION public.co_audit()")
    expected = ["T3"] if t1_failed else (["T3", "T1"] if t3_first else ["T1", "T3"])
    assert published_order(pg, topic, "audit") == expected
    # The enqueue at the re-stamp is refused: B is rolled back with it.
    assert isinstance(c1.error, psycopg.errors.FeatureNotSupported), c1.error
    assert "trigger on outbox.events" in c1.error.diag.message_hint
    assert published_order(pg, topic, "k") == ["A"]


@OLD_TABLE
def test_a_trigger_that_skips_the_restamp_fails_the_commit(pg, topic):
    # A superuser's BEFORE UPDATE trigger returning NULL would leave B's insert-time stamp below
    # A's, though B commits later: the commit fails instead, and the next one is in order.
    pg.sql("CREATE FUNCTION public.co_skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$")
    pg.sql("CREATE TRIGGER co_skip BEFORE UPDATE ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.co_skip()")
    try:
        t1, t2 = session(pg, APP), session(pg, APP)
        with t1, t2:
            t1.execute("BEGIN")
            enqueue(t1, topic, "k", "B")
            enqueue(t2, topic, "k", "A")
            with pytest.raises(psycopg.errors.TriggeredActionException) as e:
                t1.execute("COMMIT")
            assert "BEFORE UPDATE trigger" in e.value.diag.message_hint
            assert our_locks_of(pg, t1) == {}
    finally:
        pg.sql("DROP TRIGGER co_skip ON outbox.events")
        pg.sql("DROP FUNCTION public.co_skip()")
    with session(pg, APP) as t1, session(pg, APP) as t2:
        t1.execute("BEGIN")
        enqueue(t1, topic, "k", "C")
        enqueue(t2, topic, "k", "D")
        t1.execute("COMMIT")
    assert published_order(pg, topic, "k") == ["A", "D", "C"]


@pytest.mark.parametrize("stamp", ["OLD.order_lsn", "'0/1'", f"pg_current_wal_insert_lsn() + {PAD}"],
                         ids=["kept", "low", "ahead"])
@OLD_TABLE
def test_a_trigger_that_changes_the_restamp_fails_the_commit(pg, topic, stamp):
    # A superuser's BEFORE UPDATE trigger that sets NEW.order_lsn (an "immutable column" guard
    # keeping OLD's, or any other value) turns the commit's re-stamp into another stamp than the
    # one it locked and padded for: B, committed after A, would keep its insert-time stamp below
    # A's (kept), sort before rows committed in an earlier run (low), or lie ahead of the WAL and
    # of the stripe the next commit of its key stamps above (ahead). The commit fails instead.
    pg.sql("CREATE FUNCTION public.co_set() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
           f"IF NEW.topic = '{topic}' THEN NEW.order_lsn := {stamp}; END IF; RETURN NEW; END $$")
    pg.sql("CREATE TRIGGER co_set BEFORE UPDATE ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.co_set()")
    try:
        t1, t2 = session(pg, APP), session(pg, APP)
        with t1, t2:
            t1.execute("BEGIN")
            enqueue(t1, topic, "k", "B")
            enqueue(t2, topic, "k", "A")  # T1's commit re-stamps B above A
            with pytest.raises(psycopg.errors.TriggeredActionException) as e:
                t1.execute("COMMIT")
            assert "NEW.order_lsn" in e.value.diag.message_hint
            assert our_locks_of(pg, t1) == {}
    finally:
        pg.sql("DROP TRIGGER co_set ON outbox.events")
        pg.sql("DROP FUNCTION public.co_set()")
    with session(pg, APP) as t1, session(pg, APP) as t2:
        t1.execute("BEGIN")
        enqueue(t1, topic, "k", "C")
        enqueue(t2, topic, "k", "D")
        t1.execute("COMMIT")
    assert published_order(pg, topic, "k") == ["A", "D", "C"]


# -- another library's pre-commit callback that enqueues -----------------------------------------

@pytest.mark.parametrize("also_enqueues", [False, True], ids=["only-at-pre-commit", "and-before"])
def test_an_enqueue_from_a_later_librarys_pre_commit_is_in_commit_order(pg, topic, also_enqueues):
    # The test seam outbox.test_enqueue_at_pre_commit plays a library loaded after outbox (LOAD,
    # session_preload_libraries, or one that registers its callbacks lazily, as postgres_fdw does)
    # whose pre-commit callback enqueues: its callback is registered in T1's session before the
    # session's first enqueue. outbox's pre-commit must run after it, so that its row is locked and
    # stamped like any other: T2 enqueued before T1 committed and committed after, so it sorts
    # after T1's row. (Registered at first use, outbox's callback ran either not at all for that
    # commit, and T2 sorted first, or before the other library's, and refused its enqueue: 0A000.)
    with session(pg) as t1, session(pg, APP) as t2:
        t2.execute("BEGIN")
        enqueue(t2, topic, "k", "T2")
        t1.execute("BEGIN")
        t1.execute(f"SET LOCAL outbox.test_enqueue_at_pre_commit = '{topic}:k'")
        if also_enqueues:
            enqueue(t1, topic, "other", "T1")
        t1.execute("COMMIT")
        assert our_locks_of(pg, t1) == {}
        t2.execute("COMMIT")
    assert published_order(pg, topic, "k") == ["pre-commit", "T2"]
    assert published_order(pg, topic, "other") == (["T1"] if also_enqueues else [])


# -- (e) a cold read of the prepared-transaction locks (DESIGN.md "Commit order") ----------------

def key_hash(pg, topic, key):
    """commit_order.cpp's 64-bit hash of (topic, key), unsigned: keys are locked in its order, and
    its low 16 bits are the key's stripe."""
    h = pg.value("SELECT hashtextextended(%s COLLATE \"C\", hashtextextended(%s COLLATE \"C\", 0))", (key, topic))
    return h & 0xFFFFFFFFFFFFFFFF


def test_a_bulk_commit_finishes_under_a_steady_queue_of_committers_of_one_of_its_keys(pg, topic):
    # (a) Each T<i> enqueues for `low` (one of the bulk commit's keys) and for y<i>, which a
    # prepared Q<i> holds: T<i> keeps `low` while it waits for y<i>. T<i+1> comes while T<i> waits,
    # then Q<i> commits. Merge b1eecc6's bulk commit waited for `low`, gave it back and found the
    # next T holding it, for as long as they kept coming (holding the prepare gate and taking the
    # global lock at each retry). None of them has stamped: the bulk commit need not wait for them.
    rounds = 3
    m_keys = [f"k{i}" for i in range(1, key_lock_limit(pg) + 2)]
    hashes = {k: key_hash(pg, topic, k) for k in m_keys}
    low = min(m_keys, key=hashes.get)
    ys = [y for y in (f"y{j}" for j in range(200)) if key_hash(pg, topic, y) > hashes[low]][:rounds]
    gids = [f"q{i}-{topic}" for i in range(rounds)]
    preparer, many = session(pg, APP), session(pg, APP)
    ts = [session(pg, APP) for _ in range(rounds)]
    commits, committer = [], None
    try:
        for gid, y in zip(gids, ys):
            preparer.execute("BEGIN")
            enqueue(preparer, topic, y, "Q")
            preparer.execute(f"PREPARE TRANSACTION '{gid}'")

        def start(i):
            ts[i].execute("BEGIN")
            enqueue(ts[i], topic, low, f"T{i}")
            enqueue(ts[i], topic, ys[i], f"T{i}")
            commits.append(InThread(ts[i], "COMMIT"))
            wait_until(lambda: waiting_for(pg, ts[i], KEY_LOCK_CLASS), what=f"T{i} waiting for y{i}")

        start(0)
        many.execute("BEGIN")
        enqueue_many(many, topic, "M", len(m_keys))
        committer = InThread(many, "COMMIT")
        for i in range(1, rounds):
            if not committer.thread.is_alive():
                break
            wait_until(lambda: not committer.thread.is_alive() or waiting_on_lock(pg, many),
                       what="the bulk commit done or waiting")
            start(i)
            pg.sql(f"COMMIT PREPARED '{gids[i - 1]}'")
            commits[i - 1].join()
        wait_until(lambda: not committer.thread.is_alive(), 30,
                   "the bulk commit finished while committers of its key keep coming")
    finally:
        for (gid,) in pg.sql("SELECT gid FROM pg_prepared_xacts WHERE gid = ANY(%s)", (gids,)):
            pg.sql(f"COMMIT PREPARED '{gid}'")
        for c in commits:
            c.thread.join(60)
        if committer is not None:
            committer.thread.join(60)
        for c in [preparer, many] + ts:
            c.close()
    committer.join()
    for c in commits:
        c.join()
    assert published_order(pg, topic, low) == ["M"] + [f"T{i}" for i in range(len(commits))]


def test_a_bulk_commit_waiting_for_a_prepared_key_holds_up_no_prepare_of_other_keys(pg, topic):
    # (b) P0 prepared with k1; a bulk commit of k1 .. k33 waits for it; P1, of a key that shares
    # neither a lock nor a stripe with the bulk commit's, prepares meanwhile. A two-phase
    # coordinator commits P0 only once P1 is prepared: merge b1eecc6's P1 waited at the prepare
    # gate for the bulk commit, which waited for P0, a cycle PostgreSQL could not see (here: P1's
    # lock_timeout).
    g0, g1 = "tpc0-" + topic, "tpc1-" + topic
    m_keys = [f"k{i}" for i in range(1, key_lock_limit(pg) + 2)]
    stripes = {key_hash(pg, topic, k) & 0xFFFF for k in m_keys}
    other = next(o for o in (f"other{j}" for j in range(100)) if key_hash(pg, topic, o) & 0xFFFF not in stripes)
    p0, many, p1 = session(pg, APP), session(pg, APP), session(pg, APP, lock_timeout="5s")
    with p0, many, p1:
        p0.execute("BEGIN")
        enqueue(p0, topic, "k1", "P0")
        p0.execute(f"PREPARE TRANSACTION '{g0}'")
        many.execute("BEGIN")
        enqueue_many(many, topic, "M", len(m_keys))
        committer = InThread(many, "COMMIT")
        try:
            wait_until(lambda: waiting_for(pg, many, KEY_LOCK_CLASS), what="the bulk commit waiting for k1")
            p1.execute("BEGIN")
            enqueue(p1, topic, other, "P1")
            p1.execute(f"PREPARE TRANSACTION '{g1}'")
        finally:
            pg.sql(f"COMMIT PREPARED '{g0}'")  # the coordinator: P1 is prepared
            committer.thread.join(60)
        committer.join()
        pg.sql(f"COMMIT PREPARED '{g1}'")
    assert published_order(pg, topic, "k1") == ["P0", "M"]
    assert published_order(pg, topic, other) == ["P1"]


@pytest.mark.parametrize("ending", ["lock_timeout", "terminated"])
def test_a_bulk_commit_that_fails_while_it_waits_leaves_no_mark_behind(pg, topic, ending):
    # M1 (k1 .. k33) fails while it waits for P0's k1. A mark it left would make a later PREPARE
    # of one of its keys wait at the gate for any committer of many keys holding it then: here M2
    # (j1 .. j33), waiting for P0's j1, whose stripes P1's key does not share.
    g0, g1 = "mk0-" + topic, "mk1-" + topic
    limit = key_lock_limit(pg)
    m2_stripes = {key_hash(pg, topic, f"j{i}") & 0xFFFF for i in range(1, limit + 2)}
    victim = next(k for k in (f"k{i}" for i in range(2, limit + 2)) if key_hash(pg, topic, k) & 0xFFFF not in m2_stripes)
    p0, p1 = session(pg, APP), session(pg, APP, lock_timeout="5s")
    m1, m2 = session(pg, APP, lock_timeout="1s" if ending == "lock_timeout" else "30s"), session(pg, APP)
    with p0, p1, m1, m2:
        p0.execute("BEGIN")
        enqueue(p0, topic, "k1", "P0")
        enqueue(p0, topic, "j1", "P0")
        p0.execute(f"PREPARE TRANSACTION '{g0}'")
        committer = None
        try:
            m1.execute("BEGIN")
            enqueue_many(m1, topic, "M1", limit + 1)
            if ending == "lock_timeout":
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    m1.execute("COMMIT")
            else:
                failing = InThread(m1, "COMMIT")
                wait_until(lambda: waiting_for(pg, m1, KEY_LOCK_CLASS), what="M1 waiting for k1")
                pg.sql("SELECT pg_terminate_backend(%s)", (m1.info.backend_pid,))
                failing.thread.join(60)
                assert isinstance(failing.error, psycopg.OperationalError), failing.error
                wait_until(lambda: not pg.value("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                                (m1.info.backend_pid,)), what="M1's backend gone")
            m2.execute("BEGIN")
            m2.execute("SELECT count(outbox.enqueue(%s, 'j' || i, 'M2'::text)) FROM generate_series(1, %s) i",
                       (topic, limit + 1))
            committer = InThread(m2, "COMMIT")
            wait_until(lambda: waiting_for(pg, m2, KEY_LOCK_CLASS), what="M2 waiting for j1")
            p1.execute("BEGIN")
            enqueue(p1, topic, victim, "P1")
            p1.execute(f"PREPARE TRANSACTION '{g1}'")
        finally:
            pg.sql(f"COMMIT PREPARED '{g0}'")
            if committer is not None:
                committer.thread.join(60)
        committer.join()
        pg.sql(f"COMMIT PREPARED '{g1}'")
    assert published_order(pg, topic, "k1") == ["P0"]
    assert published_order(pg, topic, victim) == ["P1"]
    assert published_order(pg, topic, "j1") == ["P0", "M2"]


def test_a_prepare_waiting_for_a_prepared_key_holds_up_no_bulk_commit_of_other_keys(pg, topic):
    # P1's PREPARE waits for P0's key. Merge b1eecc6's P1 held the prepare gate meanwhile, and a
    # bulk commit of other keys waited for it at the gate (here: its lock_timeout).
    g0, g1 = "pw0-" + topic, "pw1-" + topic
    p0, p1, many = session(pg, APP), session(pg, APP), session(pg, APP, lock_timeout="5s")
    with p0, p1, many:
        p0.execute("BEGIN")
        enqueue(p0, topic, "shared", "P0")
        p0.execute(f"PREPARE TRANSACTION '{g0}'")
        p1.execute("BEGIN")
        enqueue(p1, topic, "shared", "P1")
        preparing = InThread(p1, f"PREPARE TRANSACTION '{g1}'")
        try:
            wait_until(lambda: waiting_for(pg, p1, KEY_LOCK_CLASS), what="P1's PREPARE waiting for P0's key")
            many.execute("BEGIN")
            enqueue_many(many, topic, "M", key_lock_limit(pg) + 1)
            many.execute("COMMIT")
        finally:
            pg.sql(f"COMMIT PREPARED '{g0}'")
            preparing.thread.join(60)
        preparing.join()
        pg.sql(f"COMMIT PREPARED '{g1}'")
    assert published_order(pg, topic, "shared") == ["P0", "P1"]
    assert published_order(pg, topic, "k1") == ["M"]
