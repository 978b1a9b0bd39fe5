"""What every supported major (PostgreSQL 14 to 18) gets beside build, pg_regress and the isolation
test: a relay smoke test, the version-dependent features (named wait events on 17+, the module's
name and version on 18), and a queue dumped from 15 restored into 17 and published there.

test/majors runs this file once per major with that major's programs first on PATH and
OUTBOX_PG_MAJOR set (the tests then check that the server is that major); the main test run runs
it on Debian's 15. The dump test needs OUTBOX_PG15_BINDIR and OUTBOX_PG17_BINDIR, which
test/majors sets: elsewhere it is skipped."""

import os
import subprocess

import pytest

from harness.kafka_reader import check_delivery, read_topic
from harness.pg_cluster import PgCluster
from harness.wait import wait_until


def server_major(pg, dbname=None):
    return pg.value("SELECT current_setting('server_version_num')::int / 10000", dbname=dbname)


@pytest.fixture
def relay(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap)
    expected = os.environ.get("OUTBOX_PG_MAJOR")
    if expected:  # test/majors: PATH must have given us the major it is testing
        assert server_major(pg) == int(expected)
    pg.wait_workers_running(1)
    return pg


def enqueue(pg, topic, n, keys, dbname=None):
    """n events on `keys` keys, ten per transaction; returns {key: [event_id, ...]} in enqueue order."""
    by_key = {}
    with pg.connect(dbname, autocommit=False) as c:
        for i in range(n):
            key = f"k{i % keys}"
            eid = c.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)::text", (topic, key, f'{{"seq": {i}}}')).fetchone()[0]
            by_key.setdefault(key, []).append(eid)
            if i % 10 == 9:
                c.commit()
        c.commit()
    return by_key


def assert_delivered(bootstrap, topic, by_key):
    n = sum(len(ids) for ids in by_key.values())
    check = check_delivery(read_topic(bootstrap, topic, n), by_key)
    assert check.lost == [] and check.order_violations == [] and check.unique == n, check


def test_smoke_enqueue_publish_read_back(mock_cluster, relay):
    by_key = enqueue(relay, "billing", 200, keys=10)
    relay.wait_published(200)
    assert_delivered(mock_cluster.bootstrap, "billing", by_key)
    rows = relay.sql("SELECT status, count(*), count(kafka_offset) FROM outbox.events GROUP BY status")
    assert rows == [("published", 200, 200)]


def relay_wait_event(pg):
    return tuple(pg.sql("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s",
                        (pg.worker_pids()[0],))[0])


def test_relay_waits_are_named_wait_events_on_17_and_extension_before(mock_cluster, relay):
    named = server_major(relay) >= 17
    idle = ("Extension", "OutboxIdle" if named else "Extension")
    wait_until(lambda: relay_wait_event(relay) == idle, 30, f"the idle relay waiting as {idle}")

    # A slow broker holds the batch in the wait for its acks.
    mock_cluster.rtt("all", 3000)
    relay.sql("SELECT outbox.enqueue('billing', 'k', '{}'::jsonb)")
    publish = ("Extension", "OutboxPublish" if named else "Extension")
    wait_until(lambda: relay.workers()[0][2] == "publishing" and relay_wait_event(relay) == publish, 30,
               f"the relay waiting for the acks as {publish}")
    if named:
        listed = relay.sql("SELECT name FROM pg_wait_events WHERE type = 'Extension' AND name LIKE 'Outbox%' "
                           "ORDER BY name")
        assert ("OutboxIdle",) in listed and ("OutboxPublish",) in listed
    mock_cluster.rtt("all", 0)
    relay.wait_published(1)


def test_module_reports_its_name_and_version_on_18(relay):
    if server_major(relay) < 18:
        pytest.skip("PG_MODULE_MAGIC_EXT and pg_get_loaded_modules() are PostgreSQL 18+")
    version = relay.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'")
    assert relay.sql("SELECT module_name, version FROM pg_get_loaded_modules() WHERE file_name = 'outbox.so'") == \
        [("outbox", version)]


PG15_BINDIR = os.environ.get("OUTBOX_PG15_BINDIR")
PG17_BINDIR = os.environ.get("OUTBOX_PG17_BINDIR")


@pytest.mark.skipif(not (PG15_BINDIR and PG17_BINDIR), reason="needs OUTBOX_PG15_BINDIR and OUTBOX_PG17_BINDIR "
                    "(test/majors sets them)")
def test_dump_of_15_with_pending_events_restores_into_17_and_the_relay_publishes_them(mock_cluster, tmp_path):
    # The old cluster has no relay: its events stay pending.
    old = PgCluster(settings={"outbox.workers": "0"}, database="shop", bindir=PG15_BINDIR)
    new = PgCluster(settings={"outbox.bootstrap_servers": f"'{mock_cluster.bootstrap}'", "outbox.workers": "1"},
                    database="shop", create_extension=False, bindir=PG17_BINDIR)
    try:
        old.init().start().setup_database()
        assert server_major(old) == 15
        by_key = enqueue(old, "orders", 100, keys=7)
        dump = tmp_path / "shop.dump"
        # The newer major's pg_dump, as PostgreSQL's upgrade notes say.
        subprocess.run([os.path.join(PG17_BINDIR, "pg_dump"), "-h", old.tmp, "-p", str(old.port), "-U", "postgres",
                        "-Fc", "-f", str(dump), "shop"], check=True)
        old.stop()

        new.init().start()
        assert server_major(new, "postgres") == 17
        new.sql('CREATE DATABASE "shop"', dbname="postgres")
        subprocess.run([os.path.join(PG17_BINDIR, "pg_restore"), "-h", new.tmp, "-p", str(new.port), "-U",
                        "postgres", "-d", "shop", "--exit-on-error", str(dump)], check=True)
        assert new.value("SELECT count(*) FROM outbox.events WHERE status = 'pending'") == 100
        new.restart()  # the worker found no database at start and would wait a minute
        new.wait_published(100)
        assert_delivered(mock_cluster.bootstrap, "orders", by_key)
    finally:
        old.cleanup()
        new.cleanup()
