"""The re-base of the relay cursors on schema 0.4.0's ring (DESIGN.md "The insert-only queue", H6;
outbox.ring_rebase()): a cursor made on another system identifier (a dump restored into another
cluster, pg_upgrade), below outbox.ring_start (a dump restored into a database of the same
cluster) or above the WAL insert position (pg_resetwal) does not say what its slot passed: a
restore re-stamps every member row with this system's positions. After the re-base every pending
event is published once, in per-key order, nothing published is sent again, failed events stay
failed, and the ring is derived from the restored rows. Against librdkafka's mock cluster."""

import subprocess

import pytest

from harness.kafka_reader import check_delivery, read_topic
from harness.wait import wait_until
from test_relay import enqueue, rows_for
from test_safety import lane_of

REBASED = "outbox: re-based "


def published(pg, dbname=None):
    return pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'", dbname=dbname)


def relay_stopped(pg):
    pg.set(workers=0)
    wait_until(lambda: not any(w[1] for w in pg.workers()), 60, "the relay stopped")


def extend(expected, more):
    for key, ids in more.items():
        expected.setdefault(key, []).extend(ids)
    return expected


def sysid(pg):
    return pg.value("SELECT system_identifier FROM pg_control_system()")


@pytest.fixture
def ring_relay(mock_cluster, make_relay):
    def make(workers=1, **settings):
        pg = make_relay(mock_cluster.bootstrap, workers=workers, create_extension=False, **settings)
        pg.sql("CREATE EXTENSION outbox VERSION '0.4.0'")
        pg.wait_workers_running(workers)
        return pg
    return make


