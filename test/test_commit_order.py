"""Commit order: the events of one (topic, key) are ordered by (order_lsn, id) in the order their
transactions committed, whatever order they were enqueued in (DESIGN.md "Commit order").
Database-level checks, plus one end to end through the relay and the mock cluster."""

import uuid

import psycopg
import pytest

from harness.kafka_reader import read_topic
from harness.lock_waits import InThread, waiting_on_lock
from harness.pg_cluster import PgCluster
from harness.wait import wait_until

KEY_LOCK_CLASS = 0x4F42     # pg_locks.objsubid of commit_order.cpp's per-key locks
GLOBAL_LOCK_CLASS = 0x4F43  # ... and of its global lock
PREPARE_GATE_CLASS = 0x4F44  # ... and of its prepare gates (one per waiting committer of many keys)


APP = "co_app"            # only EXECUTE on enqueue (docs/privileges.md)
CANCELLER = "co_canceller"  # ... and DELETE on outbox.events, SELECT of its event_id: takes back its own events
ENQUEUE_SIGNATURES = ", ".join(f"outbox.enqueue(text, text, {t}, jsonb, uuid, integer, text, text, boolean, text, text)"
                               for t in ("jsonb", "text", "bytea"))


def create_roles(pg):
    for role in (APP, CANCELLER):
        pg.sql(f"CREATE ROLE {role} LOGIN")
        pg.sql(f"GRANT USAGE ON SCHEMA outbox TO {role}")
        pg.sql(f"GRANT EXECUTE ON FUNCTION {ENQUEUE_SIGNATURES} TO {role}")
    pg.sql(f"GRANT SELECT (event_id), DELETE ON outbox.events TO {CANCELLER}")


# A test of 0.3.0's table (rows deleted or changed by hand, its triggers): its own cluster of
# that version (existing installs keep it until they update); the rest runs on the default.
OLD_TABLE = pytest.mark.parametrize("pg", ["0.3.0"], indirect=True)


@pytest.fixture(scope="module")
def pg(request):
    with PgCluster(settings={"outbox.workers": "0", "max_prepared_transactions": "10"},
                   create_extension=getattr(request, "param", True)) as cluster:
        create_roles(cluster)
        yield cluster


@pytest.fixture
def topic():
    return "co-" + uuid.uuid4().hex[:12]


def session(pg, user="postgres", lock_timeout="30s", **settings):
    """An autocommit connection (BEGIN/COMMIT are sent as statements) whose lock waits fail
    instead of hanging the test."""
    c = pg.connect(user=user)
    c.execute(f"SET lock_timeout = '{lock_timeout}'")
    for name, value in settings.items():
        c.execute(f"SET {name} = '{value}'")
    return c


def enqueue(c, topic, key, label):
    c.execute("SELECT outbox.enqueue(%s, %s, %s::text)", (topic, key, label))


def published_order(pg, topic, key):
    """The payloads of (topic, key) in the order the relay publishes them."""
    return [r[0] for r in pg.sql("SELECT convert_from(payload, 'UTF8') FROM outbox.events "
                                 "WHERE topic = %s AND key = %s ORDER BY order_lsn, id", (topic, key))]


def our_locks_of_prepared(pg, gid):
    return dict(pg.sql(
        "SELECT l.objsubid, count(*) FROM pg_prepared_xacts p "
        "JOIN pg_locks x ON x.locktype = 'transactionid' AND x.transactionid = p.transaction "
        "JOIN pg_locks l ON l.virtualtransaction = x.virtualtransaction AND l.pid IS NULL "
        "WHERE p.gid = %s AND l.locktype = 'advisory' AND l.objsubid IN (%s, %s, %s) GROUP BY l.objsubid",
        (gid, KEY_LOCK_CLASS, GLOBAL_LOCK_CLASS, PREPARE_GATE_CLASS)))


def our_locks_of(pg, c):
    """{(objsubid, granted): count} of commit_order.cpp's locks held or awaited by c's backend."""
    return {(r[0], r[1]): r[2] for r in pg.sql(
        "SELECT objsubid, granted, count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory' "
        "AND objsubid IN (%s, %s, %s) GROUP BY 1, 2",
        (c.info.backend_pid, KEY_LOCK_CLASS, GLOBAL_LOCK_CLASS, PREPARE_GATE_CLASS))}


