"""The relay against librdkafka's mock cluster: delivery, wake-up, per-key order with several
workers, poison events, broker outages, crashes, shutdown, and good citizenship inside Postgres.
(End to end against a real Apache Kafka broker: test_kafka_e2e.py.)"""

import os
import signal

import psycopg
import pytest

from harness.kafka_reader import check_delivery, read_topic
from harness.wait import wait_until

# Kafka error codes pushed by the mock (see harness/mock_cluster.py --classify).
NOT_ENOUGH_REPLICAS = 19  # retriable: the producer retries it internally
INVALID_RECORD = 87       # permanent: the record batch is refused
TOPIC_AUTHORIZATION_FAILED = 29


def enqueue(pg, topic, rows, per_transaction=10):
    """rows: [(key, payload)]. Commits `per_transaction` enqueues at a time, one transaction
    after the other, so enqueue order is commit order. Returns {key: [event_id, ...]}."""
    by_key = {}
    with pg.connect(autocommit=False) as c:
        for start in range(0, len(rows), per_transaction):
            for key, payload in rows[start:start + per_transaction]:
                eid = c.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)::text", (topic, key, payload)).fetchone()[0]
                by_key.setdefault(key, []).append(eid)
            c.commit()
    return by_key


def rows_for(n, keys):
    return [(f"k{i % keys}", f'{{"seq": {i}}}') for i in range(n)]


def status_counts(pg):
    return dict(pg.sql("SELECT status, count(*) FROM outbox.events GROUP BY status"))


# --- delivery ------------------------------------------------------------------------------

def test_publishes_key_value_headers_and_records_partition_offset(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    with pg.connect() as c:
        c.execute("SELECT outbox.enqueue('billing', 'sub-1', '{\"amount\": 10}'::jsonb, '{\"trace\": \"t1\"}')")
        c.execute("SELECT outbox.enqueue('billing', 'sub-1', 'text payload'::text)")
        c.execute("SELECT outbox.enqueue('billing', NULL, '\\x00ff'::bytea)")
        c.execute("SELECT outbox.enqueue('billing', 'sub-2', NULL::jsonb)")  # tombstone
    pg.wait_published(4)
    rows = pg.sql("SELECT event_id::text, key, kafka_partition, kafka_offset, published_at IS NOT NULL "
                  "FROM outbox.events ORDER BY id")
    records = read_topic(mock_cluster.bootstrap, "billing", 4)
    by_id = {r.event_id: r for r in records}
    assert len(by_id) == 4
    for event_id, key, partition, offset, has_published_at in rows:
        r = by_id[event_id]
        assert has_published_at
        assert (r.partition, r.offset) == (partition, offset)
        assert r.key == (key.encode() if key is not None else None)
    first, second, unkeyed, tombstone = (by_id[r[0]] for r in rows)
    assert first.value == b'{"amount": 10}' and first.headers["trace"] == "t1"
    assert second.value == b"text payload"
    assert unkeyed.key is None and unkeyed.value == b"\x00\xff"
    assert tombstone.value is None
    w = pg.workers()[0]
    assert w[2] == "idle" and w[3] == 4 and w[6] == "up"


def test_published_at_is_not_before_the_broker_acked(mock_cluster, make_relay):
    # published_at says when the relay learnt of the ack. The broker answers a produce request no
    # sooner than its RTT after the request, which leaves after the enqueue: so published_at can
    # not precede created_at + RTT. (The record runs in the claim's transaction, where now() is
    # the claim's start, before the publish.)
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'warm-up', '{}'::jsonb)")
    pg.wait_published(1)  # producer connected, topic metadata known
    mock_cluster.rtt("all", 1000)  # below publish_timeout: acked, slowly
    try:
        pg.sql("SELECT outbox.enqueue('billing', 'slow', '{}'::jsonb)")
        pg.wait_published(2)
    finally:
        mock_cluster.rtt("all", 0)
    gap = pg.value("SELECT extract(epoch FROM published_at - created_at)::float8 FROM outbox.events "
                   "WHERE key = 'slow'")
    assert gap >= 1.0, f"published_at is {gap:.3f} s after created_at, before the ack could arrive"