@pytest.mark.parametrize("version", ["0.4.0", "0.4.1"])  # 0.4.1: caller_event_id in the dump
@pytest.mark.parametrize("into", ["another cluster", "the same cluster"])
def test_a_restored_dump_publishes_what_was_pending_once_and_nothing_published_again(mock_cluster, make_relay,
                                                                                     tmp_path, into, version):
    """A database on 0.4.0 with events published, pending in two ring members, failed,
    quarantined and retried (pending in event_state), dumped with its relay stopped and restored
    into a database that has CREATE EXTENSION outbox VERSION '0.4.0' already (pg_dump's CREATE
    EXTENSION IF NOT EXISTS keeps it), on another cluster (another system identifier) or on the
    same one after a DROP DATABASE (the same system identifier, the restored cursor below the new
    ring_start). The restore re-stamps every member row with the new positions; the relay
    re-bases its cursor first."""
    old = make_relay(mock_cluster.bootstrap, database="shop", on_failed_event="skip", max_attempts=1,
                     kafka_properties="message.max.bytes=2000", max_payload_bytes="1MB",
                     allowed_topics="orders,billing", create_extension=version)
    old.wait_workers_running(1)
    expected = enqueue(old, "orders", rows_for(60, 6))
    # Refused by the producer (over message.max.bytes): failed at once (max_attempts = 1).
    stays_failed = old.value("SELECT outbox.enqueue('billing', 'bad1', %s)::text", ("x" * 5000,))
    retried = old.value("SELECT outbox.enqueue('billing', 'bad2', %s)::text", ("y" * 5000,))
    # Quarantined: a row written by hand for a topic outside outbox.allowed_topics.
    quarantined = "6f1c34d2-3f5b-4a39-9c55-0d3f4c0a9e03"
    old.sql("INSERT INTO outbox.events (event_id, topic, key, lane, payload) VALUES (%s, 'hidden', 'q', %s, 'x')",
            (quarantined, lane_of("q", quarantined)))
    wait_until(lambda: old.value("SELECT count(*) FROM outbox.failed") == 3, 60, "three events failed")
    old.wait_published(60)
    relay_stopped(old)
    # Pending: in events_0, then (after a rotation; the sealed member is kept, the cursor has not
    # passed it) in events_1; and one put back by retry(), pending in event_state.
    extend(expected, enqueue(old, "orders", [(f"k{i % 6}", f'{{"seq": {60 + i}}}') for i in range(30)]))
    assert old.value("SELECT outbox.purge(interval '0')") == 0
    assert old.sql("SELECT member FROM outbox.ring WHERE is_current") == [(1,)]
    extend(expected, enqueue(old, "orders", [(f"k{i % 6}", f'{{"seq": {90 + i}}}') for i in range(30)]))
    assert old.value("SELECT outbox.retry(%s)", (retried,)) == 1
    assert old.value("SELECT count(*) FROM outbox.events_0") == 93 and \
        old.value("SELECT count(*) FROM outbox.events_1") == 30
    old_cursor = old.sql("SELECT order_lsn::text, system_identifier FROM outbox.cursors")
    # pg_dump writes each member in (order_lsn, id) order (its COPY (SELECT ... FROM member <filter>)),
    # events_0 too (registered again after its rename): the restore's stamps keep that order.
    assert old.sql("SELECT c::regclass::text FROM pg_extension e, unnest(e.extconfig, e.extcondition) u(c, f) "
                   "WHERE e.extname = 'outbox' AND f = 'ORDER BY order_lsn, id' ORDER BY 1") == [
        ("outbox.events_0",), ("outbox.events_1",), ("outbox.events_2",), ("outbox.events_3",)]
    dump = tmp_path / "shop.dump"
    subprocess.run(["pg_dump", "-h", old.tmp, "-p", str(old.port), "-U", "postgres", "-Fc", "-f", str(dump), "shop"],
                   check=True)

    if into == "another cluster":
        new = make_relay(mock_cluster.bootstrap, workers=0, database="shop", create_extension=False,
                         on_failed_event="skip")
        new.sql('CREATE DATABASE "shop"', dbname="postgres")
        assert sysid(new) != sysid(old)
    else:
        new = old
        new.sql('DROP DATABASE "shop"', dbname="postgres")
        new.sql('CREATE DATABASE "shop"', dbname="postgres")
        new.set(kafka_properties="", allowed_topics="")
    new.sql(f"CREATE EXTENSION outbox VERSION '{version}'")
    subprocess.run(["pg_restore", "-h", new.tmp, "-p", str(new.port), "-U", "postgres", "-d", "shop",
                    "--exit-on-error", str(dump)], check=True)
    assert new.sql("SELECT order_lsn::text, system_identifier FROM outbox.cursors") == old_cursor
    assert new.sql("SELECT member, is_current FROM outbox.ring WHERE is_current") == [(0, True)]  # the script's

    new.set(workers=1)
    new.restart()  # the launcher would start the worker of a database it found with 0 workers a minute later
    new.wait_workers_running(1)
    wait_until(lambda: published(new) == 121, 60, "the pending events published")
    # Enqueued after the re-base: into the current member the re-base derived, after the rest.
    extend(expected, enqueue(new, "orders", [(f"k{i % 6}", f'{{"seq": {120 + i}}}') for i in range(12)]))
    wait_until(lambda: published(new) == 133, 60, "the later events published")
    records = read_topic(mock_cluster.bootstrap, "orders", 132, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0, check
    billing = read_topic(mock_cluster.bootstrap, "billing", 1, settle=True)
    assert [r.event_id for r in billing] == [retried]
    # The failed ones stay failed; nothing else is left in event_state; each event shown once.
    assert sorted(new.sql("SELECT event_id::text FROM outbox.failed")) == sorted([(stays_failed,), (quarantined,)])
    assert new.value("SELECT count(*) FROM outbox.event_state") == 2
    assert new.sql("SELECT count(*), count(DISTINCT event_id) FROM outbox.events") == [(135, 135)]
    assert new.value("SELECT count(*) FROM outbox.events_1") == 42
    # The cursor is this system's, below the insert position and at or above ring_start.
    assert new.value("SELECT bool_and(system_identifier = (SELECT system_identifier FROM pg_control_system()) "
                     "AND order_lsn <= pg_current_wal_insert_lsn() "
                     "AND order_lsn >= (SELECT order_lsn FROM outbox.ring_start)) FROM outbox.cursors")
    # The ring from the restored rows: events_0 sealed, events_1 current, the others free.
    assert new.sql("SELECT member, is_current, sealed_at IS NOT NULL, overdue, kept_because FROM outbox.ring_status") \
        == [(0, False, True, False, None), (1, True, False, False, None),
            (2, False, False, False, None), (3, False, False, False, None)]
    log = new.log()
    assert log.count(REBASED) == 1
    assert ("made on another system identifier" if into == "another cluster" else "below outbox.ring_start") in log
    # events_0's 30 pending and events_1's 30 (the retried one was in event_state already).
    assert "60 event(s) neither published nor in outbox.event_state copied into it as pending, 3 kept there" in log
    # With the window 0 the retention empties events_0 now that the cursor passed it (a round
    # skips a member a claim holds at that moment: the next one empties it).
    wait_until(lambda: new.sql("SELECT outbox.purge(interval '0')") and
               new.value("SELECT count(*) FROM outbox.events_0") == 0, 60, "events_0 emptied")


def test_a_cursor_of_another_system_identifier_with_its_rows_unchanged_resends_nothing(mock_cluster, ring_relay):
    """pg_upgrade gives a new system identifier and keeps the member rows' stamps: a superuser
    writes another one into the cursor rows of two slots while the relay runs. The re-base waits
    for a writer open in a member (warned about; nothing is claimed meanwhile), then sends what
    was not published, once, in per-key order, and nothing published again."""
    pg = ring_relay(workers=2, batch_size=20)
    expected = enqueue(pg, "orders", rows_for(100, 10))
    pg.wait_published(100)
    with pg.connect(autocommit=False) as open_writer:
        held = {f"t{i}": [open_writer.execute("SELECT outbox.enqueue('orders', %s, '{}'::jsonb)::text",
                                              (f"t{i}",)).fetchone()[0]] for i in range(3)}
        pg.sql("UPDATE outbox.cursors SET system_identifier = system_identifier + 1")
        wait_until(lambda: "their re-base waits for a lock" in pg.log(), 60, "the re-base waiting for the writer")
        extend(expected, enqueue(pg, "orders", [(f"k{i % 10}", f'{{"seq": {100 + i}}}') for i in range(100)]))
        assert published(pg) == 100  # nothing claimed from a cursor that says nothing
        open_writer.commit()
    extend(expected, held)
    wait_until(lambda: published(pg) == 203, 60, "every event published")
    records = read_topic(mock_cluster.bootstrap, "orders", 203, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0, check
    assert pg.value("SELECT bool_and(system_identifier = (SELECT system_identifier FROM pg_control_system())) "
                    "FROM outbox.cursors")
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0
    log = pg.log()
    assert log.count(REBASED) == 1
    assert "re-based 2 relay cursor row(s) (made on another system identifier): 103 event(s)" in log


def test_a_cursor_above_the_wal_insert_position_is_re_based(mock_cluster, ring_relay):
    """pg_resetwal, or a cursor written by hand: above the insert position it would pass nothing
    until the WAL got there, and every event would wait."""
    pg = ring_relay(batch_size=20)
    expected = enqueue(pg, "orders", rows_for(50, 5))
    pg.wait_published(50)
    pg.sql("UPDATE outbox.cursors SET order_lsn = 'FFFFFFFF/FFFFFFFF'")
    extend(expected, enqueue(pg, "orders", [(f"k{i % 5}", f'{{"seq": {50 + i}}}') for i in range(50)]))
    wait_until(lambda: published(pg) == 100, 60, "the later events published")
    records = read_topic(mock_cluster.bootstrap, "orders", 100, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0, check
    assert pg.value("SELECT bool_and(order_lsn <= pg_current_wal_insert_lsn()) FROM outbox.cursors")
    assert "re-based 1 relay cursor row(s) (above the WAL insert position)" in pg.log()
    assert pg.value("SELECT count(*) FROM outbox.ring_status WHERE kept_because LIKE '%above the WAL%'") == 0


def test_a_relay_role_without_execute_on_the_re_base_is_refused(mock_cluster, ring_relay):
    """The claim calls outbox.ring_rebase() when it finds a cursor of another system: without
    EXECUTE on it the relay says so (misconfigured) instead of failing at the first restore."""
    pg = ring_relay()
    assert pg.value("SELECT has_function_privilege('public', 'outbox.ring_rebase()', 'EXECUTE')") is False
    pg.sql("REVOKE EXECUTE ON FUNCTION outbox.ring_rebase() FROM outbox_relay")
    wait_until(lambda: [w for w in pg.workers() if w[2] == "misconfigured" and "outbox.ring_rebase()" in (w[5] or "")],
               60, "the relay refusing without EXECUTE on outbox.ring_rebase()")
    pg.sql("GRANT EXECUTE ON FUNCTION outbox.ring_rebase() TO outbox_relay")
    enqueue(pg, "orders", rows_for(10, 2))
    pg.wait_published(10)
