"""The relay's Kafka side under faults: settings that reach the producer on reload, record batches
the broker refuses (real broker), waits that serve shutdown and cancel with every broker down
(mock cluster), and outbox.kafka_properties' escaping and secrecy."""

import os
import subprocess

import psycopg
import pytest

from harness.kafka_broker import KafkaBroker
from harness.kafka_reader import check_delivery, read_topic
from harness.wait import wait_until

FAST_RECONNECT = "socket.connection.setup.timeout.ms=1000;reconnect.backoff.max.ms=200"
# Twice the documented 5 s stop bound (a loaded 2-core machine), far below what d539db3 needed
# (2 s per new topic, 5 s per event that found the producer's queue full).
STOP_DEADLINE_S = 10


def enqueue_all(pg, rows):
    """rows: [(topic, key, payload)], all in one transaction (one claim, one batch). Returns the
    event ids in order."""
    with pg.connect(autocommit=False) as c:
        ids = [c.execute("SELECT outbox.enqueue(%s, %s, %s::text)::text", row).fetchone()[0] for row in rows]
        c.commit()
    return ids


def events(pg, ids):
    """{event_id: (status, attempts)}"""
    return {eid: (status, attempts) for eid, status, attempts in
            pg.sql("SELECT event_id::text, status, attempts FROM outbox.events WHERE event_id::text = ANY(%s)",
                   (ids,))}


def settled(pg):
    return pg.value("SELECT count(*) FROM outbox.events WHERE status IN ('pending', 'in_flight')") == 0


# --- settings the producer depends on ---------------------------------------------------------

def test_reloaded_max_payload_bytes_reaches_the_producer(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, max_attempts=2)
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'warm-up', 'x')")
    pg.wait_published(1)  # the producer exists, made for the default 1MB
    pg.set(max_payload_bytes="3MB")
    # Larger than the message.max.bytes the first producer was made with (1MB + 64kB).
    big = enqueue_all(pg, [("billing", "big", "x" * 1_500_000)])
    wait_until(lambda: events(pg, big)[big[0]][0] in ("published", "failed"), 60, "big event settled")
    assert events(pg, big) == {big[0]: ("published", 0)}


# --- interrupts with every broker slow ---------------------------------------------------------

def stall_a_batch(mock_cluster, make_relay, n_topics, n_events, kafka_properties=FAST_RECONNECT):
    """A relay whose batch of n_events events over n_topics topics, new to its producer (none:
    the topic of the warm-up event), is out while every broker takes 30 s to answer. (Not down:
    the relay claims nothing while it knows every broker down.)"""
    pg = make_relay(mock_cluster.bootstrap, kafka_properties=kafka_properties)
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'warm-up', 'x')")
    pg.wait_published(1)
    topics = [f"new-{i}" for i in range(n_topics)]
    for t in topics:
        mock_cluster.create_topic(t, 1)
    mock_cluster.rtt("all", 30000)
    ids = enqueue_all(pg, [(topics[i % n_topics] if topics else "billing", f"k{i}", f"event {i}")
                           for i in range(n_events)])
    wait_until(lambda: pg.workers()[0][2] == "publishing", 30, "the batch claimed")
    return pg, ids