def test_rolled_back_business_transaction_publishes_nothing(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap)
    pg.sql("CREATE TABLE invoices (id int PRIMARY KEY, status text)")
    with pg.connect(autocommit=False) as c:
        c.execute("INSERT INTO invoices VALUES (1, 'paid')")
        c.execute("SELECT outbox.enqueue('billing', 'invoice-1', '{\"event\": \"rolled back\"}'::jsonb)")
        c.rollback()
        c.execute("INSERT INTO invoices VALUES (1, 'paid')")
        c.execute("SELECT outbox.enqueue('billing', 'invoice-1', '{\"event\": \"committed\"}'::jsonb)")
        c.commit()
    pg.wait_published(1)
    # Same key, so a published rolled-back event would have to come first on the partition.
    records = read_topic(mock_cluster.bootstrap, "billing", 1, settle=True)
    assert [r.value for r in records] == [b'{"event": "committed"}']
    assert pg.value("SELECT count(*) FROM outbox.events") == 1


def test_commit_wakes_the_relay_without_polling(mock_cluster, make_relay):
    # With a one-hour poll interval only the commit-time latch can deliver within the deadline.
    pg = make_relay(mock_cluster.bootstrap, poll_interval="1h")
    pg.wait_workers_running(1)
    for i in range(3):
        pg.sql("SELECT outbox.enqueue('billing', 'k', %s::jsonb)", (f'{{"i": {i}}}',))
        pg.wait_published(i + 1, timeout=30)


# --- per-key order ---------------------------------------------------------------------------

def test_four_workers_1000_events_100_keys_exactly_once_in_order(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, workers=4, batch_size=50)
    pg.wait_workers_running(4)
    expected = enqueue(pg, "orders", rows_for(1000, 100))
    pg.wait_published(1000, timeout=120)
    records = read_topic(mock_cluster.bootstrap, "orders", 1000, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == []
    assert check.unique == 1000 and check.duplicates == 0
    # All four workers took part.
    assert all(w[3] > 0 for w in pg.workers())


SUBSCRIPTION_TOPICS = ["invoice", "payment", "refund", "dunning"]


def test_a_keys_events_on_four_topics_go_in_one_batch_in_order_per_topic_and_key(mock_cluster, make_relay):
    """Order scope is (topic, key): a key's events spread over four topics are not cut into one
    batch per change of topic (0.1.0 did that), and each (topic, key) arrives in commit order."""
    for t in SUBSCRIPTION_TOPICS:
        mock_cluster.create_topic(t, 4)
    pg = make_relay(mock_cluster.bootstrap, batch_size=400)
    pg.wait_workers_running(1)
    expected = {t: {} for t in SUBSCRIPTION_TOPICS}
    with pg.connect(autocommit=False) as c:
        for i in range(400):
            topic, key = SUBSCRIPTION_TOPICS[i % 4], f"sub-{i % 10}"
            eid = c.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)::text",
                            (topic, key, f'{{"seq": {i}}}')).fetchone()[0]
            expected[topic].setdefault(key, []).append(eid)
        c.commit()
    pg.wait_published(400)
    # One batch: one claim transaction recorded every row (its acks may be recorded in several
    # statements while the rest is in flight, so published_at may differ; the writer may not).
    if pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'") == "0.3.0":
        assert pg.value("SELECT count(DISTINCT xmin::text) FROM outbox.events") == 1
    else:  # 0.4.0: the batch's landed rows, one transaction's
        assert pg.value("SELECT count(DISTINCT xmin::text) FROM outbox.landed") == 1
    for topic in SUBSCRIPTION_TOPICS:
        records = read_topic(mock_cluster.bootstrap, topic, 100, settle=True)
        check = check_delivery(records, expected[topic])
        assert check.lost == [] and check.order_violations == [] and check.duplicates == 0, topic


