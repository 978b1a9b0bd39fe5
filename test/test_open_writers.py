"""The insert-only queue's first part (DESIGN.md "The insert-only queue", build order step 1): the
generation table's BEFORE INSERT trigger registers each writing transaction in the registry of
open writers and stamps the row; a claim takes only rows below its horizon, so a transaction in
progress that a claim passes by is never skipped once it commits, through subtransactions,
PREPARE, COMMIT PREPARED, restarts, a promotion and a terminated backend.

The claim here is the test-build seam outbox_test_claim (src/enqueue/claim_view_seam.cpp): a
relay's walk reduced to "rows from my cursor up to a target, in the claim's snapshot", in two
modes: "horizon" (the target is the safe horizon: an open writer holds the claims back at its
first stamp) and "holes" (the target is the WAL insert position: the open writers passed become
holes, whose rows are taken once they commit). Its "wal" mode claims up to the WAL insert position
ignoring the registry: the tests run with it show that they fail when the registry is not read."""

import random
import threading

import psycopg
import pytest

from harness.pg_cluster import PgCluster
from harness.wait import wait_until

SETUP = """
CREATE TABLE gen (id bigserial PRIMARY KEY, order_lsn pg_lsn NOT NULL, writer xid8 NOT NULL, label text);
CREATE INDEX gen_order ON gen (order_lsn, id);
CREATE FUNCTION gen_stamp() RETURNS trigger LANGUAGE C AS '$libdir/outbox', 'outbox_generation_stamp';
CREATE TRIGGER gen_stamp BEFORE INSERT ON gen FOR EACH ROW EXECUTE FUNCTION gen_stamp();
ALTER TABLE gen ENABLE ALWAYS TRIGGER gen_stamp;
CREATE FUNCTION test_claim(regclass, pg_lsn, text, xid8[], pg_lsn[], OUT cursor pg_lsn, OUT ids bigint[],
                           OUT hole_xids xid8[], OUT hole_froms pg_lsn[], OUT open_xids xid8[])
    LANGUAGE C AS '$libdir/outbox', 'outbox_test_claim';
"""


def set_up(pg, dbname=None):
    with pg.connect(dbname) as c:
        c.execute(SETUP)


@pytest.fixture(scope="module")
def pg():
    with PgCluster(settings={"outbox.workers": "0", "max_prepared_transactions": "4"}) as cluster:
        set_up(cluster)
        yield cluster


