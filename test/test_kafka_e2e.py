"""End to end against a real Apache Kafka broker (KRaft, one node, jars from Maven Central),
read back with a real Kafka consumer.

Every test runs against 4.1 (test/kafka/pom.xml, the release the other Kafka tests use) and
against the newest release, 4.4 (pom-4.4.xml): one broker per release for the module, so the
relay is known to work with what a new deployment runs, not only with what it was written for.
test/run runs this module with Debian's librdkafka 2.0.2 and again with 2.8.0."""

import os
import re

import pytest

from harness.kafka_broker import KafkaBroker
from harness.kafka_reader import check_delivery, read_topic
from harness.librdkafka import extension_librdkafka
from harness.wait import wait_until


def murmur2(data: bytes) -> int:
    """Kafka's Java client partitioner hash (Utils.murmur2)."""
    m, r, length = 0x5BD1E995, 24, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def java_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# The Kafka releases this module runs against (harness/kafka_broker.py RELEASES).
RELEASES = ("4.1", "4.4")


@pytest.fixture(scope="module", params=RELEASES, ids=lambda release: f"kafka-{release}")
def kafka(request):
    with KafkaBroker(release=request.param) as kb:
        # The broker runs the release asked for (a pom mix-up would test another one).
        with open(kb.log_path) as f:
            version = re.search(r"Kafka version: (\S+)", f.read())
        running = version.group(1) if version else "no version in its log"
        assert running.startswith(f"{request.param}."), f"asked for Kafka {request.param}, got {running}"
        kb.create_topic("billing.invoices", partitions=6)
        # The broker refuses records over 1000 bytes on this topic: a real per-event rejection.
        kb.create_topic("billing.small", partitions=1, config={"max.message.bytes": "1000"})
        yield kb


def test_billing_events_reach_kafka_in_key_order_with_java_placement(kafka, make_relay):
    pg = make_relay(kafka.bootstrap, workers=2)
    pg.wait_workers_running(2)
    pg.sql("CREATE TABLE invoices (invoice_id text PRIMARY KEY, subscription text, status text)")
    expected = {}
    with pg.connect(autocommit=False) as c:
        for i in range(300):
            sub = f"sub-{i % 30}"
            inv = f"inv-{i}"
            c.execute("INSERT INTO invoices VALUES (%s, %s, 'paid')", (inv, sub))
            eid = c.execute("SELECT outbox.enqueue('billing.invoices', %s, jsonb_build_object('type', 'invoice.paid', "
                            "'invoice', %s::text), '{\"event_type\": \"invoice.paid\"}', "
                            "outbox.event_id(%s, 'paid'))::text", (sub, inv, inv)).fetchone()[0]
            expected.setdefault(sub, []).append(eid)
            c.commit()
        # A business transaction that rolls back publishes nothing.
        c.execute("INSERT INTO invoices VALUES ('inv-rolled-back', 'sub-0', 'paid')")
        rolled_back = c.execute("SELECT outbox.enqueue('billing.invoices', 'sub-0', '{}'::jsonb)::text").fetchone()[0]
        c.rollback()
    pg.wait_published(300, timeout=120)
    records = read_topic(kafka.bootstrap, "billing.invoices", 300, settle=True)
    check = check_delivery(records, expected)
    assert check.lost == [] and check.duplicates == 0 and check.order_violations == []
    assert rolled_back not in {r.event_id for r in records}
    for r in records:
        assert r.headers["event_type"] == "invoice.paid"
        # murmur2_random: a key lands where the Java client would put it.
        assert r.partition == java_partition(r.key, 6)
    # The table records where each event landed.
    recorded = dict((eid, (p, o)) for eid, p, o in
                    pg.sql("SELECT event_id::text, kafka_partition, kafka_offset FROM outbox.events"))
    assert all(recorded[r.event_id] == (r.partition, r.offset) for r in records)