def test_order_holds_with_injected_errors_and_a_killed_worker(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, workers=4, batch_size=50, max_attempts=1000)
    pg.wait_workers_running(4)
    # Transient broker trouble and refused record batches, mixed in while the backlog drains.
    mock_cluster.produce_errors(10, NOT_ENOUGH_REPLICAS)
    mock_cluster.produce_errors(5, INVALID_RECORD)
    first = enqueue(pg, "orders", rows_for(500, 100))
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'") >= 100, 60,
               "some events published")
    killed = pg.kill_worker(1)  # SIGKILL mid-run: the postmaster restarts everything
    wait_until(lambda: killed not in pg.worker_pids() and all(pg.worker_pids()), 60, "cluster and relay back")
    mock_cluster.produce_errors(5, INVALID_RECORD)
    second = enqueue(pg, "orders", [(f"k{i % 100}", f'{{"seq": {500 + i}}}') for i in range(500)])
    for key, ids in second.items():
        first.setdefault(key, []).extend(ids)
    pg.wait_published(1000, timeout=180)
    assert killed not in pg.worker_pids()
    records = read_topic(mock_cluster.bootstrap, "orders", 1000, settle=True)
    check = check_delivery(records, first)
    print(f"delivered {check.delivered}, unique {check.unique}, duplicates {check.duplicates} "
          f"(resent after the crash or a refused batch)")
    assert check.lost == []
    assert check.order_violations == []
    assert check.unique == 1000
    assert status_counts(pg) == {"published": 1000}


# --- poison events ---------------------------------------------------------------------------

def poison_setup(mock_cluster, make_relay, policy):
    # The producer refuses events over 2000 bytes (message.max.bytes), the table accepts them:
    # a poison event that fails every attempt.
    pg = make_relay(mock_cluster.bootstrap, max_attempts=3, on_failed_event=policy,
                    kafka_properties="message.max.bytes=2000", max_payload_bytes="1MB")
    pg.wait_workers_running(1)
    with pg.connect(autocommit=False) as c:
        poison = c.execute("SELECT outbox.enqueue('billing', 'bad-key', %s)::text", ("x" * 5000,)).fetchone()[0]
        c.commit()
        after = [c.execute("SELECT outbox.enqueue('billing', 'bad-key', %s)::text", (f"after {i}",)).fetchone()[0]
                 for i in range(2)]
        others = [c.execute("SELECT outbox.enqueue('billing', %s, 'fine')::text", (f"good-{i}",)).fetchone()[0]
                  for i in range(20)]
        c.commit()
    return pg, poison, after, others


@pytest.mark.schema("0.3.0")  # the operator's DELETE of the failed row (0.4.0: test_ring_relay.py)
def test_poison_event_is_quarantined_and_blocks_only_its_key(mock_cluster, make_relay):
    pg, poison, after, others = poison_setup(mock_cluster, make_relay, "block_key")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "poison event in outbox.failed")
    pg.wait_published(20)
    row = pg.sql("SELECT event_id::text, key, attempts, last_error FROM outbox.failed")[0]
    assert row[0] == poison and row[1] == "bad-key" and row[2] == 3
    assert "MSG_SIZE_TOO_LARGE" in row[3]
    # Later events of the poisoned key wait; nothing else did.
    assert pg.sql("SELECT status, count(*) FROM outbox.events WHERE key = 'bad-key' GROUP BY 1 ORDER BY 1") == \
        [("failed", 1), ("pending", 2)]
    assert pg.workers()[0][4] == 1  # failed counter
    assert pg.log().count(f"event {poison} (topic billing) moved to failed after 3 attempts") == 1
    # The operator removes the poison event: the key moves on, in order.
    pg.sql("DELETE FROM outbox.events WHERE event_id = %s", (poison,))
    pg.wait_published(22)
    records = read_topic(mock_cluster.bootstrap, "billing", 22, settle=True)
    assert [r.event_id for r in records if r.key == b"bad-key"] == after


def test_skip_policy_lets_later_events_of_the_key_go_ahead(mock_cluster, make_relay):
    pg, poison, after, others = poison_setup(mock_cluster, make_relay, "skip")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "poison event in outbox.failed")
    pg.wait_published(22)
    records = read_topic(mock_cluster.bootstrap, "billing", 22, settle=True)
    assert [r.event_id for r in records if r.key == b"bad-key"] == after
    assert poison not in {r.event_id for r in records}


def test_broker_rejected_record_fails_after_max_attempts(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, max_attempts=2)
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'ok', 'warm-up')")
    pg.wait_published(1)
    # The broker refuses the next two produce requests: both attempts of the one event.
    mock_cluster.produce_errors(2, INVALID_RECORD)
    pg.sql("SELECT outbox.enqueue('billing', 'p', 'refused')")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 60, "refused event failed")
    assert "INVALID_RECORD" in pg.value("SELECT last_error FROM outbox.failed")
    assert pg.value("SELECT attempts FROM outbox.failed") == 2
    # Other keys flow; the failed one goes through after outbox.retry().
    pg.sql("SELECT outbox.enqueue('billing', 'other', 'accepted')")
    pg.wait_published(2)
    assert pg.value("SELECT outbox.retry(event_id) FROM outbox.failed") == 1
    pg.wait_published(3)


