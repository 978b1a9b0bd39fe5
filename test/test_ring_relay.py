"""The relay on schema 0.4.0's ring (the insert-only queue's preview, DESIGN.md "The insert-only
queue", build step 3) against librdkafka's mock cluster: events enqueued into the generation
tables are published once each in per-key commit order, the slot's cursor advances, landed rows
say where each event went and outbox.events shows it; poison, quarantined, retried and deferred
events go through outbox.event_state; block_key holds a key; an open or prepared writer holds
no claim back (it becomes a hole, walked once at its commit, in chunks, across a SIGKILL, dropped
when it aborts); a SIGKILL loses nothing; two workers keep per-key order; and an
ALTER EXTENSION UPDATE TO '0.4.0' under a running 0.3.0 relay loses and re-sends nothing."""

import datetime
import os
import signal

import psycopg
import pytest
import yaml

from harness.kafka_reader import check_delivery, read_topic
from harness.wait import wait_until
from test_relay import enqueue, rows_for
from test_safety import lane_of

INVALID_RECORD = 87  # permanent: the record batch is refused


@pytest.fixture
def ring_relay(mock_cluster, make_relay):
    """make(**settings) -> a cluster whose relay runs on CREATE EXTENSION outbox VERSION '0.4.0'."""
    def make(workers=1, server=None, **settings):
        pg = make_relay(mock_cluster.bootstrap, workers=workers, create_extension=False, server=server, **settings)
        pg.sql("CREATE EXTENSION outbox VERSION '0.4.0'")
        assert pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'") == "0.4.0"
        pg.wait_workers_running(workers)
        return pg
    return make


def insert_past_the_row_rules(pg, event_id, topic, key):
    """A member row with headers that are not an object, as a superuser can write one: the member's
    stamp trigger holds every INSERT to the row rules, so the row goes in as it should and, in the
    same transaction (nothing of it visible before), the guard is disabled for an UPDATE."""
    with pg.connect(autocommit=False) as c:  # one transaction, committed at the end
        c.execute("INSERT INTO outbox.events (event_id, topic, key, lane, payload) VALUES (%s, %s, %s, %s, 'x')",
                  (event_id, topic, key, lane_of(key, event_id)))
        c.execute('ALTER TABLE outbox.events_0 DISABLE TRIGGER "~outbox_guard"')
        c.execute("UPDATE outbox.events_0 SET headers = '[1]' WHERE event_id = %s", (event_id,))
        c.execute('ALTER TABLE outbox.events_0 ENABLE ALWAYS TRIGGER "~outbox_guard"')


def published(pg):
    return pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'")


def landed(pg):
    """{event id: (kafka_partition, offset)} from outbox.landed (ids[k] at first_offset + k - 1)."""
    rows = pg.sql("SELECT e.event_id::text, l.kafka_partition, l.first_offset + u.k - 1 "
                  "FROM outbox.landed l, unnest(l.ids) WITH ORDINALITY u(id, k), outbox.events e "
                  "WHERE e.id = u.id")
    out = {}
    for event_id, partition, offset in rows:
        assert event_id not in out, f"{event_id} landed twice"
        out[event_id] = (partition, offset)
    return out


def claims(pg):
    return pg.value("SELECT sum(claim_seconds_count) FROM outbox.worker_metrics")


def test_publishes_once_in_per_key_order_records_landed_and_moves_the_cursor(mock_cluster, ring_relay):
    pg = ring_relay(batch_size=50)
    start = pg.value("SELECT order_lsn FROM outbox.ring_start")
    expected = enqueue(pg, "orders", rows_for(300, 30))
    pg.wait_published(300)
    records = read_topic(mock_cluster.bootstrap, "orders", 300, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0
    # Every event's landed row names where the broker put it, and the view shows the same.
    where = landed(pg)
    assert where == {r.event_id: (r.partition, r.offset) for r in records}
    view = pg.sql("SELECT event_id::text, kafka_partition, kafka_offset, published_at IS NOT NULL, attempts "
                  "FROM outbox.events")
    assert {e: (p, o) for e, p, o, _, _ in view} == where
    assert all(has_time and attempts == 0 for _, _, _, has_time, attempts in view)
    # The rows were only inserted: no member row was written after its insert.
    assert pg.value("SELECT n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE relname = 'events_0'") == 0
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0
    cursor = pg.sql("SELECT n_workers, worker, order_lsn > %s::pg_lsn, system_identifier = "
                    "(SELECT system_identifier FROM pg_control_system()) FROM outbox.cursors", (start,))
    assert cursor == [(1, 0, True, True)]
    assert pg.value("SELECT order_lsn >= (SELECT max(order_lsn) FROM outbox.events_0) FROM outbox.cursors")
    w = pg.workers()[0]
    assert w[2] == "idle" and w[3] == 300 and w[4] == 0


def poison_setup(ring_relay, policy):
    # The producer refuses events over 2000 bytes, the table accepts them: a poison event.
    pg = ring_relay(max_attempts=3, on_failed_event=policy, kafka_properties="message.max.bytes=2000",
                    max_payload_bytes="1MB", backoff_base="50ms", backoff_max="200ms")
    with pg.connect(autocommit=False) as c:
        poison = c.execute("SELECT outbox.enqueue('billing', 'bad-key', %s)::text", ("x" * 5000,)).fetchone()[0]
        c.commit()
        after = [c.execute("SELECT outbox.enqueue('billing', 'bad-key', %s)::text", (f"after {i}",)).fetchone()[0]
                 for i in range(2)]
        others = [c.execute("SELECT outbox.enqueue('billing', %s, 'fine')::text", (f"good-{i}",)).fetchone()[0]
                  for i in range(20)]
        c.commit()
    return pg, poison, after, others


def test_poison_event_fails_blocks_its_key_and_goes_after_retry(mock_cluster, ring_relay):
    pg, poison, after, others = poison_setup(ring_relay, "block_key")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "poison event in outbox.failed")
    pg.wait_published(20)
    row = pg.sql("SELECT event_id::text, key, attempts, last_error FROM outbox.failed")[0]
    assert row[0] == poison and row[1] == "bad-key" and row[2] == 3
    assert "MSG_SIZE_TOO_LARGE" in row[3]
    # The key's later events wait behind it in event_state; nothing else did.
    assert pg.sql("SELECT status, count(*) FROM outbox.events WHERE key = 'bad-key' GROUP BY 1 ORDER BY 1") == \
        [("failed", 1), ("pending", 2)]
    assert pg.value("SELECT count(*) FROM outbox.event_state WHERE status = 'pending'") == 2
    assert pg.workers()[0][4] == 1  # failed counter
    assert pg.log().count(f"event {poison} (topic billing) moved to failed after 3 attempts") == 1
    # The broker takes large events now; outbox.retry() sends the poison event, then the others.
    pg.set(kafka_properties="message.max.bytes=1000000")
    assert pg.value("SELECT outbox.retry(%s)", (poison,)) == 1
    pg.wait_published(23)
    records = read_topic(mock_cluster.bootstrap, "billing", 23, settle=True)
    assert [r.event_id for r in records if r.key == b"bad-key"] == [poison, *after]
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0
    assert set(landed(pg)) == {r.event_id for r in records}