def key_lock_limit(pg):
    """More distinct keys than this, and a commit takes the global lock exclusively."""
    return int(pg.value("SHOW max_locks_per_transaction")) // 2


def enqueue_early_commit_late(pg, topic, key, **settings):
    """Shape (b): T1 enqueues B; T2 enqueues A and commits; T1 commits. Sequential on two
    connections: T2's commit must not wait for T1 (lock_timeout turns a wait into a failure)."""
    t1, t2 = session(pg, **settings), session(pg, **settings)
    with t1, t2:
        t1.execute("BEGIN")
        enqueue(t1, topic, key, "B")
        t2.execute("BEGIN")
        enqueue(t2, topic, key, "A")
        t2.execute("COMMIT")
        t1.execute("COMMIT")


def test_waiter_for_a_business_lock_commits_after_the_holder(pg, topic):
    # Shape (a): S1 enqueues B, then waits for a row S2 has locked; S2 enqueues A and commits.
    pg.sql("CREATE TABLE IF NOT EXISTS invoices (id text PRIMARY KEY, n int)")
    pg.sql("INSERT INTO invoices VALUES (%s, 0)", (topic,))
    s1, s2 = session(pg), session(pg)
    with s1, s2:
        s2.execute("BEGIN")
        s2.execute("UPDATE invoices SET n = n + 1 WHERE id = %s", (topic,))
        s1.execute("BEGIN")
        enqueue(s1, topic, "inv-1", "B")
        waiter = InThread(s1, f"UPDATE invoices SET n = n + 1 WHERE id = '{topic}'", "COMMIT")
        wait_until(lambda: waiting_on_lock(pg, s1), what="S1 waiting for the row lock")
        enqueue(s2, topic, "inv-1", "A")
        s2.execute("COMMIT")
        waiter.join()
    assert published_order(pg, topic, "inv-1") == ["A", "B"]


def test_enqueued_earlier_committed_later_sorts_later_without_blocking(pg, topic):
    enqueue_early_commit_late(pg, topic, "k")
    assert published_order(pg, topic, "k") == ["A", "B"]


def test_synchronous_commit_off(pg, topic):
    enqueue_early_commit_late(pg, topic, "k", synchronous_commit="off")
    assert published_order(pg, topic, "k") == ["A", "B"]


def test_identity_cache_does_not_decide_the_order(pg, topic):
    # Shape (c): with CACHE 100 each session draws ids from its own block, so ids say nothing
    # about time across sessions.
    pg.sql("ALTER SEQUENCE outbox.events_id_seq CACHE 100")
    try:
        s1, s2 = session(pg), session(pg)
        with s1, s2:
            enqueue(s1, topic, "warm-up-1", "x")  # each session takes its block of ids
            enqueue(s2, topic, "warm-up-2", "x")
            s1.execute("BEGIN")
            enqueue(s1, topic, "k", "B")
            s2.execute("BEGIN")
            enqueue(s2, topic, "k", "A")
            s2.execute("COMMIT")
            s1.execute("COMMIT")
            enqueue(s1, topic, "k", "C")  # a lower id than A's, committed last
    finally:
        pg.sql("ALTER SEQUENCE outbox.events_id_seq CACHE 1")
    ids = dict(pg.sql("SELECT convert_from(payload, 'UTF8'), id FROM outbox.events WHERE topic = %s AND key = 'k'",
                      (topic,)))
    assert ids["C"] < ids["A"], "the sessions did not draw from separate id blocks"
    assert published_order(pg, topic, "k") == ["A", "B", "C"]