def reset(pg):
    """What a test, failed or not, left behind: sessions in a transaction, prepared transactions, rows."""
    pg.sql("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
           "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
    for (gid,) in pg.sql("SELECT gid FROM pg_prepared_xacts"):
        pg.sql(f"ROLLBACK PREPARED '{gid}'")
    pg.sql("TRUNCATE gen")


@pytest.fixture(autouse=True)
def empty(pg):
    yield
    reset(pg)


MODES = ["horizon", "holes"]


class Relay:
    """One relay slot's cursor and holes over gen: each claim takes what the seam returns and
    keeps the new cursor and holes, as a slot's cursor row would."""

    def __init__(self, pg, mode="horizon", dbname=None):
        self.conn = pg.connect(dbname)
        # The claim's look-ups of a prepared transaction's rows (a DEBUG1 line each).
        self.lookups = 0
        self.conn.execute("SET client_min_messages = debug1")
        self.conn.add_notice_handler(self.notice)
        self.mode = mode
        self.cursor = "0/0"
        self.holes = ([], [])
        self.claimed = []

    def claim(self):
        cursor, ids, xids, froms, self.open = self.conn.execute(
            "SELECT cursor::text, ids, hole_xids::text[], hole_froms::text[], open_xids::text[] "
            "FROM test_claim('gen', %s, %s, %s::text[]::xid8[], %s::text[]::pg_lsn[])",
            (self.cursor, self.mode, *self.holes)).fetchone()
        self.claimed += ids
        assert lsn(cursor) >= lsn(self.cursor)
        self.cursor, self.holes = cursor, (xids, froms)
        return cursor, ids

    def notice(self, diag):
        if "looking up the rows of prepared transaction" in (diag.message_primary or ""):
            self.lookups += 1

    def close(self):
        self.conn.close()

    def assert_each_committed_row_once(self, cluster):
        assert len(self.claimed) == len(set(self.claimed)), "a row taken twice"
        if self.mode == "horizon":
            assert self.claimed == committed_ids(cluster), "each committed row once, in (order_lsn, id) order"
        elif self.mode == "holes":
            assert sorted(self.claimed) == sorted(committed_ids(cluster)), "each committed row once"
        else:  # the control, ignoring the registry: this interleaving must lose a row
            assert set(committed_ids(cluster)) - set(self.claimed), "the control lost nothing: the test cannot fail"


# The control ("wal", the registry ignored) runs the interleavings that must lose a row without it.
CONTROLLED = MODES + ["wal"]


def lsn(text):
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def insert(c, label):
    return c.execute("INSERT INTO gen (label) VALUES (%s) RETURNING id, order_lsn::text", (label,)).fetchone()


def committed_ids(pg):
    return [i for (i,) in pg.sql("SELECT id FROM gen ORDER BY order_lsn, id")]


def claim_while_open(relay, a_stamp, b_ids):
    """The claim while A (first stamp a_stamp) is open and B's rows b_ids committed above it."""
    cursor, ids = relay.claim()
    if relay.mode == "horizon":
        assert (cursor, ids) == (a_stamp, []), "held back at the open writer's first stamp"
    elif relay.mode == "wal":
        assert ids == b_ids
    else:
        assert ids == b_ids, "passed by"
        assert a_stamp in relay.holes[1], "the open writer is a hole from its first stamp"


def committed_later_below(pg, mode):
    """A commits a row stamped before B's, after B committed and after a claim ran between them."""
    relay = Relay(pg, mode)
    with pg.connect() as a, pg.connect() as b:
        a.execute("BEGIN")
        a_id, a_stamp = insert(a, "a")
        b.execute("BEGIN")
        b_id, b_stamp = insert(b, "b")
        b.execute("COMMIT")
        assert lsn(b_stamp) > lsn(a_stamp)
        first = relay.claim()
        a.execute("COMMIT")
    relay.claim()
    relay.close()
    return relay, first, a_id, a_stamp, b_id


@pytest.mark.parametrize("mode", MODES)
def test_a_transaction_in_progress_passed_by_a_claim_is_claimed_after_it_commits(pg, mode):
    relay, (cursor, ids), a_id, a_stamp, b_id = committed_later_below(pg, mode)
    if mode == "horizon":
        assert (cursor, ids) == (a_stamp, []), "the claim must stop at the open writer's lowest stamp"
        assert relay.claimed == [a_id, b_id]
    else:
        assert ids == [b_id], "B is not held back by A"
        assert relay.claimed == [b_id, a_id] and relay.holes == ([], [])
    relay.assert_each_committed_row_once(pg)


def test_without_the_registry_the_same_interleaving_loses_the_row(pg):
    # The control: a claim up to the WAL insert position passes A's stamp while A is open.
    relay, (_, ids), a_id, _, b_id = committed_later_below(pg, "wal")
    assert ids == [b_id]
    assert a_id not in relay.claimed


def test_the_stamp_is_the_wal_insert_position_read_after_the_registration_and_the_writer_the_top_level_xid(pg):
    with pg.connect() as c:
        c.execute("BEGIN")
        before = lsn(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
        c.execute("SAVEPOINT s")
        _, stamp = insert(c, "x")
        top = c.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        writer = c.execute("SELECT writer::text FROM gen").fetchone()[0]
        after = lsn(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
        c.execute("COMMIT")
    assert before <= lsn(stamp) <= after
    assert writer == top


def test_a_stamp_set_by_the_writer_is_overwritten(pg):
    with pg.connect() as c:
        c.execute("INSERT INTO gen (order_lsn, writer, label) VALUES ('0/1', '1', 'forged')")
        stamp, writer = c.execute("SELECT order_lsn::text, writer::text FROM gen").fetchone()
    assert lsn(stamp) > 1 and writer != "1"


@pytest.mark.parametrize("mode", CONTROLLED)
def test_a_row_of_a_rolled_back_savepoint_keeps_the_transaction_registered_from_its_first_stamp(pg, mode):
    relay = Relay(pg, mode)
    with pg.connect() as a, pg.connect() as b:
        a.execute("BEGIN")
        a.execute("SAVEPOINT s")
        _, first = insert(a, "gone")
        a.execute("ROLLBACK TO SAVEPOINT s")
        insert(a, "kept")
        b_id, _ = insert(b, "b")  # autocommit
        claim_while_open(relay, first, [b_id])
        a.execute("COMMIT")
    relay.claim()
    relay.close()
    relay.assert_each_committed_row_once(pg)


@pytest.mark.parametrize("mode", CONTROLLED)
def test_a_prepared_transaction_is_passed_by_until_commit_prepared(pg, mode):
    relay = Relay(pg, mode)
    with pg.connect() as a, pg.connect() as b:
        a.execute("BEGIN")
        a_id, a_stamp = insert(a, "a")
        a.execute("PREPARE TRANSACTION 'pa'")
        b_id, _ = insert(b, "b")
        claim_while_open(relay, a_stamp, [b_id])
        # A later PREPARE of another session finds the entry of the first in the prepared array.
        b.execute("BEGIN")
        insert(b, "c")
        b.execute("PREPARE TRANSACTION 'pc'")
        claim_while_open(relay, a_stamp, [])
        b.execute("COMMIT PREPARED 'pa'")
        _, ids = relay.claim()
        assert (a_id in ids) == (mode != "wal")
        b.execute("COMMIT PREPARED 'pc'")
    relay.claim()
    relay.close()
    relay.assert_each_committed_row_once(pg)


@pytest.mark.parametrize("mode", MODES)
def test_a_prepared_transaction_that_wrote_no_generation_row_holds_nothing(pg, mode):
    relay = Relay(pg, mode)
    with pg.connect() as a, pg.connect() as b:
        a.execute("BEGIN")
        a.execute("SELECT pg_current_xact_id()")  # a transaction id, no generation row
        a.execute("PREPARE TRANSACTION 'none'")
        b_id, _ = insert(b, "b")
        assert relay.claim()[1] == [b_id] and relay.holes == ([], [])
        assert relay.lookups == 0, "an entry without a stamp, not a look-up"
        b.execute("ROLLBACK PREPARED 'none'")
    relay.close()


def test_the_entries_of_ended_prepared_transactions_are_reused(pg):
    # max_prepared_transactions = 4: without freeing the entries of the four that ended, the fifth
    # would have none, and the claim would hold at 0/0, below the four's committed rows.
    relay = Relay(pg)
    relay.claim()
    with pg.connect() as c:
        for n in range(4):
            c.execute("BEGIN")
            insert(c, f"cycle {n}")
            c.execute(f"PREPARE TRANSACTION 'cycle {n}'")
            c.execute(f"COMMIT PREPARED 'cycle {n}'")
    _, a_stamp = prepare_one(pg, "fifth")
    cursor, ids = relay.claim()
    assert cursor == a_stamp and len(ids) == 4
    assert relay.lookups == 0, "the fifth had its entry from PRE_PREPARE: nothing to look up"
    pg.sql("COMMIT PREPARED 'fifth'")
    relay.claim()
    relay.close()
    relay.assert_each_committed_row_once(pg)


@pytest.mark.parametrize("mode", MODES)
def test_a_prepare_that_fails_after_its_reservation_frees_it_and_holds_nothing(pg, mode):
    # PREPARE of a transaction that used a temporary table fails after the PRE_PREPARE callbacks
    # ran (PrepareTransaction checks it later): our callback had reserved a prepared entry. More
    # such failures than max_prepared_transactions (4): were a reservation neither freed at the
    # abort nor reclaimed as ended by the next PREPARE, that PREPARE would find no entry (and be
    # looked up); were a failed one taken for prepared, a claim would hold at its stamp.
    relay = Relay(pg, mode)
    with pg.connect() as c:
        c.execute("CREATE TEMP TABLE scratch (x int)")
        for n in range(6):
            c.execute("BEGIN")
            insert(c, f"failed prepare {n}")
            c.execute("INSERT INTO scratch VALUES (1)")
            with pytest.raises(psycopg.errors.FeatureNotSupported):
                c.execute(f"PREPARE TRANSACTION 'failing {n}'")
            c.execute("ROLLBACK")
    assert pg.value("SELECT count(*) FROM gen") == 0
    with pg.connect() as b:
        b_id, _ = insert(b, "after")
    a_id, a_stamp = prepare_one(pg, "works")
    cursor, ids = relay.claim()
    assert ids == [b_id], "no failed PREPARE holds the claim back"
    assert relay.lookups == 0, "the working PREPARE had its entry from PRE_PREPARE"
    if mode == "horizon":
        assert cursor == a_stamp
    else:
        assert a_stamp in relay.holes[1]
    pg.sql("COMMIT PREPARED 'works'")
    _, ids = relay.claim()
    assert a_id in ids
    relay.close()
    relay.assert_each_committed_row_once(pg)


def prepare_one(cluster, gid, rows=1):
    """A transaction that inserted `rows` rows and was prepared: its first row's id and stamp."""
    with cluster.connect() as a:
        a.execute("BEGIN")
        first = insert(a, "prepared")
        for _ in range(rows - 1):
            insert(a, "prepared")
        a.execute(f"PREPARE TRANSACTION '{gid}'")
    return first


def held_until_commit_prepared(cluster, gid, a_stamp, mode):
    """On a server run that did not see it prepared: a claim passes by the prepared transaction
    from its first stamp (twice: the look-up is kept) until COMMIT PREPARED; then all is claimed."""
    relay = Relay(cluster, mode)
    with cluster.connect() as b:
        b_id, _ = insert(b, "b")
        claim_while_open(relay, a_stamp, [b_id])
        claim_while_open(relay, a_stamp, [])
        assert relay.lookups == (0 if relay.mode == "wal" else 1), "looked up once, then kept"
        b.execute(f"COMMIT PREPARED '{gid}'")
    relay.claim()
    relay.close()
    relay.assert_each_committed_row_once(cluster)


@pytest.mark.parametrize("mode", CONTROLLED)
def test_a_transaction_prepared_before_a_restart_is_passed_by_from_its_first_stamp_until_it_commits(pg, mode):
    _, a_stamp = prepare_one(pg, "across", rows=2)
    pg.restart()
    held_until_commit_prepared(pg, "across", a_stamp, mode)


def test_a_transaction_prepared_before_a_restart_that_wrote_no_generation_row_holds_nothing(pg):
    with pg.connect() as a:
        a.execute("BEGIN")
        a.execute("SELECT pg_current_xact_id()")
        a.execute("PREPARE TRANSACTION 'no rows'")
    pg.restart()
    relay = Relay(pg)
    with pg.connect() as b:
        b_id, _ = insert(b, "b")
        assert relay.claim()[1] == [b_id]
        b.execute("ROLLBACK PREPARED 'no rows'")
    relay.close()


@pytest.mark.parametrize("mode", CONTROLLED)
def test_a_transaction_prepared_before_a_crash_is_passed_by_until_it_commits(pg, mode):
    _, a_stamp = prepare_one(pg, "crashed")
    open_writer = pg.connect()
    open_writer.execute("BEGIN")
    insert(open_writer, "in progress at the crash")  # aborted by the crash
    pg.stop("immediate")
    open_writer.close()
    pg.start()
    held_until_commit_prepared(pg, "crashed", a_stamp, mode)


@pytest.mark.parametrize("mode", CONTROLLED)
def test_a_promoted_standby_passes_by_a_transaction_prepared_on_the_primary(standbys, mode):
    with PgCluster(settings={"outbox.workers": "0", "max_prepared_transactions": "4"}) as primary:
        set_up(primary)
        standby = primary.make_standby("ow_standby", settings={"outbox.workers": "0"})
        standbys.append(standby)
        standby.start()
        primary.wait_streaming("ow_standby")
        _, a_stamp = prepare_one(primary, "promoted")
        written = primary.value("SELECT pg_current_wal_lsn()::text")
        wait_until(lambda: standby.value("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (written,)),
                   60, "the standby replayed the PREPARE")
        primary.stop("immediate")
        standby.promote()
        held_until_commit_prepared(standby, "promoted", a_stamp, mode)


@pytest.mark.parametrize("mode", MODES)
def test_a_terminated_writer_holds_nothing_back(pg, mode):
    relay = Relay(pg, mode)
    a = pg.connect()
    a.execute("BEGIN")
    _, a_stamp = insert(a, "a")
    claim_while_open(relay, a_stamp, [])
    assert pg.value("SELECT pg_terminate_backend(%s, 10000)", (a.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError):
        a.execute("COMMIT")
    a.close()
    with pg.connect() as b:
        b_id, _ = insert(b, "b")
    assert relay.claim()[1] == [b_id]
    assert relay.open == []
    relay.close()
    assert relay.claimed == committed_ids(pg) == [b_id] and relay.holes == ([], [])


@pytest.mark.parametrize("mode", MODES)
def test_an_open_writer_of_another_database_holds_nothing_here(pg, mode):
    pg.sql("CREATE DATABASE other")
    try:
        set_up(pg, "other")
        relay = Relay(pg, mode)
        with pg.connect("other") as a, pg.connect() as b:
            a.execute("BEGIN")
            insert(a, "there")
            b_id, _ = insert(b, "here")
            assert relay.claim()[1] == [b_id] and relay.holes == ([], [])
            a.execute("ROLLBACK")
        relay.close()
    finally:
        pg.sql("DROP DATABASE other WITH (FORCE)")


def test_bad_uses_of_the_trigger_are_refused(pg):
    with pg.connect() as c:
        c.execute("CREATE TABLE wrong (id int, order_lsn text, writer xid8)")
        c.execute("CREATE TRIGGER s BEFORE INSERT ON wrong FOR EACH ROW EXECUTE FUNCTION gen_stamp()")
        with pytest.raises(psycopg.errors.InvalidObjectDefinition, match="no column order_lsn of type pg_lsn"):
            c.execute("INSERT INTO wrong VALUES (1, 'x', '1')")
        c.execute("DROP TRIGGER s ON wrong")
        c.execute("CREATE TRIGGER s AFTER INSERT ON gen FOR EACH ROW EXECUTE FUNCTION gen_stamp()")
        with pytest.raises(psycopg.errors.TriggerProtocolViolated, match="BEFORE INSERT"):
            c.execute("INSERT INTO gen (label) VALUES ('after')")
        c.execute("DROP TRIGGER s ON gen")
        c.execute("CREATE TRIGGER s BEFORE UPDATE ON gen FOR EACH ROW EXECUTE FUNCTION gen_stamp()")
        c.execute("INSERT INTO gen (label) VALUES ('row')")
        with pytest.raises(psycopg.errors.TriggerProtocolViolated, match="BEFORE INSERT"):
            c.execute("UPDATE gen SET label = 'changed'")
        c.execute("DROP TRIGGER s ON gen")
        c.execute("DROP TABLE wrong")
    assert pg.value("SELECT count(*) FROM gen WHERE label <> 'row'") == 0


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_writers_savepoints_and_prepares_lose_and_repeat_nothing(pg, mode):
    """Writers commit, roll back, use savepoints and PREPARE in random interleavings while a
    claim runs in a loop: every committed row is claimed once, none that rolled back."""
    stop = threading.Event()
    errors = []

    def writer(seed):
        rnd = random.Random(seed)
        try:
            with pg.connect() as c:
                n = 0
                while not stop.is_set() and n < 120:
                    n += 1
                    c.execute("BEGIN")
                    for _ in range(rnd.randint(1, 4)):
                        if rnd.random() < 0.3:
                            c.execute("SAVEPOINT s")
                            insert(c, f"{seed}-{n}")
                            c.execute("ROLLBACK TO SAVEPOINT s" if rnd.random() < 0.5 else "RELEASE SAVEPOINT s")
                        else:
                            insert(c, f"{seed}-{n}")
                    end = rnd.random()
                    if end < 0.1:
                        gid = f"w{seed}-{n}"
                        c.execute(f"PREPARE TRANSACTION '{gid}'")
                        c.execute(f"COMMIT PREPARED '{gid}'")
                    elif end < 0.25:
                        c.execute("ROLLBACK")
                    else:
                        c.execute("COMMIT")
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(4)]
    relay = Relay(pg, mode)
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        relay.claim()
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    wait_until(lambda: relay.claim() and len(relay.claimed) >= len(committed_ids(pg)), what="the last claims")
    relay.claim()
    relay.close()
    assert relay.holes == ([], [])
    relay.assert_each_committed_row_once(pg)