def test_runbook_give_up_a_poison_event(mock_cluster, ring_relay):
    """README's runbook step 4 verbatim on 0.4.0: the key's later events go, in order, and the
    poison event never; a DELETE of a pending or a published event is refused."""
    pg, poison, after, others = poison_setup(ring_relay, "block_key")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "poison event in outbox.failed")
    pg.wait_published(20)
    for event_id in (after[0], others[0]):
        with pytest.raises(psycopg.Error) as refused:
            pg.sql("DELETE FROM outbox.events WHERE event_id = %s", (event_id,))
        assert refused.value.sqlstate == "55000"
    with pg.connect() as c:
        cur = c.execute(f"DELETE FROM outbox.events WHERE event_id = '{poison}' AND status = 'failed';")
        assert cur.rowcount == 1
    pg.wait_published(22)
    records = read_topic(mock_cluster.bootstrap, "billing", 22, settle=True)
    assert [r.event_id for r in records if r.key == b"bad-key"] == after
    assert poison not in {r.event_id for r in records}
    assert pg.sql("SELECT * FROM outbox.failed") == []
    assert pg.value("SELECT count(*) FROM outbox.events WHERE event_id = %s", (poison,)) == 0
    assert pg.sql("SELECT event_id::text, status FROM outbox.event_state") == [(poison, "discarded")]
    # Later events of the key go at once, and the poison event is never sent (a later batch
    # of the key, and the retention).
    later = pg.value("SELECT outbox.enqueue('billing', 'bad-key', 'later')::text")
    pg.wait_published(23)
    records = read_topic(mock_cluster.bootstrap, "billing", 23, settle=True)
    assert [r.event_id for r in records if r.key == b"bad-key"] == [*after, later]


def test_runbook_correct_a_poison_event_and_retry(mock_cluster, ring_relay):
    """README's runbook steps 2 and 3 on 0.4.0: the failed event's payload made smaller through
    the view, then retried: the corrected event is published, then the key's later events."""
    pg, poison, after, others = poison_setup(ring_relay, "block_key")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "poison event in outbox.failed")
    pg.wait_published(20)
    with pytest.raises(psycopg.Error) as refused:  # the key would move it to another lane
        pg.sql("UPDATE outbox.events SET key = 'other' WHERE event_id = %s", (poison,))
    assert refused.value.sqlstate == "55000"
    with pg.connect() as c:
        # README's runbook, step 2, verbatim but for the values.
        assert c.execute("UPDATE outbox.events SET payload = 'corrected' WHERE event_id = %s AND status = 'failed'",
                         (poison,)).rowcount == 1
        assert c.execute("SELECT outbox.retry(%s)", (poison,)).fetchone() == (1,)
    pg.wait_published(23)
    records = read_topic(mock_cluster.bootstrap, "billing", 23, settle=True)
    assert [(r.event_id, r.value) for r in records if r.key == b"bad-key"] == [
        (poison, b"corrected"), (after[0], b"after 0"), (after[1], b"after 1")]
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0
    assert pg.value("SELECT convert_from(payload, 'UTF8') FROM outbox.events WHERE event_id = %s",
                    (poison,)) == "x" * 5000  # published: the member's row, never written


@pytest.mark.parametrize("policy", ["block_key", "skip"])
def test_a_given_up_event_is_not_sent_by_a_walk_again(mock_cluster, ring_relay, policy):
    """A walk of rows the slot passed already (as a new worker count's slots walk again, the
    re-base not being built; here the cursor is set back by hand) sends the published events
    again, but not the keyed event given up, under either policy: its own event_state row holds
    it (and holds nothing else)."""
    pg, poison, after, others = poison_setup(ring_relay, policy)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "poison event in outbox.failed")
    pg.wait_published(20)
    pg.sql("DELETE FROM outbox.events WHERE event_id = %s AND status = 'failed'", (poison,))
    pg.wait_published(22)
    end = pg.value("SELECT max(order_lsn)::text FROM outbox.events_0")
    pg.set(kafka_properties="message.max.bytes=1000000")  # it could be sent now
    pg.sql("UPDATE outbox.cursors SET order_lsn = (SELECT order_lsn FROM outbox.ring_start), id = 0")
    wait_until(lambda: pg.value("SELECT bool_and(order_lsn >= %s::pg_lsn) FROM outbox.cursors", (end,)), 60,
               "the cursor past every row again")
    records = read_topic(mock_cluster.bootstrap, "billing", 44, settle=True)
    assert len(records) == 44  # every published event twice
    assert poison not in {r.event_id for r in records}
    assert pg.sql("SELECT event_id::text, status FROM outbox.event_state") == [(poison, "discarded")]