def fast_stop(pg):
    """pg_ctl stop -m fast, waiting at most STOP_DEADLINE_S (pg_ctl polls). True if it stopped."""
    rc = subprocess.run(["pg_ctl", "-D", pg.datadir, "-m", "fast", "-w", "-t", str(STOP_DEADLINE_S), "stop"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    if rc == 0:
        pg.started = False
    return rc == 0


def assert_requeued_untouched(pg, ids):
    pg.start()
    assert set(events(pg, ids).values()) == {("pending", 0)}


def test_fast_stop_is_served_during_topic_lookups_with_brokers_slow(mock_cluster, make_relay):
    pg, ids = stall_a_batch(mock_cluster, make_relay, n_topics=20, n_events=20)
    assert fast_stop(pg), "fast shutdown did not complete in time"
    assert "outbox relay 0 stopping" in pg.log()
    assert_requeued_untouched(pg, ids)


def test_fast_stop_is_served_while_the_producer_queue_is_full(mock_cluster, make_relay):
    # A known topic: no look-up, the batch goes straight into the full queue.
    pg, ids = stall_a_batch(mock_cluster, make_relay, n_topics=0, n_events=200,
                            kafka_properties=FAST_RECONNECT + ";queue.buffering.max.messages=5")
    assert fast_stop(pg), "fast shutdown did not complete in time"
    assert_requeued_untouched(pg, ids)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_terminate_backend_is_served_during_topic_lookups(mock_cluster, make_relay):
    pg, ids = stall_a_batch(mock_cluster, make_relay, n_topics=20, n_events=20)
    pid = pg.worker_pids()[0]
    assert pg.value("SELECT pg_terminate_backend(%s)", (pid,))
    wait_until(lambda: not pid_alive(pid), STOP_DEADLINE_S, "worker exited")
    assert "outbox relay 0 stopping" in pg.log()
    mock_cluster.rtt("all", 0)
    pg.wait_published(21, timeout=90)  # the restarted worker sends them


def test_cancel_backend_is_served_during_topic_lookups(mock_cluster, make_relay):
    pg, ids = stall_a_batch(mock_cluster, make_relay, n_topics=20, n_events=20)
    pid = pg.worker_pids()[0]
    assert pg.value("SELECT pg_cancel_backend(%s)", (pid,))
    wait_until(lambda: "canceling statement due to user request" in pg.log(), STOP_DEADLINE_S, "cancel served")
    mock_cluster.rtt("all", 0)
    pg.wait_published(21, timeout=90)
    assert pg.worker_pids()[0] == pid  # back to work, not restarted
    assert set(events(pg, ids).values()) == {("published", 0)}


# --- outbox.kafka_properties ------------------------------------------------------------------

def test_escaped_semicolon_and_backslash_reach_librdkafka_intact(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    # librdkafka's debug=conf lists its configuration (sensitive values redacted); the relay
    # forwards those lines at DEBUG1.
    pg.sql("ALTER SYSTEM SET log_min_messages = debug1")
    pg.set(kafka_properties=r"client.id=outbox\;relay\\1 ; debug=conf")
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'x')")
    pg.wait_published(1)
    wait_until(lambda: "client.id = outbox;relay\\1\n" in pg.log(), 30, "client.id in librdkafka's configuration")


SECRET_FRAGMENTS = ("Zq7s3cr3t", "Xp4ss", "Yw0rd", "Vb8tail")


@pytest.mark.parametrize("properties,error", [
    # Unescaped ';' in a secret: its tail looks like an entry of its own.
    ("sasl.password=Zq7s3cr3t;Xp4ss=Yw0rd", "outbox.kafka_properties entry 2 names no librdkafka property"),
    ("sasl.password=Zq7s3cr3t;Vb8tail", "outbox.kafka_properties entry 2 is not name=value"),
    # A backslash that is no escape.
    (r"client.id=x;sasl.password=Zq7s3cr3t\Vb8tail", "outbox.kafka_properties entry 2 has a backslash that is neither"),
])
def test_kafka_properties_errors_never_show_a_value(mock_cluster, make_relay, properties, error):
    # Set in postgresql.conf (backslashes doubled for its string syntax), not by a reload: on a
    # reload PostgreSQL itself logs every changed value (docs/settings.md).
    pg = make_relay(mock_cluster.bootstrap, kafka_properties=properties.replace("\\", "\\\\"))
    wait_until(lambda: pg.workers()[0][2] == "misconfigured", 30, "misconfigured state")
    last_error = pg.workers()[0][5]
    assert last_error.startswith(error), last_error
    wait_until(lambda: error in pg.log(), 10, "error logged")
    # Neither the log nor what a monitoring role reads holds any fragment of the secret.
    pg.sql("CREATE ROLE monitor LOGIN")
    pg.sql("GRANT USAGE ON SCHEMA outbox TO monitor")
    pg.sql("GRANT SELECT ON outbox.workers TO monitor")
    pg.sql("GRANT EXECUTE ON FUNCTION outbox.worker_status() TO monitor")
    with psycopg.connect(host=pg.tmp, port=pg.port, user="monitor", dbname="postgres") as c:
        seen = repr(c.execute("SELECT * FROM outbox.workers").fetchall())
    assert "misconfigured" in seen
    log = pg.log()
    for fragment in SECRET_FRAGMENTS:
        assert fragment not in seen and fragment not in log, fragment


def test_secrets_file_is_read_by_the_worker_and_never_logged(mock_cluster, make_relay):
    """outbox.kafka_properties_file: the worker reads the file on start and on reload, so a
    secret in it never passes through a setting (whose new value the postmaster logs)."""
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    path = os.path.join(pg.tmp, "kafka.secrets")
    with open(path, "w") as f:
        f.write("# SASL secret, one name=value a line, taken literally\nclient.id = Zq7s3cr3t;Xp4ss\ndebug=conf\n")
    os.chmod(path, 0o644)
    pg.sql("ALTER SYSTEM SET log_min_messages = debug1")
    pg.set(kafka_properties_file=path)
    wait_until(lambda: "only its owner can read" in (pg.workers()[0][5] or ""), 30, "group-readable file refused")
    assert pg.workers()[0][2] == "misconfigured"
    os.chmod(path, 0o600)
    pg.reload()
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'x')")
    pg.wait_published(1)
    # librdkafka got the literal value (its debug=conf dump shows client.id); the settings and the
    # postmaster's "parameter changed" lines only ever held the path.
    wait_until(lambda: "client.id = Zq7s3cr3t;Xp4ss\n" in pg.log(), 30, "client.id in librdkafka's configuration")
    assert "Zq7s3cr3t" not in "".join(line for line in pg.log().splitlines(True) if "parameter" in line)
    # A bad line is named by its number, never its text.
    with open(path, "w") as f:
        f.write("client.id=ok\nsasl.password Zq7s3cr3t\n")
    pg.reload()
    wait_until(lambda: (pg.workers()[0][5] or "").startswith("outbox.kafka_properties_file line 2 is not name=value"),
               30, "bad line reported")
    assert "Zq7s3cr3t" not in pg.workers()[0][5]


# --- record batches the broker refuses (real broker) ------------------------------------------

@pytest.fixture(scope="module")
def kafka():
    with KafkaBroker() as kb:
        yield kb


def test_oversized_event_fails_alone_the_rest_of_its_record_batch_is_published(kafka, make_relay, unique_topic):
    # Larger than the topic allows, smaller than the producer's limit: the broker refuses the
    # whole record batch of the partition.
    kafka.create_topic(unique_topic, partitions=1, config={"max.message.bytes": "2000"})
    pg = make_relay(kafka.bootstrap, max_attempts=2)
    pg.wait_workers_running(1)
    rows = [(unique_topic, f"k{i}", f"small {i}") for i in range(10)]
    rows.insert(5, (unique_topic, "big", "x" * 5000))
    ids = enqueue_all(pg, rows)
    big = ids.pop(5)
    wait_until(lambda: settled(pg), 90, "every event published or failed")
    assert events(pg, [big]) == {big: ("failed", 2)}
    assert "MSG_SIZE_TOO_LARGE" in pg.value("SELECT last_error FROM outbox.failed")
    assert events(pg, ids) == {eid: ("published", 0) for eid in ids}
    records = read_topic(kafka.bootstrap, unique_topic, 10, settle=True)
    assert [r.event_id for r in records] == ids


def test_unkeyed_event_for_a_compacted_topic_fails_alone(kafka, make_relay, unique_topic):
    kafka.create_topic(unique_topic, partitions=1, config={"cleanup.policy": "compact"})
    pg = make_relay(kafka.bootstrap, max_attempts=2)
    pg.wait_workers_running(1)
    rows = [(unique_topic, f"k{i}", f"keyed {i}") for i in range(6)]
    rows.insert(3, (unique_topic, None, "no key"))
    ids = enqueue_all(pg, rows)
    unkeyed = ids.pop(3)
    wait_until(lambda: settled(pg), 90, "every event published or failed")
    assert events(pg, [unkeyed]) == {unkeyed: ("failed", 2)}
    assert events(pg, ids) == {eid: ("published", 0) for eid in ids}


def test_skip_policy_keeps_the_order_of_a_key_whose_batch_was_refused(kafka, make_relay, unique_topic):
    kafka.create_topic(unique_topic, partitions=1, config={"max.message.bytes": "2000"})
    pg = make_relay(kafka.bootstrap, max_attempts=2, on_failed_event="skip")
    pg.wait_workers_running(1)
    first, poison, third, *others = enqueue_all(pg, [
        (unique_topic, "K", "first"), (unique_topic, "K", "x" * 5000), (unique_topic, "K", "third"),
        *[(unique_topic, f"other-{i}", "fine") for i in range(5)]])
    wait_until(lambda: settled(pg), 90, "every event published or failed")
    # Only the poison event failed: no innocent event of K did, to be overtaken by K's next ones.
    assert pg.sql("SELECT event_id::text FROM outbox.events WHERE status = 'failed'") == [(poison,)]
    assert events(pg, [first, third, *others]) == {eid: ("published", 0) for eid in [first, third, *others]}
    fourth = enqueue_all(pg, [(unique_topic, "K", "fourth")])[0]
    pg.wait_published(len(others) + 3)
    records = read_topic(kafka.bootstrap, unique_topic, len(others) + 3, settle=True)
    check = check_delivery(records, {"K": [first, third, fourth]})
    assert check.lost == [] and check.order_violations == [] and check.duplicates == 0