def test_savepoints_released_and_rolled_back(pg, topic):
    t1, t2 = session(pg), session(pg)
    gid = "sp-" + topic
    with t1, t2:
        t1.execute("BEGIN")
        t1.execute("SAVEPOINT a")
        enqueue(t1, topic, "k1", "B1")
        t1.execute("RELEASE a")
        t1.execute("SAVEPOINT b")
        enqueue(t1, topic, "k2", "rolled back")
        t1.execute("SAVEPOINT c")
        enqueue(t1, topic, "k3", "rolled back")
        t1.execute("RELEASE c")
        t1.execute("ROLLBACK TO b")
        enqueue(t1, topic, "k2", "B2")
        t2.execute("BEGIN")
        enqueue(t2, topic, "k1", "A1")
        enqueue(t2, topic, "k2", "A2")
        t2.execute("COMMIT")
        # Prepared, so its locks stay to be counted: k1 and k2, nothing for the rolled-back k3.
        t1.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        # The global Share lock is given back at PREPARE (it would hold up committers of many keys).
        assert our_locks_of_prepared(pg, gid) == {KEY_LOCK_CLASS: 2}
    finally:
        pg.sql(f"COMMIT PREPARED '{gid}'")
    assert published_order(pg, topic, "k1") == ["A1", "B1"]
    assert published_order(pg, topic, "k2") == ["A2", "B2"]
    assert published_order(pg, topic, "k3") == []


def test_prepared_transaction_orders_by_commit_prepared(pg, topic):
    gid = "p-" + topic
    t1, t2, t3 = session(pg), session(pg), session(pg)
    with t1, t2, t3:
        t1.execute("BEGIN")
        enqueue(t1, topic, "k", "B")
        t2.execute("BEGIN")
        enqueue(t2, topic, "k", "A")
        t2.execute("COMMIT")
        t1.execute(f"PREPARE TRANSACTION '{gid}'")
        # C commits after COMMIT PREPARED, so it must sort after B: its commit waits for it.
        t3.execute("BEGIN")
        enqueue(t3, topic, "k", "C")
        committer = InThread(t3, "COMMIT")
        try:
            wait_until(lambda: waiting_on_lock(pg, t3), what="C's commit waiting for the prepared transaction")
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
        committer.join()
    assert published_order(pg, topic, "k") == ["A", "B", "C"]


def test_keys_enqueued_in_opposite_orders_commit_without_deadlock(pg, topic):
    # A prepared transaction holds both keys, so both commits below wait at the same time; with
    # locks taken in enqueue order each would get one key and wait for the other (deadlock).
    gid = "dl-" + topic
    p, t1, t2 = session(pg), session(pg), session(pg)
    with p, t1, t2:
        p.execute("BEGIN")
        enqueue(p, topic, "k1", "P")
        enqueue(p, topic, "k2", "P")
        p.execute(f"PREPARE TRANSACTION '{gid}'")
        t1.execute("BEGIN")
        t2.execute("BEGIN")
        enqueue(t1, topic, "k1", "T1")
        enqueue(t2, topic, "k2", "T2")
        enqueue(t2, topic, "k1", "T2")
        enqueue(t1, topic, "k2", "T1")
        c1, c2 = InThread(t1, "COMMIT"), InThread(t2, "COMMIT")
        try:
            wait_until(lambda: waiting_on_lock(pg, t1) and waiting_on_lock(pg, t2), what="both commits waiting")
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
        c1.join()
        c2.join()
    k1, k2 = published_order(pg, topic, "k1"), published_order(pg, topic, "k2")
    assert k1[0] == "P" and k2[0] == "P"
    assert sorted(k1[1:]) == ["T1", "T2"]
    assert k1 == k2, "one commit order for both keys"


def test_hundred_thousand_keys_take_one_lock(pg, topic):
    # A prepared transaction holds k5, so the big commit waits where it can be looked at: for that
    # key alone, holding no lock of ours but the prepare gate, and the lock table has room for others.
    gid = "big-" + topic
    p, big, other = session(pg, APP), session(pg, APP), session(pg, lock_timeout="5s")
    with p, big, other:
        p.execute("BEGIN")
        enqueue(p, topic, "k5", "prepared")
        p.execute(f"PREPARE TRANSACTION '{gid}'")
        big.execute("BEGIN")
        big.execute("SELECT count(outbox.enqueue(%s, 'k' || i, 'big'::text)) FROM generate_series(1, 100000) i",
                    (topic,))
        committer = InThread(big, "COMMIT")
        try:
            wait_until(lambda: waiting_on_lock(pg, big), what="the big commit waiting for k5")
            assert our_locks_of(pg, big) == {(KEY_LOCK_CLASS, False): 1, (PREPARE_GATE_CLASS, True): 1}
            other.execute("BEGIN")
            other.execute("SELECT count(pg_advisory_xact_lock(i)) FROM generate_series(1, 2000) i")
            enqueue(other, topic, "k-other", "other")
            other.execute("COMMIT")
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
        committer.join()
    assert published_order(pg, topic, "k5") == ["prepared", "big"]
    assert pg.value("SELECT count(*) FROM outbox.events WHERE topic = %s", (topic,)) == 100002