def test_skip_policy_lets_the_key_go_on(mock_cluster, ring_relay):
    pg, poison, after, others = poison_setup(ring_relay, "skip")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "poison event in outbox.failed")
    pg.wait_published(22)
    records = read_topic(mock_cluster.bootstrap, "billing", 22, settle=True)
    assert [r.event_id for r in records if r.key == b"bad-key"] == after


def test_row_that_cannot_be_published_is_quarantined_and_blocks_its_key(mock_cluster, ring_relay):
    pg = ring_relay()
    # A row past the member's row rules: headers that are not an object.
    event_id = "6f1c34d2-3f5b-4a39-9c55-0d3f4c0a9e01"
    insert_past_the_row_rules(pg, event_id, "billing", "q")
    later = pg.value("SELECT outbox.enqueue('billing', 'q', 'later')::text")
    fine = pg.value("SELECT outbox.enqueue('billing', 'other', 'fine')::text")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "quarantined")
    pg.wait_published(1)
    assert pg.value("SELECT last_error FROM outbox.failed WHERE event_id = %s", (event_id,)) == \
        "quarantined: the headers are not a JSON object"
    assert pg.value("SELECT attempts FROM outbox.failed") == 0
    assert pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (later,)) == "pending"
    assert pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (fine,)) == "published"
    # Retried as it is, it is quarantined again, and its key still waits.
    assert pg.value("SELECT outbox.retry(%s)", (event_id,)) == 1
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "quarantined again")
    assert pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (later,)) == "pending"
    assert pg.log().count(f"event {event_id} (topic billing) moved to failed") == 2


def test_refused_then_accepted_event_is_retried_and_published(mock_cluster, ring_relay):
    pg = ring_relay(max_attempts=5, backoff_base="50ms", backoff_max="200ms")
    pg.sql("SELECT outbox.enqueue('billing', 'warm', 'up')")
    pg.wait_published(1)
    mock_cluster.produce_errors(1, INVALID_RECORD)
    eid = pg.value("SELECT outbox.enqueue('billing', 'r', 'refused once')::text")
    pg.wait_published(2)
    assert pg.sql("SELECT status, attempts FROM outbox.events WHERE event_id = %s", (eid,)) == [("published", 0)]
    assert "failed to validate record" in pg.log()  # the first attempt was refused
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0
    records = read_topic(mock_cluster.bootstrap, "billing", 2, settle=True)
    assert eid in {r.event_id for r in records}


def holes(pg):
    """The slot's holes: {xid: walked id} (worker 0 of 1)."""
    rows = pg.sql("SELECT u.x::text, u.w FROM outbox.cursors c, unnest(c.hole_xids, c.hole_walked_ids) u(x, w) "
                  "WHERE c.n_workers = 1 AND c.worker = 0")
    return dict(rows)


def enqueue_in(conn, topic, key, payload):
    return conn.execute("SELECT outbox.enqueue(%s, %s, %s)::text", (topic, key, payload)).fetchone()[0]


def test_an_open_writer_holds_back_no_later_commit_and_is_published_once_in_key_order(mock_cluster, ring_relay):
    """An open writer the cursor passes becomes a hole: events committed after it are published
    while it is open; at its commit its rows below the cursor are walked, once, before later rows
    of their key (and a row of a key contended meanwhile goes after the other commit: Commit order)."""
    pg = ring_relay()
    pg.sql("SELECT outbox.enqueue('billing', 'before', 'x')")
    pg.wait_published(1)
    with pg.connect(autocommit=False) as open_writer:
        first = enqueue_in(open_writer, "billing", "walked", "first")
        contended = enqueue_in(open_writer, "billing", "contended", "B")
        xid = open_writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        behind = pg.value("SELECT outbox.enqueue('billing', 'behind', 'committed')::text")
        a = pg.value("SELECT outbox.enqueue('billing', 'contended', 'A')::text")
        pg.wait_published(3)  # the old claim stopped at the writer's first stamp: nothing more
        wait_until(lambda: xid in holes(pg), 60, "the open writer a hole of the slot")
        assert pg.sql("SELECT count(*) FROM outbox.events WHERE status = 'published' AND event_id = ANY(%s::uuid[])",
                      ([first, contended],)) == [(0,)]
        open_writer.commit()
    second = pg.value("SELECT outbox.enqueue('billing', 'walked', 'second')::text")
    c = pg.value("SELECT outbox.enqueue('billing', 'contended', 'C')::text")
    pg.wait_published(7)
    wait_until(lambda: holes(pg) == {}, 60, "the hole walked and dropped")
    records = read_topic(mock_cluster.bootstrap, "billing", 7, settle=True)
    check = check_delivery(records, {"walked": [first, second], "contended": [a, contended, c], "behind": [behind]})
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0
    assert set(landed(pg)) == {r.event_id for r in records}
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0


def test_an_aborted_open_writers_hole_is_dropped_and_nothing_of_it_published(mock_cluster, ring_relay):
    pg = ring_relay()
    with pg.connect(autocommit=False) as open_writer:
        doomed = [enqueue_in(open_writer, "billing", f"d{i}", "doomed") for i in range(3)]
        xid = open_writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        after = pg.value("SELECT outbox.enqueue('billing', 'after', 'x')::text")
        pg.wait_published(1)
        wait_until(lambda: xid in holes(pg), 60, "the open writer a hole")
        open_writer.rollback()
    wait_until(lambda: holes(pg) == {}, 60, "the aborted writer's hole dropped")
    later = pg.value("SELECT outbox.enqueue('billing', 'after', 'later')::text")
    pg.wait_published(2)
    records = read_topic(mock_cluster.bootstrap, "billing", 2, settle=True)
    assert sorted(r.event_id for r in records) == sorted([after, later])
    assert not set(doomed) & set(landed(pg))
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0