def test_unavailable_topic_defers_its_events_without_using_attempts(mock_cluster, make_relay):
    # A topic whose partitions have no leader times out while other topics work: its events wait
    # (no attempts used, nothing failed), everything else is published.
    pg = make_relay(mock_cluster.bootstrap, max_attempts=1, publish_timeout="1s")
    pg.wait_workers_running(1)
    mock_cluster.topic_error("poison", TOPIC_AUTHORIZATION_FAILED)
    pg.sql("SELECT outbox.enqueue('poison', 'p', 'waits')")
    pg.sql("SELECT outbox.enqueue('billing', 'ok', 'accepted')")
    pg.wait_published(1)
    wait_until(lambda: pg.value("SELECT last_error FROM outbox.events WHERE key = 'p'"), 30, "deferred")
    assert pg.sql("SELECT status, attempts FROM outbox.events WHERE key = 'p'") == [("pending", 0)]
    mock_cluster.topic_error("poison", 0)
    pg.wait_published(2, timeout=60)


# --- broker outage ---------------------------------------------------------------------------

def test_outage_longer_than_all_attempts_fails_nothing(mock_cluster, make_relay):
    # max_attempts x backoff is well under a second; the outage lasts many publish timeouts.
    pg = make_relay(mock_cluster.bootstrap, max_attempts=2, backoff_base="50ms", backoff_max="200ms",
                    publish_timeout="1s", kafka_properties="socket.connection.setup.timeout.ms=1000;"
                                                           "reconnect.backoff.max.ms=200")
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'warmup', 'x')")
    pg.wait_published(1)
    for b in (1, 2, 3):
        mock_cluster.down(b)
    expected = enqueue(pg, "billing", rows_for(100, 10))
    # Several publish attempts time out while the brokers are down.
    wait_until(lambda: pg.log().count("Kafka unavailable") >= 1 and pg.workers()[0][2] == "backing off", 60,
               "relay backing off")
    wait_until(lambda: pg.log().count("retrying in") >= 3 or pg.log().count("Kafka unavailable") >= 3, 60,
               "several failed publish rounds")
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status = 'failed'") == 0
    assert pg.value("SELECT max(attempts) FROM outbox.events") == 0
    for b in (1, 2, 3):
        mock_cluster.up(b)
    pg.wait_published(101, timeout=120)
    assert status_counts(pg) == {"published": 101}
    records = read_topic(mock_cluster.bootstrap, "billing", 101, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == []


# --- crashes and shutdown --------------------------------------------------------------------

def test_crash_between_publish_and_record_resends_and_dedup_applies_once(mock_cluster, make_relay):
    victim = "6c9c1a4e-7d1f-4b5e-9a53-8d7f2b0c0e01"
    # Set before the worker starts: a reload reaches the worker whenever it next checks, and the
    # enqueue's commit can wake it to publish the victim before that.
    pg = make_relay(mock_cluster.bootstrap, test_crash_after_ack=victim)
    pg.wait_workers_running(1)
    pid_before = pg.worker_pids()[0]
    pg.expect_killed(pid_before)  # the relay SIGKILLs itself after the ack (test_crash_after_ack)
    with pg.connect(autocommit=False) as c:
        c.execute("SELECT outbox.enqueue('billing', 'invoice-7', '{\"n\": 1}'::jsonb)")
        c.execute("SELECT outbox.enqueue('billing', 'invoice-7', '{\"n\": 2}'::jsonb, NULL, %s)", (victim,))
        c.execute("SELECT outbox.enqueue('billing', 'invoice-7', '{\"n\": 3}'::jsonb)")
        c.commit()
    wait_until(lambda: "test_crash_after_ack: crashing after the ack of " + victim in pg.log(), 60, "injected crash")
    pg.wait_published(3, timeout=90)
    assert pid_before not in pg.worker_pids()
    assert os.path.exists(os.path.join(pg.datadir, "outbox_test_crash_fired"))
    records = read_topic(mock_cluster.bootstrap, "billing", 6, settle=True)
    # At least once: the acked-but-unrecorded batch went out again after the restart.
    assert len(records) == 6
    # A consumer deduplicating on event_id applies each exactly once, in order.
    applied, seen = [], set()
    for r in records:
        if r.event_id not in seen:
            seen.add(r.event_id)
            applied.append(r.value)
    assert applied == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']


def test_sigterm_stops_within_bounds_and_loses_nothing(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, batch_size=20)
    pg.wait_workers_running(1)
    mock_cluster.rtt("all", 200)  # slow broker: batches are in flight when SIGTERM arrives
    expected = enqueue(pg, "billing", rows_for(200, 5))
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'") > 0, 60,
               "publishing started")
    pid = pg.kill_worker(0, signal.SIGTERM)
    wait_until(lambda: "outbox relay 0 stopping" in pg.log(), 30, "worker stopped")
    wait_until(lambda: pg.worker_pids()[0] not in (None, pid), 60, "worker restarted by the postmaster")
    mock_cluster.rtt("all", 0)
    pg.wait_published(200, timeout=120)
    records = read_topic(mock_cluster.bootstrap, "billing", 200, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.order_violations == []


# --- settings --------------------------------------------------------------------------------

def test_unknown_kafka_property_is_reported_without_crash_loop(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, kafka_properties="no.such.property=1")
    wait_until(lambda: pg.workers()[0][2] == "misconfigured", 30, "misconfigured state")
    pid = pg.worker_pids()[0]
    # Named by position only: a name that is no property may be a fragment of a secret.
    assert pg.workers()[0][5] == "outbox.kafka_properties entry 1 names no librdkafka property"
    assert "no.such.property" not in pg.log()
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'waits for the fix')")
    # Several poll intervals later: same process, one log line, nothing published.
    pg.set(poll_interval="100ms")
    wait_until(lambda: pg.value("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay'") == 1, 10,
               "worker alive")
    assert pg.worker_pids()[0] == pid
    assert pg.log().count("entry 1 names no librdkafka property") == 1
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'") == 0
    pg.set(kafka_properties="")  # the fix (the bad value is in postgresql.conf)
    pg.wait_published(1)
    assert pg.worker_pids()[0] == pid