@pytest.mark.parametrize("connections", [1, 4])
def test_each_partition_is_sent_by_one_producer_of_the_worker(kafka, make_relay, connections):
    """outbox.kafka_connections: a worker's producers share its partitions by partition number,
    partition % connections, batch after batch; a key still lands where the Java client puts it,
    in commit order. Read from the broker's log: each record batch names its producer id."""
    topic, partitions = f"billing.spread-{connections}", 8
    kafka.create_topic(topic, partitions=partitions)
    keys = [f"customer-{i}" for i in range(64)]
    assert {java_partition(k.encode(), partitions) for k in keys} == set(range(partitions))
    pg = make_relay(kafka.bootstrap, kafka_connections=connections)
    pg.wait_workers_running(1)
    # Every connection has answered a topic look-up once (a look-up a connection missed would
    # leave the first batch of a topic to the first connection, which is allowed).
    kafka.create_topic(f"{topic}.warm", partitions=1)
    pg.sql("SELECT outbox.enqueue(%s, 'k', '{}')", (f"{topic}.warm",))
    pg.wait_published(1, timeout=90)
    rounds = 3
    for r in range(rounds):  # one batch each: the route must hold from batch to batch
        pg.sql("SELECT outbox.enqueue(%s, k, format('%%s#%%s', k, %s::int)) FROM unnest(%s::text[]) k",
               (topic, r, keys))
        pg.wait_published(1 + len(keys) * (r + 1), timeout=90)
    records = read_topic(kafka.bootstrap, topic, len(keys) * rounds, settle=True)
    assert len(records) == len(keys) * rounds
    for rec in records:
        assert rec.partition == java_partition(rec.key, partitions), rec
    for k in keys:
        seen = [rec.value.decode() for rec in sorted(records, key=lambda x: x.offset) if rec.key == k.encode()]
        assert seen == [f"{k}#{r}" for r in range(rounds)]
    ids = kafka.producer_ids(topic)
    assert sorted(ids) == list(range(partitions)), ids
    assert all(len(ids[p]) == 1 for p in ids), f"a partition written by two producers: {ids}"
    by_partition = {p: next(iter(ids[p])) for p in ids}
    for p in range(partitions):
        for q in range(partitions):
            assert (by_partition[p] == by_partition[q]) == (p % connections == q % connections), by_partition
    assert len(set(by_partition.values())) == min(connections, partitions)


def test_broker_rejected_event_is_quarantined_others_flow(kafka, make_relay):
    pg = make_relay(kafka.bootstrap, max_attempts=2)
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing.small', 'big', %s)", ("x" * 5000,))
    for i in range(5):
        pg.sql("SELECT outbox.enqueue('billing.small', %s, 'small')", (f"ok-{i}",))
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.failed") == 1, 90, "rejected event in outbox.failed")
    pg.wait_published(5, timeout=90)
    error = pg.value("SELECT last_error FROM outbox.failed")
    assert "MSG_SIZE_TOO_LARGE" in error or "RECORD" in error, error
    records = read_topic(kafka.bootstrap, "billing.small", 5, settle=True)
    assert sorted(r.key for r in records) == [f"ok-{i}".encode() for i in range(5)]


def test_relay_logs_the_librdkafka_it_runs_with_once_at_start(kafka, make_relay):
    # The library the dynamic loader gives outbox.so (ldd), asked for its version; test/run's
    # second pass also says which one it built against (OUTBOX_EXPECT_LIBRDKAFKA).
    loaded = extension_librdkafka()
    expected = os.environ.get("OUTBOX_EXPECT_LIBRDKAFKA")
    if expected:
        assert loaded.version == expected, loaded
    pg = make_relay(kafka.bootstrap, workers=2)
    pg.wait_workers_running(2)
    pg.sql("SELECT outbox.enqueue('billing.invoices', 'k', '{}'::jsonb)")
    pg.wait_published(1, timeout=90)
    for worker in (0, 1):
        said = re.findall(rf"LOG:  outbox relay {worker}: librdkafka (\S+)$", pg.log(), re.M)
        assert said == [loaded.version], pg.log()