def test_a_prepared_writer_is_a_hole_until_commit_prepared(mock_cluster, ring_relay):
    pg = ring_relay(server={"max_prepared_transactions": "4"})
    with pg.connect(autocommit=False) as writer:
        prepared = [enqueue_in(writer, "billing", "pk", f"p{i}") for i in range(3)]
        xid = writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        writer.execute("PREPARE TRANSACTION 'hole-gid'")
        writer.commit()
    try:
        after = pg.value("SELECT outbox.enqueue('billing', 'after', 'x')::text")
        pg.wait_published(1)
        wait_until(lambda: xid in holes(pg), 60, "the prepared writer a hole")
        assert published(pg) == 1
    finally:
        pg.sql("COMMIT PREPARED 'hole-gid'")
    later = pg.value("SELECT outbox.enqueue('billing', 'pk', 'later')::text")
    pg.wait_published(5)
    wait_until(lambda: holes(pg) == {}, 60, "the hole walked and dropped")
    records = read_topic(mock_cluster.bootstrap, "billing", 5, settle=True)
    check = check_delivery(records, {"pk": prepared + [later], "after": [after]})
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0


def test_a_hole_larger_than_a_batch_is_walked_in_chunks_in_key_order(mock_cluster, ring_relay):
    pg = ring_relay(batch_size=10)
    expected = {}
    with pg.connect(autocommit=False) as open_writer:
        for i in range(45):
            expected.setdefault(f"k{i % 5}", []).append(enqueue_in(open_writer, "orders", f"k{i % 5}", f"hole {i}"))
        xid = open_writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        after = pg.value("SELECT outbox.enqueue('orders', 'after', 'x')::text")
        pg.wait_published(1)
        wait_until(lambda: xid in holes(pg), 60, "the open writer a hole")
        open_writer.commit()
    more = enqueue(pg, "orders", [(f"k{i % 5}", f'{{"seq": {i}}}') for i in range(20)])
    for key, ids in more.items():
        expected[key].extend(ids)
    expected["after"] = [after]
    pg.wait_published(66)
    wait_until(lambda: holes(pg) == {}, 60, "the hole walked and dropped")
    records = read_topic(mock_cluster.bootstrap, "orders", 66, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0
    # 45 rows in batches of at most 10: the walk kept its progress in the cursor row between them.
    assert pg.value("SELECT max(cardinality(ids)) FROM outbox.landed") <= 10


def test_a_hole_below_a_long_range_of_other_rows_is_walked_window_by_window(mock_cluster, ring_relay):
    """A claim's walk of a committed hole reads at most 50 * batch_size member rows (100 here) past
    where it stands, and moves on by as much even when it finds none of the hole's rows: the
    writer's rows, spread over 300 rows of others, are published once, in key order."""
    pg = ring_relay(batch_size=2, poll_interval="100ms")
    with pg.connect(autocommit=False) as open_writer:
        mine = [enqueue_in(open_writer, "orders", "w", "w1")]
        xid = open_writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        others = enqueue(pg, "orders", rows_for(150, 5), per_transaction=50)
        mine += [enqueue_in(open_writer, "orders", "w", f"w{i}") for i in (2, 3)]
        more = enqueue(pg, "orders", [(f"k{i % 5}", f'{{"seq": {150 + i}}}') for i in range(150)], per_transaction=50)
        for key, ids in more.items():
            others[key].extend(ids)
        pg.wait_published(300, timeout=120)
        wait_until(lambda: xid in holes(pg), 60, "the open writer a hole")
        open_writer.commit()
    mine.append(pg.value("SELECT outbox.enqueue('orders', 'w', 'later')::text"))
    pg.wait_published(304, timeout=120)
    wait_until(lambda: holes(pg) == {}, 60, "the hole walked and dropped")
    records = read_topic(mock_cluster.bootstrap, "orders", 304, settle=True)
    check = check_delivery(records, {**others, "w": mine})
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0


def test_an_outage_during_a_holes_walk_keeps_the_hole_and_writes_nothing_per_event(mock_cluster, ring_relay):
    """A hole's rows whose outcome is unknown (the brokers are down) stop its walk before them:
    the hole stays, no event_state row is written; after the outage they go once, in order."""
    pg = ring_relay(max_attempts=2, backoff_base="50ms", backoff_max="200ms", publish_timeout="1s",
                    kafka_properties="socket.connection.setup.timeout.ms=1000;reconnect.backoff.max.ms=200")
    with pg.connect(autocommit=False) as open_writer:
        mine = {}
        for i in range(20):
            mine.setdefault(f"h{i % 4}", []).append(enqueue_in(open_writer, "billing", f"h{i % 4}", f"hole {i}"))
        xid = open_writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        after = pg.value("SELECT outbox.enqueue('billing', 'after', 'x')::text")
        pg.wait_published(1)
        wait_until(lambda: xid in holes(pg), 60, "the open writer a hole")
        for b in (1, 2, 3):
            mock_cluster.down(b)
        seen = pg.log().count("Kafka unavailable")
        open_writer.commit()
    wait_until(lambda: pg.log().count("Kafka unavailable") >= seen + 2, 60, "failed publish rounds of the hole's rows")
    assert xid in holes(pg)
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0
    for b in (1, 2, 3):
        mock_cluster.up(b)
    pg.wait_published(21, timeout=120)
    wait_until(lambda: holes(pg) == {}, 60, "the hole walked and dropped")
    assert pg.value("SELECT max(attempts) FROM outbox.events") == 0
    records = read_topic(mock_cluster.bootstrap, "billing", 21, settle=True)
    check = check_delivery(records, {**mine, "after": [after]})
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0


def test_a_hole_survives_a_sigkill_of_the_worker(mock_cluster, ring_relay):
    """The crash restart that a SIGKILL of a backend causes ends every session: a plain open
    writer dies with it (never marked aborted: its hole is dropped), a prepared one stays open
    and stays a hole (in the committed cursor row); after COMMIT PREPARED its rows go, once."""
    pg = ring_relay(server={"max_prepared_transactions": "4"})
    with pg.connect(autocommit=False) as writer:
        prepared = [enqueue_in(writer, "billing", "pk", f"p{i}") for i in range(3)]
        prepared_xid = writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        writer.execute("PREPARE TRANSACTION 'kill-gid'")
        writer.commit()
    try:
        doomed_writer = pg.connect(autocommit=False)
        doomed = enqueue_in(doomed_writer, "billing", "dk", "doomed")
        doomed_xid = doomed_writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        after = pg.value("SELECT outbox.enqueue('billing', 'after', 'x')::text")
        pg.wait_published(1)
        wait_until(lambda: {prepared_xid, doomed_xid} <= set(holes(pg)), 60, "both writers holes")
        killed = pg.kill_worker(0)
        wait_until(lambda: killed not in pg.worker_pids() and all(pg.worker_pids()), 60, "cluster and relay back")
        try:
            doomed_writer.close()
        except psycopg.Error:
            pass
        wait_until(lambda: set(holes(pg)) == {prepared_xid}, 60, "the dead writer's hole dropped, the prepared kept")
        assert published(pg) == 1
    finally:
        pg.sql("COMMIT PREPARED 'kill-gid'")
    later = pg.value("SELECT outbox.enqueue('billing', 'pk', 'later')::text")
    pg.wait_published(5)
    wait_until(lambda: holes(pg) == {}, 60, "the hole walked and dropped")
    records = read_topic(mock_cluster.bootstrap, "billing", 5, settle=True)
    check = check_delivery(records, {"pk": prepared + [later], "after": [after]})
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0
    assert doomed not in {r.event_id for r in records}
    assert len(landed(pg)) == 5


def test_a_change_of_the_worker_count_keeps_the_open_writers_holes(mock_cluster, ring_relay):
    """The new count's slots start at the lowest old cursor with the old slots' holes: an open
    writer the old slot passed is published after its commit (once or more, never lost)."""
    pg = ring_relay(batch_size=20)
    with pg.connect(autocommit=False) as open_writer:
        held = {f"h{i}": [enqueue_in(open_writer, "orders", f"h{i}", "held")] for i in range(6)}
        xid = open_writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        after = enqueue(pg, "orders", rows_for(20, 4))
        pg.wait_published(20)
        wait_until(lambda: xid in holes(pg), 60, "the open writer a hole of slot 0 of 1")
        pg.set(workers=2)
        wait_until(lambda: pg.value("SELECT count(*) FROM outbox.cursors c WHERE c.n_workers = 2 "
                                    "AND %s::xid8 = ANY (c.hole_xids)", (xid,)) == 2, 60,
                   "both new slots with the hole")
        open_writer.commit()
    pg.wait_published(26)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.cursors WHERE n_workers = 2 "
                                "AND cardinality(hole_xids) = 0") == 2, 60, "the holes walked")
    records = read_topic(mock_cluster.bootstrap, "orders", 26, settle=True)
    check = check_delivery(records, {**after, **held})
    assert check.lost == [] and check.order_violations == [] and check.unique == 26