@pytest.mark.parametrize("properties,message", [
    ("enable.idempotence=false", "the relay needs the idempotent producer"),
    ("partitioner=random", "places keys like the Java client"),
    ("linger.ms=5", "holds each batch and sends it in one go"),
    ("acks", "is not name=value"),
])
def test_kafka_properties_that_break_guarantees_are_refused(mock_cluster, make_relay, properties, message):
    pg = make_relay(mock_cluster.bootstrap, kafka_properties=properties)
    wait_until(lambda: pg.workers()[0][2] == "misconfigured", 30, "misconfigured state")
    assert message in pg.workers()[0][5]


def test_bad_property_value_is_not_echoed(mock_cluster, make_relay):
    # A value may be a secret: the error names the property, never the value.
    pg = make_relay(mock_cluster.bootstrap, kafka_properties="compression.codec=hunter2-secret")
    wait_until(lambda: pg.workers()[0][2] == "misconfigured", 30, "misconfigured state")
    error = pg.workers()[0][5]
    assert error == ('outbox.kafka_properties entry 1 sets "compression.codec" to a value librdkafka refuses '
                     '(not shown)')
    assert "hunter2-secret" not in error and "hunter2-secret" not in pg.log()


def test_unreachable_bootstrap_shows_broker_down_and_keeps_events(make_relay):
    pg = make_relay("127.0.0.1:1", publish_timeout="1s",
                    kafka_properties="socket.connection.setup.timeout.ms=1000;reconnect.backoff.max.ms=200")
    pg.wait_workers_running(1)
    pid = pg.worker_pids()[0]
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'kept')")
    wait_until(lambda: pg.workers()[0][6] == "down" and pg.workers()[0][2] == "backing off", 60,
               "broker down, backing off")
    assert "Kafka unavailable" in pg.log()
    assert pg.worker_pids()[0] == pid
    # Kept and retried, never failed, no attempt used up.
    assert pg.sql("SELECT status IN ('pending', 'in_flight'), attempts FROM outbox.events") == [(True, 0)]


