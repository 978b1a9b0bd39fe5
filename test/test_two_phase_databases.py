"""Commit order with prepared transactions in two databases: the marks a committer of many keys
sets while it waits are its database's (DESIGN.md "Commit order"), like the key locks and the
prepare gate, so a bulk commit waiting in one database sends no PREPARE of another to its gate."""

import psycopg
import pytest

from harness.lock_waits import InThread, waiting_on_lock
from harness.pg_cluster import PgCluster
from harness.wait import wait_until
from test_commit_order import KEY_LOCK_CLASS, create_roles, enqueue, key_lock_limit
from test_commit_order import topic  # noqa: F401 (fixture)
from test_attack_commit_order import enqueue_many, key_hash, waiting_for


@pytest.fixture(scope="module")
def pg():
    with PgCluster(settings={"outbox.workers": "0", "max_prepared_transactions": "10"}) as cluster:
        create_roles(cluster)
        cluster.sql('CREATE DATABASE "other"')
        with cluster.connect("other") as c:
            c.execute("CREATE EXTENSION outbox")
        yield cluster


def session(pg, dbname=None, lock_timeout="30s"):
    c = pg.connect(dbname=dbname)
    c.execute(f"SET lock_timeout = '{lock_timeout}'")
    return c


def test_a_bulk_commit_waiting_in_another_database_holds_up_no_prepare_here(pg, topic):
    # Database other: P0a prepared with k1, Ma (k1..k33) waits for it and keeps its marks.
    # Database postgres: P0b prepared with j1, Mb (j1..j33) waits for it (it holds this database's
    # gate). P1b enqueues a key whose key hash falls on a stripe of Ma's keys and of none of Mb's:
    # with marks shared by all databases it would wait at this database's gate for Mb, that is for
    # P0b, which a coordinator may commit only once P1b is prepared.
    limit = key_lock_limit(pg)
    k_stripes = {key_hash(pg, topic, f"k{i}") & 0xFFFF for i in range(1, limit + 2)}
    j_stripes = {key_hash(pg, topic, f"j{i}") & 0xFFFF for i in range(1, limit + 2)}
    rows = pg.sql("SELECT 'v' || i FROM generate_series(1, 400000) i WHERE "
                  "(hashtextextended(('v' || i) COLLATE \"C\", hashtextextended(%s COLLATE \"C\", 0)) & 65535) "
                  "= ANY(%s) LIMIT 50", (topic, list(k_stripes - j_stripes)))
    victim = next(r[0] for r in rows)
    assert key_hash(pg, topic, victim) & 0xFFFF in k_stripes - j_stripes
    p0a, ma = session(pg, "other"), session(pg, "other")
    p0b, mb = session(pg), session(pg)
    p1b = session(pg, lock_timeout="10s")
    with p0a, ma, p0b, mb, p1b:
        p0a.execute("BEGIN")
        enqueue(p0a, topic, "k1", "P0a")
        p0a.execute("PREPARE TRANSACTION 'db_p0a'")
        ma.execute("BEGIN")
        enqueue_many(ma, topic, "Ma", limit + 1)
        commit_a = InThread(ma, "COMMIT")
        p0b.execute("BEGIN")
        p0b.execute("SELECT count(outbox.enqueue(%s, 'j1', 'P0b'))", (topic,))
        p0b.execute("PREPARE TRANSACTION 'db_p0b'")
        mb.execute("BEGIN")
        mb.execute("SELECT count(outbox.enqueue(%s, 'j' || i, 'Mb')) FROM generate_series(1, %s) i",
                   (topic, limit + 1))
        commit_b = InThread(mb, "COMMIT")
        refused = None
        try:
            wait_until(lambda: waiting_on_lock(pg, ma), what="Ma waiting for prepared k1")
            wait_until(lambda: waiting_for(pg, mb, KEY_LOCK_CLASS), what="Mb waiting for prepared j1")
            p1b.execute("BEGIN")
            enqueue(p1b, topic, victim, "P1b")
            try:
                p1b.execute("PREPARE TRANSACTION 'db_p1b'")
            except psycopg.errors.LockNotAvailable as e:
                refused = e
        finally:
            pg.sql("COMMIT PREPARED 'db_p0a'", dbname="other")
            pg.sql("COMMIT PREPARED 'db_p0b'")
            commit_a.thread.join(60)
            commit_b.thread.join(60)
        if refused is None:
            pg.sql("COMMIT PREPARED 'db_p1b'")
    assert refused is None, f"a PREPARE waited for a bulk commit of another database: {refused}"