def test_sigkill_mid_run_loses_nothing_and_keeps_order(mock_cluster, ring_relay):
    pg = ring_relay(batch_size=20)
    first = enqueue(pg, "orders", rows_for(400, 40))
    wait_until(lambda: published(pg) >= 40, 60, "some published")
    killed = pg.kill_worker(0)
    wait_until(lambda: killed not in pg.worker_pids() and all(pg.worker_pids()), 60, "cluster and relay back")
    second = enqueue(pg, "orders", [(f"k{i % 40}", f'{{"seq": {400 + i}}}') for i in range(200)])
    for key, ids in second.items():
        first.setdefault(key, []).extend(ids)
    pg.wait_published(600, timeout=120)
    records = read_topic(mock_cluster.bootstrap, "orders", 600, settle=True)
    check = check_delivery(records, first)
    assert check.lost == [] and check.order_violations == [] and check.unique == 600


def test_two_workers_keep_per_key_order(mock_cluster, ring_relay):
    pg = ring_relay(workers=2, batch_size=30)
    expected = enqueue(pg, "orders", rows_for(400, 20))
    pg.wait_published(400)
    records = read_topic(mock_cluster.bootstrap, "orders", 400, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0
    assert sorted(pg.sql("SELECT n_workers, worker FROM outbox.cursors")) == [(2, 0), (2, 1)]
    assert all(w[3] > 0 for w in pg.workers())


@pytest.mark.schema("0.3.0")
def test_update_to_the_ring_under_a_running_relay(mock_cluster, make_relay):
    """0.3.0 with published, failed and pending events, the relay running: ALTER EXTENSION UPDATE
    TO '0.4.0'. Every pending event is published once (after the update too), the failed one stays
    failed until retried, the published ones are not sent again."""
    pg = make_relay(mock_cluster.bootstrap, max_attempts=1, publish_timeout="1s", max_payload_bytes="1MB",
                    backoff_base="50ms", backoff_max="200ms",
                    kafka_properties="message.max.bytes=2000;socket.connection.setup.timeout.ms=1000;"
                                     "reconnect.backoff.max.ms=200")
    pg.wait_workers_running(1)
    early = enqueue(pg, "orders", rows_for(50, 5))
    pg.wait_published(50)
    poison = pg.value("SELECT outbox.enqueue('billing', 'bad', %s)::text", ("x" * 5000,))
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status = 'failed'") == 1, 60, "failed")
    # Pending rows at the update: the brokers are down, the relay backs off (no attempt used).
    for b in (1, 2, 3):
        mock_cluster.down(b)
    pending = enqueue(pg, "orders", [(f"k{i % 5}", f'{{"seq": {50 + i}}}') for i in range(50)])
    wait_until(lambda: pg.workers()[0][2] == "backing off", 60, "relay backing off")
    pg.sql("ALTER EXTENSION outbox UPDATE TO '0.4.0'")
    assert pg.value("SELECT count(*) FROM outbox.event_state WHERE status = 'pending'") == 50
    for b in (1, 2, 3):
        mock_cluster.up(b)
    later = enqueue(pg, "orders", [(f"k{i % 5}", f'{{"seq": {100 + i}}}') for i in range(50)])
    expected = {k: early[k] + pending[k] + later[k] for k in early}
    pg.wait_published(150, timeout=120)
    records = read_topic(mock_cluster.bootstrap, "orders", 150, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0
    assert pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (poison,)) == "failed"
    assert pg.value("SELECT count(*) FROM outbox.failed") == 1
    assert pg.value("SELECT count(*) FROM outbox.cursors") == 1
    assert pg.workers()[0][2] == "idle"


def test_outage_stops_the_cursor_writes_nothing_per_event_and_loses_nothing(mock_cluster, ring_relay):
    """Broker-wide trouble: the events' outcome is unknown, so the cursor stays before them and no
    event_state row is written for them (no attempt used); after the outage they go in order."""
    pg = ring_relay(max_attempts=2, backoff_base="50ms", backoff_max="200ms", publish_timeout="1s",
                    kafka_properties="socket.connection.setup.timeout.ms=1000;reconnect.backoff.max.ms=200")
    pg.sql("SELECT outbox.enqueue('billing', 'warmup', 'x')")
    pg.wait_published(1)
    cursor = pg.value("SELECT order_lsn FROM outbox.cursors")
    for b in (1, 2, 3):
        mock_cluster.down(b)
    expected = enqueue(pg, "billing", rows_for(100, 10))
    wait_until(lambda: pg.log().count("Kafka unavailable") >= 2, 60, "failed publish rounds")
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0
    assert pg.value("SELECT order_lsn FROM outbox.cursors") == cursor
    for b in (1, 2, 3):
        mock_cluster.up(b)
    pg.wait_published(101, timeout=120)
    assert pg.value("SELECT count(*) FROM outbox.event_state") == 0
    assert pg.value("SELECT max(attempts) FROM outbox.events") == 0
    records = read_topic(mock_cluster.bootstrap, "billing", 101, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == []


def test_an_idle_relay_does_not_write_its_cursor_on_every_claim(mock_cluster, ring_relay):
    pg = ring_relay(poll_interval="100ms")
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'x')")
    pg.wait_published(1)
    seen = claims(pg)
    wait_until(lambda: claims(pg) >= seen + 2, 60, "two more claims")
    written = pg.value("SELECT xmin::text FROM outbox.cursors")
    seen = claims(pg)
    wait_until(lambda: claims(pg) >= seen + 10, 60, "ten idle claims")
    assert pg.value("SELECT xmin::text FROM outbox.cursors") == written


def test_a_change_of_the_worker_count_loses_nothing(mock_cluster, ring_relay):
    """The new count's slots start at the lowest cursor of the old count (the re-base that would
    avoid sending some events again is not built): duplicates may come, nothing is lost, each
    key's first deliveries stay in order."""
    pg = ring_relay(batch_size=20)
    expected = enqueue(pg, "orders", rows_for(100, 10))
    pg.wait_published(100)
    pg.set(workers=2)
    wait_until(lambda: len(pg.workers()) == 2 and all(pg.worker_pids()), 60, "two workers")
    more = enqueue(pg, "orders", [(f"k{i % 10}", f'{{"seq": {100 + i}}}') for i in range(100)])
    for key, ids in more.items():
        expected[key].extend(ids)
    pg.wait_published(200)
    records = read_topic(mock_cluster.bootstrap, "orders", 200, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == [] and check.unique == 200
    assert sorted(pg.sql("SELECT n_workers, worker FROM outbox.cursors")) == [(1, 0), (2, 0), (2, 1)]


def test_purge_empties_the_member_the_relay_passed_and_keeps_what_still_waits(mock_cluster, ring_relay):
    pg = ring_relay(batch_size=50)
    expected = enqueue(pg, "orders", rows_for(120, 12))
    pg.wait_published(120)
    # A row the relay quarantines (headers not an object, past the row rules): failed, its
    # event_state row a whole copy.
    event_id = "6f1c34d2-3f5b-4a39-9c55-0d3f4c0a9e02"
    insert_past_the_row_rules(pg, event_id, "poison", "q")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, what="the row quarantined")
    wait_until(lambda: pg.value("SELECT order_lsn >= (SELECT max(order_lsn) FROM outbox.events_0) FROM outbox.cursors"),
               what="the cursor past the quarantined row")
    # Rotate, then empty events_0 once the cursor passed it: the published events go with their
    # landed rows, the failed one stays visible through its copy.
    assert pg.value("SELECT outbox.purge(interval '0')") == 120
    assert pg.value("SELECT count(*) FROM outbox.events_0") == 0
    assert pg.value("SELECT count(*) FROM outbox.landed") == 0
    assert pg.sql("SELECT event_id::text, status FROM outbox.events") == [(event_id, "failed")]
    assert pg.sql("SELECT member, is_current, sealed_at IS NULL FROM outbox.ring ORDER BY member")[:2] == [
        (0, False, True), (1, True, True)]
    # The relay goes on in the new member.
    more = enqueue(pg, "orders", rows_for(30, 3))
    wait_until(lambda: published(pg) == 30, what="the new events published")
    assert pg.value("SELECT count(*) FROM outbox.events_1") == 30
    records = read_topic(mock_cluster.bootstrap, "orders", 150, settle=True)
    check = check_delivery(records, {**expected, **more})
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0
    # A second round: events_1 is current (not due), nothing is sealed: nothing goes.
    assert pg.value("SELECT outbox.purge(interval '1 day')") == 0
    assert pg.value("SELECT count(*) FROM outbox.events") == 31


def test_the_relays_own_retention_rotates_and_empties_the_ring(mock_cluster, ring_relay):
    pg = ring_relay(batch_size=50, retention="3s")
    expected = enqueue(pg, "orders", rows_for(60, 6))
    pg.wait_published(60)
    # Worker 0's retention seals events_0 after a third of the window and empties it once it was
    # sealed for the window and the cursor passed it.
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events_0") == 0, 60, "events_0 emptied by the relay")
    assert pg.value("SELECT count(*) FROM outbox.landed WHERE member = 0") == 0
    assert pg.value("SELECT member FROM outbox.ring WHERE is_current") != 0
    records = read_topic(mock_cluster.bootstrap, "orders", 60, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0
    assert "ERROR" not in pg.log()


def ring_metrics(pg):
    """(ring_oldest_sealed_age_seconds, ring_retention_stalls) of worker 0."""
    return tuple(pg.sql("SELECT ring_oldest_sealed_age_seconds, ring_retention_stalls FROM outbox.worker_metrics "
                        "WHERE worker = 0")[0])


def exporter_ring_query():
    """The SQL of docs/metrics/queries.yaml's outbox_worker_ring (what postgres_exporter runs)."""
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "metrics", "queries.yaml")) as f:
        return yaml.safe_load(f)["outbox_worker_ring"]["query"]


