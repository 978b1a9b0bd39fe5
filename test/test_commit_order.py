"""Commit order: the events of one (topic, key) are ordered by (order_lsn, id) in the order their
transactions committed, whatever order they were enqueued in (DESIGN.md "Commit order").
Database-level checks, plus one end to end through the relay and the mock cluster."""

import uuid

import pytest

from harness.kafka_reader import read_topic
from harness.lock_waits import InThread, waiting_on_lock
from harness.pg_cluster import PgCluster
from harness.wait import wait_until

KEY_LOCK_CLASS = 0x4F42     # pg_locks.objsubid of commit_order.cpp's per-key locks
GLOBAL_LOCK_CLASS = 0x4F43  # ... and of its global lock


@pytest.fixture(scope="module")
def pg():
    with PgCluster(settings={"outbox.workers": "0", "max_prepared_transactions": "10"}) as cluster:
        yield cluster


@pytest.fixture
def topic():
    return "co-" + uuid.uuid4().hex[:12]


def session(pg, **settings):
    """An autocommit connection (BEGIN/COMMIT are sent as statements) whose lock waits fail
    instead of hanging the test."""
    c = pg.connect()
    c.execute("SET lock_timeout = '30s'")
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
        "WHERE p.gid = %s AND l.locktype = 'advisory' AND l.objsubid IN (%s, %s) GROUP BY l.objsubid",
        (gid, KEY_LOCK_CLASS, GLOBAL_LOCK_CLASS)))


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
        assert our_locks_of_prepared(pg, gid) == {GLOBAL_LOCK_CLASS: 1, KEY_LOCK_CLASS: 2}
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
    gid = "big-" + topic
    big, other = session(pg), session(pg)
    with big, other:
        big.execute("BEGIN")
        big.execute("SELECT count(outbox.enqueue(%s, 'k' || i, 'big'::text)) FROM generate_series(1, 100000) i",
                    (topic,))
        other.execute("BEGIN")
        enqueue(other, topic, "k5", "other")
        other.execute("COMMIT")
        big.execute(f"PREPARE TRANSACTION '{gid}'")
        try:
            # One global lock instead of 100,000 key locks, and the lock table has room for others.
            assert our_locks_of_prepared(pg, gid) == {GLOBAL_LOCK_CLASS: 1}
            other.execute("BEGIN")
            other.execute("SELECT count(pg_advisory_xact_lock(i)) FROM generate_series(1, 2000) i")
            other.execute("COMMIT")
        finally:
            pg.sql(f"COMMIT PREPARED '{gid}'")
    assert published_order(pg, topic, "k5") == ["other", "big"]
    assert pg.value("SELECT count(*) FROM outbox.events WHERE topic = %s", (topic,)) == 100001


def test_relay_publishes_a_key_in_commit_order(mock_cluster, make_relay):
    # Needs the relay to claim a key's rows in (order_lsn, id) order.
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    key = "co-" + uuid.uuid4().hex[:8]
    enqueue_early_commit_late(pg, "billing", key)
    pg.wait_published(2)
    records = sorted(read_topic(mock_cluster.bootstrap, "billing", 2), key=lambda r: (r.partition, r.offset))
    assert [r.value for r in records if r.key == key.encode()] == [b"A", b"B"]