def test_relay_publishes_a_key_in_commit_order(mock_cluster, make_relay):
    # Needs the relay to claim a key's rows in (order_lsn, id) order.
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    key = "co-" + uuid.uuid4().hex[:8]
    enqueue_early_commit_late(pg, "billing", key)
    pg.wait_published(2)
    records = sorted(read_topic(mock_cluster.bootstrap, "billing", 2), key=lambda r: (r.partition, r.offset))
    assert [r.value for r in records if r.key == key.encode()] == [b"A", b"B"]


# -- prepared transactions and the global lock (issue 15, item 3) ------------------------------

def no_prepared_left(pg, gid):
    """Rolls back what an old build let through, so one failing test does not hold up the rest."""
    if pg.value("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)):
        pg.sql(f"ROLLBACK PREPARED '{gid}'")
        return False
    return True


def test_prepare_of_more_keys_than_the_key_locks_is_refused(pg, topic):
    # Its Exclusive global lock would stay until COMMIT PREPARED: every enqueuing commit would wait.
    gid = "many-" + topic
    keys = key_lock_limit(pg) + 1
    with session(pg, APP) as c:
        c.execute("BEGIN")
        c.execute("SELECT count(outbox.enqueue(%s, 'k' || i, 'x'::text)) FROM generate_series(1, %s) i", (topic, keys))
        try:
            with pytest.raises(psycopg.errors.ProgramLimitExceeded) as e:
                c.execute(f"PREPARE TRANSACTION '{gid}'")
        finally:
            prepared_none = no_prepared_left(pg, gid)
    assert prepared_none
    assert f"more than {keys - 1} keys" in e.value.diag.message_primary
    assert f"{keys} distinct (topic, key) hashes" in e.value.diag.message_detail
    assert "without PREPARE TRANSACTION" in e.value.diag.message_hint
    # Refused means rolled back, and nothing of ours is held: another commit goes at once.
    assert pg.value("SELECT count(*) FROM outbox.events WHERE topic = %s", (topic,)) == 0
    with session(pg, APP, lock_timeout="5s") as other:
        enqueue(other, topic, "k1", "after")
    assert published_order(pg, topic, "k1") == ["after"]


def test_prepare_at_the_key_lock_limit_holds_key_locks_only(pg, topic):
    gid = "limit-" + topic
    keys = key_lock_limit(pg)
    with session(pg, APP) as c:
        c.execute("BEGIN")
        c.execute("SELECT count(outbox.enqueue(%s, 'k' || i, 'x'::text)) FROM generate_series(1, %s) i", (topic, keys))
        c.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        assert our_locks_of_prepared(pg, gid) == {KEY_LOCK_CLASS: keys}
    finally:
        pg.sql(f"COMMIT PREPARED '{gid}'")


def test_a_prepared_transaction_holds_up_no_committer_of_many_keys(pg, topic):
    # 0.2.0: the prepared transaction's global Share lock made the many-key commit wait for COMMIT
    # PREPARED, and every enqueuer queued behind that one's Exclusive request.
    gid = "few-" + topic
    p, many, plain = session(pg, APP), session(pg, APP, lock_timeout="5s"), session(pg, APP, lock_timeout="5s")
    with p, many, plain:
        p.execute("BEGIN")
        enqueue(p, topic, "p", "P")
        p.execute(f"PREPARE TRANSACTION '{gid}'")
        try:
            many.execute("BEGIN")
            many.execute("SELECT count(outbox.enqueue(%s, 'k' || i, 'M'::text)) FROM generate_series(1, %s) i",
                         (topic, key_lock_limit(pg) + 1))
            many.execute("COMMIT")
            enqueue(plain, topic, "k1", "T")
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
    assert published_order(pg, topic, "k1") == ["M", "T"]
    assert published_order(pg, topic, "p") == ["P"]


def test_a_committer_of_many_keys_waits_for_a_prepared_key_without_holding_up_others(pg, topic):
    gid = "shared-" + topic
    p, many, plain = session(pg, APP), session(pg, APP), session(pg, APP, lock_timeout="5s")
    with p, many, plain:
        p.execute("BEGIN")
        enqueue(p, topic, "shared", "P")
        p.execute(f"PREPARE TRANSACTION '{gid}'")
        many.execute("BEGIN")
        enqueue(many, topic, "shared", "M")
        many.execute("SELECT count(outbox.enqueue(%s, 'k' || i, 'M'::text)) FROM generate_series(1, %s) i",
                     (topic, key_lock_limit(pg)))
        committer = InThread(many, "COMMIT")
        try:
            # It waits for the prepared key, holding no lock of ours but the prepare gate (which
            # only PREPAREs take): others commit meanwhile.
            wait_until(lambda: waiting_on_lock(pg, many), what="the many-key commit waiting for the shared key")
            assert our_locks_of(pg, many) == {(KEY_LOCK_CLASS, False): 1, (PREPARE_GATE_CLASS, True): 1}
            enqueue(plain, topic, "other", "T")
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
        committer.join()
    assert published_order(pg, topic, "shared") == ["P", "M"]
    assert published_order(pg, topic, "other") == ["T"]


def test_an_enqueuer_cannot_rewrite_its_rows_before_commit(pg, topic):
    # Only a role granted UPDATE on the table (the owner, the relay role) can change a row's topic,
    # key or order_lsn; such a row is written by hand (no commit-order promise for it).
    with session(pg, APP) as c:
        c.execute("BEGIN")
        enqueue(c, topic, "k", "x")
        for assignment in ("key = 'other'", "topic = 'other'", "order_lsn = 'FFFFFFFF/0'"):
            c.execute("SAVEPOINT s")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(f"UPDATE outbox.events SET {assignment}")
            c.execute("ROLLBACK TO s")
        c.execute("COMMIT")
    assert published_order(pg, topic, "k") == ["x"]


# -- stamps below the commit record, across a restart and a promotion (issue 15, item 4) -------

# Deleted rows of a re-stamped key: 0.2.0's new stamps overshot the WAL by about one byte each,
# far more than a restart or a promotion writes.
DELETED = 20000


def stripe_mate(pg, topic, key):
    """Another key of the topic whose hash shares `key`'s stripe (commit_order.cpp: the 64-bit
    hash is hash_bytes_extended(key, hash_bytes_extended(topic, 0)), the stripe its low 16 bits)."""
    return pg.value(
        "WITH h AS (SELECT k, hashtextextended(k COLLATE \"C\", hashtextextended(%s COLLATE \"C\", 0)) & 65535 AS s "
        "FROM (SELECT %s AS k UNION ALL SELECT 'mate-' || i FROM generate_series(1, 1000000) i) keys) "
        "SELECT k FROM h WHERE s = (SELECT s FROM h WHERE k = %s) AND k <> %s LIMIT 1", (topic, key, key, key))


def restamped_after_deleting_its_rows(pg, topic, key, shape):
    """T1 (may take back its own events) enqueues DELETED + 1 events of `key` and deletes all but
    the last; T2 commits A (of `key`, or of a key sharing its stripe) in between; T1 commits after,
    so its rows are re-stamped. Returns the label of T1's kept row."""
    t1, t2 = session(pg, CANCELLER), session(pg, APP)
    kept = f"B-{DELETED + 1}"
    with t1, t2:
        t1.execute("BEGIN")
        if shape == "in a savepoint":
            t1.execute("SAVEPOINT s")
        ids = t1.execute("SELECT array_agg(id ORDER BY i) FROM (SELECT i, outbox.enqueue(%s, %s, 'B-' || i) id "
                         "FROM generate_series(1, %s) i) e", (topic, key, DELETED + 1)).fetchone()[0]
        if shape == "many keys":  # the global Exclusive path
            t1.execute("SELECT count(outbox.enqueue(%s, 'many-' || i, 'x'::text)) FROM generate_series(1, %s) i",
                       (topic, key_lock_limit(pg) + 1))
        if shape == "deleted in a savepoint":
            t1.execute("SAVEPOINT d")
        t1.execute("DELETE FROM outbox.events WHERE event_id = ANY(%s)", (ids[:-1],))
        if shape == "deleted in a savepoint":
            t1.execute("RELEASE d")
        if shape == "in a savepoint":
            t1.execute("RELEASE s")
        enqueue(t2, topic, stripe_mate(pg, topic, key) if shape == "stripe collision" else key, "A")
        t1.execute("COMMIT")
    return kept


SHAPES = ["deleted", "in a savepoint", "deleted in a savepoint", "many keys", "stripe collision"]


@OLD_TABLE
@pytest.mark.parametrize("shape", SHAPES)
def test_a_restart_keeps_a_restamped_key_in_commit_order(pg, topic, shape):
    kept = restamped_after_deleting_its_rows(pg, topic, "k", shape)
    pg.restart()  # fast shutdown: the stripes are gone, the WAL position goes on
    with session(pg, APP) as c:
        enqueue(c, topic, "k", "C")
    expected = [kept, "C"] if shape == "stripe collision" else ["A", kept, "C"]
    assert published_order(pg, topic, "k") == expected


def test_a_promoted_standby_keeps_a_restamped_key_in_commit_order(standbys, topic):
    with PgCluster(settings={"outbox.workers": "0"}, create_extension="0.3.0") as primary:  # rows deleted by hand
        create_roles(primary)
        standby = primary.make_standby("co_standby", settings={"outbox.workers": "0"})
        standbys.append(standby)
        standby.start()
        primary.wait_streaming("co_standby")
        kept = restamped_after_deleting_its_rows(primary, topic, "k", "deleted")
        written = primary.value("SELECT pg_current_wal_lsn()::text")
        wait_until(lambda: standby.value("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (written,),
                                         dbname="postgres"), 60, "the standby replayed the commit")
        primary.stop("immediate")
        standby.promote()
        with session(standby, APP) as c:
            enqueue(c, topic, "k", "C")
        assert published_order(standby, topic, "k") == ["A", kept, "C"]


@OLD_TABLE
def test_a_crash_keeps_a_restamped_key_in_commit_order(pg, topic):
    kept = restamped_after_deleting_its_rows(pg, topic, "k", "deleted")
    pg.stop("immediate")  # a crash: recovery replays the WAL, the stripes are gone
    pg.start()
    with session(pg, APP) as c:
        enqueue(c, topic, "k", "C")
    assert published_order(pg, topic, "k") == ["A", kept, "C"]


@OLD_TABLE
def test_a_prepared_restamp_keeps_its_key_in_commit_order_across_a_crash(pg, topic):
    # Re-stamped at PREPARE (its stamps must lie below the PREPARE record), the server crashes,
    # COMMIT PREPARED on the new run, then a commit of the key: it sorts after.
    gid = "crash-" + topic
    t1, t2 = session(pg, CANCELLER), session(pg, APP)
    with t1, t2:
        t1.execute("BEGIN")
        ids = t1.execute("SELECT array_agg(id ORDER BY i) FROM (SELECT i, outbox.enqueue(%s, 'k', 'B-' || i) id "
                         "FROM generate_series(1, %s) i) e", (topic, DELETED + 1)).fetchone()[0]
        t1.execute("DELETE FROM outbox.events WHERE event_id = ANY(%s)", (ids[:-1],))
        enqueue(t2, topic, "k", "A")
        t1.execute(f"PREPARE TRANSACTION '{gid}'")
    pg.stop("immediate")
    pg.start()
    pg.sql(f"COMMIT PREPARED '{gid}'")
    with session(pg, APP) as c:
        enqueue(c, topic, "k", "C")
    assert published_order(pg, topic, "k") == ["A", f"B-{DELETED + 1}", "C"]