def test_a_member_held_past_the_window_is_reported_and_emptied_once_let_go(mock_cluster, ring_relay):
    window = 3
    pg = ring_relay(batch_size=50, retention=f"{window}s")
    enqueue(pg, "orders", rows_for(10, 2))
    pg.wait_published(10)
    assert ring_metrics(pg)[1] == 0
    holder = pg.connect()
    try:
        # A long transaction that read events_0 (as a long SELECT of outbox.events would) holds
        # it once it is sealed: the retention cannot take its lock. Events keep coming, so the
        # ring rotates through the free members until the next one is events_0 again.
        holder.execute("BEGIN")
        holder.execute("SELECT count(*) FROM outbox.events_0")
        holder_pid = holder.execute("SELECT pg_backend_pid()").fetchone()[0]
        reason = f"locked by pid {holder_pid}"

        def stuck():
            pg.sql("SELECT outbox.enqueue('orders', 'more', '{}'::jsonb)")
            return "outbox.events_0 was sealed longer than outbox.retention" in pg.log()

        wait_until(stuck, 120, "the retention's warning")
        kept = pg.value("SELECT count(*) FROM outbox.events_0")
        assert kept >= 10
        log = pg.log()
        assert "WARNING:  outbox relay 0: the ring's retention cannot empty outbox.events_0" in log
        assert f"is kept: {reason}." in log
        assert "HINT:  End that session's transaction" in log
        assert pg.sql("SELECT member, overdue, kept_because FROM outbox.ring_status WHERE overdue ORDER BY sealed_at "
                      "LIMIT 1") == [(0, True, reason)]
        assert wait_until(lambda: ring_metrics(pg)[1] >= 2, 60, "retention stalls counted")
        # The oldest sealed member's age keeps growing while it is held.
        stuck_age = wait_until(lambda: ring_metrics(pg)[0] >= 2 * window and ring_metrics(pg)[0], 60,
                               "the oldest sealed member's age past twice the window")
        assert pg.value("SELECT count(*) FROM outbox.events_0") == kept
        # What the exporter scrapes (outbox_worker_ring_*).
        [(database, worker, age, stalls)] = pg.sql(exporter_ring_query())
        assert (database, worker) == ("postgres", "0") and age >= 2 * window and stalls >= 2
        # Once a minute at most, though several rounds were stuck meanwhile.
        warned_at = [datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")
                     for line in pg.log().splitlines() if "the ring's retention cannot empty" in line]
        assert warned_at and all((b - a).total_seconds() >= 59 for a, b in zip(warned_at, warned_at[1:]))
    finally:
        holder.execute("COMMIT")
        holder.close()
    # Let go: the next round empties events_0 (and the members behind it), the ring rotates
    # again, the warning is followed by its all-clear and the age falls.
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events_0") == 0, 60, "events_0 emptied")
    wait_until(lambda: "the ring's retention empties its members again" in pg.log(), 60, "the all-clear")
    wait_until(lambda: ring_metrics(pg)[0] < stuck_age, 60, "the oldest sealed member's age falling")
    assert pg.value("SELECT count(*) FROM outbox.ring_status WHERE kept_because LIKE 'locked by%'") == 0
    assert "ERROR" not in pg.log()
    pg.assert_no_crash_in_log()