def test_missing_database_is_reported_once_and_picked_up_when_created(mock_cluster, make_relay):
    # outbox.database (deprecated) naming a database that does not exist: the launcher says so
    # once, starts no worker, and relays the database once CREATE DATABASE made it.
    pg = make_relay(mock_cluster.bootstrap, database="no_such_db", create_extension=False, single_database=True)
    line = 'outbox.database "no_such_db" does not exist'
    wait_until(lambda: line in pg.log(), 30, "missing database logged")
    pg.sql("CREATE DATABASE no_such_db", dbname="postgres")
    pg.sql("CREATE EXTENSION outbox")
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'x'::text)")
    pg.wait_published(1)
    assert pg.log().count(line) == 1


def test_idle_without_extension_logs_once_and_starts_after_create(mock_cluster, make_relay):
    # With outbox.database set (deprecated), its workers wait in the database for the extension
    # (without it, no process stays in a database without the extension: test_launcher.py).
    pg = make_relay(mock_cluster.bootstrap, create_extension=False, poll_interval="100ms", single_database=True)
    line = 'extension "outbox" is not installed in database "postgres"'
    wait_until(lambda: line in pg.log(), 30, "not-installed log line")
    pid = wait_until(lambda: pg.value("SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay'"), 10,
                     "worker running")
    # Many polls later, still one line and the same process.
    wait_until(lambda: pg.value("SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'") > 50, 60,
               "worker polled many times")
    assert pg.log().count(line) == 1
    pg.sql("CREATE EXTENSION outbox")
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'after create')")
    pg.wait_published(1)
    assert pg.worker_pids()[0] == pid


# --- good citizenship ------------------------------------------------------------------------

def test_relay_sql_ignores_objects_planted_by_database_users(mock_cluster, make_relay):
    # The relay runs as a superuser. A user who can create objects must not get code run by it
    # through name resolution (search_path, operators without an exact match).
    pg = make_relay(mock_cluster.bootstrap)
    pg.sql("CREATE ROLE mallory LOGIN")
    pg.sql("GRANT CREATE ON SCHEMA public TO mallory")
    pg.sql("CREATE TABLE public.stolen (who text)")
    pg.sql("GRANT INSERT ON public.stolen TO mallory")
    with pg.connect() as c:
        c.execute("SET ROLE mallory")
        c.execute("""CREATE FUNCTION public.evil_mod(smallint, integer) RETURNS integer LANGUAGE sql AS
                     $$ INSERT INTO public.stolen VALUES (current_user) RETURNING 0 $$""")
        c.execute("CREATE OPERATOR public.% (LEFTARG = smallint, RIGHTARG = integer, FUNCTION = public.evil_mod)")
        c.execute("""CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql AS
                     $$ INSERT INTO public.stolen VALUES (current_user) RETURNING pg_catalog.now() $$""")
    pg.sql("ALTER DATABASE postgres SET search_path = public, pg_catalog")
    pg.kill_worker(0, signal.SIGTERM)  # a new session of the relay picks up the database default
    wait_until(lambda: "outbox relay 0 stopping" in pg.log(), 30, "worker restarting")
    pg.wait_workers_running(1)
    enqueue(pg, "billing", rows_for(20, 5))
    pg.wait_published(20)
    assert pg.value("SELECT count(*) FROM public.stolen") == 0


def test_create_extension_in_another_database_warns(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, single_database=True)
    pg.sql("CREATE DATABASE other")
    with pg.connect("other") as c:
        notices = []
        c.add_notice_handler(lambda d: notices.append(d.message_primary))
        c.execute("CREATE EXTENSION outbox")
    assert any('outbox events in database "other" will not be published' in n for n in notices)


def test_visible_in_pg_stat_activity_and_reports_table_stats(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, workers=2)
    pg.wait_workers_running(2)
    names = pg.sql("SELECT application_name FROM pg_stat_activity WHERE backend_type = 'outbox relay' ORDER BY 1")
    assert names == [("outbox relay 0",), ("outbox relay 1",)]
    enqueue(pg, "billing", rows_for(100, 10))
    pg.wait_published(100)
    # The worker flushes its statistics itself, so autovacuum sees its writes. 0.3.0: one update
    # per event (the claim locks rows without updating them; DESIGN.md "Data path"). 0.4.0: no
    # update of a member at all, one landed row per batch and partition.
    if pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'") == "0.3.0":
        updates = "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'outbox.events'::regclass"
        wait_until(lambda: pg.value(updates) >= 100, 30, "the record's updates reported")
        pg.sql("SELECT pg_stat_clear_snapshot()")
        assert pg.value(updates) == 100, "more than one update per published event"
    else:
        landed = "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'outbox.landed'::regclass"
        wait_until(lambda: pg.value(landed) >= 1, 30, "the record's landed rows reported")
        pg.sql("SELECT pg_stat_clear_snapshot()")
        assert pg.value("SELECT sum(n_tup_upd + n_tup_del) FROM pg_stat_user_tables "
                        "WHERE schemaname = 'outbox' AND relname LIKE 'events\\_%'") == 0, "a member row updated or deleted"
        assert pg.value(landed) <= 100
    assert pg.value("SELECT count(*) FROM outbox.events WHERE claimed_at IS NOT NULL") == 0