def test_a_member_a_slot_has_not_passed_is_reported_with_the_slot(mock_cluster, ring_relay):
    window = 3
    pg = ring_relay(workers=2, batch_size=50, retention=f"{window}s")
    enqueue(pg, "orders", rows_for(20, 4))
    pg.wait_published(20)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.cursors WHERE n_workers = 2") == 2, 30, "both cursors")
    # Slot 1 stops publishing (its cursor row held elsewhere: as a stopped worker, it passes
    # nothing more); slot 0 goes on.
    holder = pg.connect()
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM outbox.cursors WHERE n_workers = 2 AND worker = 1 FOR UPDATE")
        reason = "cursor of worker slot 1 (n_workers 2) has not passed it"

        def stuck():
            pg.sql("SELECT outbox.enqueue('orders', 'more-' || g, '{}'::jsonb) FROM generate_series(1, 4) g")
            return f"is kept: {reason}." in pg.log()

        wait_until(stuck, 120, "the retention's warning naming the slot")
        assert "HINT:  A relay worker of the ring has not published past the member" in pg.log()
        assert pg.sql("SELECT member, kept_because FROM outbox.ring_status WHERE overdue ORDER BY sealed_at "
                      "LIMIT 1") == [(0, reason)]
        assert ring_metrics(pg)[1] >= 1
    finally:
        holder.execute("COMMIT")
        holder.close()
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events_0") == 0, 60, "events_0 emptied")
    wait_until(lambda: "the ring's retention empties its members again" in pg.log(), 60, "the all-clear")
    assert "ERROR" not in pg.log()


@pytest.mark.parametrize("function", ["outbox.ring_status(interval)", "outbox.ring_retention(interval)"])
def test_a_relay_role_without_the_retentions_functions_is_refused_and_says_which(mock_cluster, ring_relay,
                                                                                 function):
    """The retention round calls outbox.ring_retention() and reads outbox.ring_status(): without
    EXECUTE on either the relay refuses (misconfigured, naming it), as for a missing table right,
    instead of running rounds that fail and roll back; granted back, it runs again."""
    pg = ring_relay(batch_size=50, retention="3s")
    pg.sql(f"REVOKE EXECUTE ON FUNCTION {function} FROM outbox_relay")
    name = function.split("(")[0]

    def refused():
        return [(w[2], w[5]) for w in pg.workers() if w[2] == "misconfigured" and name in (w[5] or "")]

    wait_until(refused, 60, f"the relay refusing without EXECUTE on {name}")
    pg.sql(f"GRANT EXECUTE ON FUNCTION {function} TO outbox_relay")
    enqueue(pg, "orders", rows_for(30, 3))
    pg.wait_published(30)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events_0") == 0, 60, "events_0 emptied by the relay")
    assert pg.workers()[0][2] != "misconfigured"


def test_a_failing_status_read_does_not_roll_the_retention_round_back(mock_cluster, ring_relay):
    """The look at outbox.ring_status after a round runs in a step of its own, after the round's
    commit: when it fails (a test seam, every time), the rounds still rotate and empty members."""
    pg = ring_relay(batch_size=50, retention="3s")
    holder = pg.connect()  # keeps events_0 from being emptied until the seam is armed
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT count(*) FROM outbox.events_0")
        enqueue(pg, "orders", rows_for(30, 3))
        pg.wait_published(30)  # (before the seam: a failed step backs the worker off)
        pg.set(test_fail_step="ring_status:100000")
        injected = "outbox test: injected failure of step ring_status"
        wait_until(lambda: injected in pg.log(), 60, "the status read failing")
    finally:
        holder.execute("COMMIT")
        holder.close()
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events_0") == 0, 60, "events_0 emptied by the relay")
    assert pg.value("SELECT member FROM outbox.ring WHERE is_current") != 0


def test_a_new_worker_count_made_after_an_incomplete_one_loses_nothing(mock_cluster, ring_relay):
    """A change of outbox.workers while the last count is incomplete: slot 1 of 2 has not made its
    row yet (a session's uncommitted insert of that row makes its creation wait, as a slow start
    would) and has published none of its lanes, while slot 0 of 2 passed every row. The slots of
    the next count start at the lowest cursor of the last complete count (1) and of those since,
    not at slot 0 of 2's: every committed event is published."""
    pg = ring_relay(workers=1, batch_size=50, poll_interval="200ms", lock_timeout="2s")
    pg.sql("SELECT outbox.enqueue('orders', 'warm', '{}'::jsonb)")
    pg.wait_published(1)
    with pg.connect(autocommit=False) as squat:
        squat.execute("INSERT INTO outbox.cursors (n_workers, worker, order_lsn, id, system_identifier, updated_at) "
                      "VALUES (2, 1, '0/0', 0, 0, now())")
        pg.set(workers=2)
        wait_until(lambda: pg.value("SELECT count(*) FROM outbox.cursors WHERE n_workers = 2") == 1, 60,
                   "slot 0 of 2 made")
        rows = enqueue(pg, "orders", rows_for(40, 8))
        want = sum(len(v) for v in rows.values())
        wait_until(lambda: published(pg) > 1, 60, "slot 0 of 2 publishing its lanes")
        wait_until(lambda: pg.value("SELECT c.order_lsn > (SELECT max(order_lsn) FROM outbox.events_0) "
                                    "FROM outbox.cursors c WHERE n_workers = 2 AND worker = 0"), 60,
                   "slot 0 of 2 past every row")
        pg.set(workers=3)
        wait_until(lambda: pg.value("SELECT count(*) FROM outbox.cursors WHERE n_workers = 3") == 3, 60,
                   "the three slots of 3 made")
        squat.rollback()
    wait_until(lambda: published(pg) == want + 1, 60, "every committed event published")


def members_index_tuples_read(pg):
    """Index entries the members' index scans returned so far, once the counters stop moving
    (the relay's worker flushes its statistics at most once a second)."""
    query = ("SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
             "WHERE schemaname = 'outbox' AND relname LIKE 'events\\_%'")
    seen = []

    def settled():
        seen.append(pg.value(query))
        return len(seen) >= 4 and seen[-1] == seen[-2] == seen[-3] == seen[-4]
    wait_until(settled, 60, "the members' statistics settled", interval=0.5)
    return seen[-1]


def test_many_committed_holes_cost_one_scan_of_the_window(mock_cluster, ring_relay):
    """K writers that each enqueue one row and stay open while a long range of other rows is
    published, then commit: K committed holes below that range. Their walk reads the window once
    for all of them (joined by writer), not once per hole: K scans of the window in one statement
    would, with enough holes, pass statement_timeout at every claim and never move on."""
    k_holes, batch = 30, 200
    window = 50 * batch  # rows of (2)'s window per claim (kHoleWindowPerBatchRow)
    pg = ring_relay(batch_size=batch, poll_interval="200ms")
    writers = []
    try:
        xids = []
        for i in range(k_holes):
            w = pg.connect(autocommit=False)
            writers.append(w)
            enqueue_in(w, "billing", f"h{i}", f"hole {i}")
            xids.append(w.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        pg.sql(f"SELECT count(outbox.enqueue('bulk', NULL::text, 'x'::text)) FROM generate_series(1, {window})")
        pg.wait_published(window, timeout=300)
        wait_until(lambda: set(xids) <= set(holes(pg)), 60, "every open writer a hole")
        before = members_index_tuples_read(pg)
        for w in writers:
            w.commit()
    finally:
        for w in writers:
            w.close()
    marker = pg.value("SELECT outbox.enqueue('billing', 'after', 'marker')::text")
    wait_until(lambda: pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (marker,)) == "published",
               120, "the event after the holes published")
    wait_until(lambda: holes(pg) == {}, 60, "the holes walked and dropped")
    assert published(pg) == window + k_holes + 1
    read = members_index_tuples_read(pg) - before
    # A few windows whatever K (each claim finds the window's end and walks it, and the walk takes
    # a couple of claims to reach the cursor); one scan per hole is about K windows.
    assert read < 10 * window, f"{read} member index entries read to walk {k_holes} holes of a {window}-row window"