def test_drop_database_and_drop_extension_are_not_blocked(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, poll_interval="100ms")
    pg.wait_workers_running(1)
    pg.sql("CREATE DATABASE scratch")
    pg.sql("DROP DATABASE scratch")
    with pg.connect() as c:
        c.execute("SET lock_timeout = '20s'")
        c.execute("DROP EXTENSION outbox")
    wait_until(lambda: 'extension "outbox" is not installed' in pg.log(), 30, "relay noticed the drop")
    pg.sql("CREATE EXTENSION outbox")
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'after re-create')")
    pg.wait_published(1)


def test_drop_of_the_relay_database_is_not_blocked(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, database="relaydb", workers=2)
    pg.wait_workers_running(2)
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'x')")
    pg.wait_published(1)
    pg.database = "postgres"
    pg.sql("DROP DATABASE relaydb")  # no WITH (FORCE)
    assert pg.value("SELECT count(*) FROM pg_database WHERE datname = 'relaydb'") == 0
    assert "stopping the relay workers for DROP DATABASE" in pg.log()


def test_hot_standby_publishes_nothing_until_promoted(mock_cluster, make_relay, tmp_path):
    import subprocess

    from harness.pg_cluster import PgCluster
    primary = make_relay(mock_cluster.bootstrap, poll_interval="100ms")
    primary.sql("SELECT pg_create_physical_replication_slot('standby')")
    standby_dir = str(tmp_path / "standby")
    subprocess.run(["pg_basebackup", "-h", primary.tmp, "-p", str(primary.port), "-U", "postgres", "-D", standby_dir,
                    "-R", "-S", "standby", "-X", "stream"], check=True)
    standby = PgCluster(datadir=standby_dir, settings={
        "outbox.bootstrap_servers": f"'{mock_cluster.bootstrap}'", "hot_standby": "on"})
    try:
        standby.write_conf()
        standby.start()
        # Stop the primary's relay from publishing so the standby's events stay pending.
        primary.sql("ALTER SYSTEM SET outbox.bootstrap_servers = '127.0.0.1:1'")
        primary.reload()
        primary.sql("SELECT outbox.enqueue('billing', 'standby-test', 'x')")
        wait_until(lambda: standby.value("SELECT count(*) FROM outbox.events") == 1, 60, "replicated")
        assert standby.value("SELECT pg_is_in_recovery()")
        assert standby.value("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay'") == 0
        assert standby.value("SELECT pid FROM outbox.workers") is None
        primary.stop()
        subprocess.run(["pg_ctl", "-D", standby_dir, "-w", "promote"], check=True, stdout=subprocess.DEVNULL)
        standby.wait_workers_running(1)
        standby.wait_published(1)
        standby.assert_no_crash_in_log()
    finally:
        standby.cleanup()


def test_idle_relay_does_not_flood_statistics_or_log(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, poll_interval="20ms")
    pg.sql("ALTER SYSTEM SET shared_preload_libraries = outbox, pg_stat_statements")
    pg.restart()
    pg.sql("CREATE EXTENSION pg_stat_statements")
    pg.wait_workers_running(1)
    log_size = len(pg.log())
    start = pg.value("SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'")
    wait_until(lambda: pg.value("SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'") > start + 200,
               60, "many idle polls")
    # Each poll reuses the same few prepared statements: a handful of entries, not one per poll.
    relay_statements = pg.value("SELECT count(*) FROM pg_stat_statements WHERE query LIKE '%outbox.events%'")
    assert 1 <= relay_statements <= 4
    assert len(pg.log()) == log_size  # idle polls log nothing
