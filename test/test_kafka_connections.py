"""outbox.kafka_connections: a worker's producers share the partitions (DESIGN.md "Publish",
Connections). What the split must never cost: a key's order on its partition, an event failed
for a partition it did not name, or a partition's share of a batch leaving in many requests.
test_kafka_e2e.py has the routing itself (each partition's producer id, read from the broker)."""

import statistics

import pytest

from harness.kafka_broker import KafkaBroker
from harness.mock_cluster import _consume_all
from harness.wait import wait_until
from test_kafka_e2e import java_partition


@pytest.fixture(scope="module")
def kafka():
    with KafkaBroker() as kb:
        yield kb


def status_and_error(pg, eid):
    return pg.sql("SELECT status, last_error FROM outbox.events WHERE event_id::text = %s", (eid,))[0]


def test_a_topic_whose_count_is_not_known_keeps_each_partition_on_one_producer(mock_cluster, make_relay):
    """A topic whose partition count the relay could not look up goes through the first
    connection, whose partitioner picks: an event that names a partition goes the same way, or
    one batch would send that partition from two producers and a key's events on it could be
    appended out of commit order."""
    pg = make_relay(mock_cluster.bootstrap, kafka_connections=4,
                    kafka_properties="socket.connection.setup.timeout.ms=1000;reconnect.backoff.max.ms=200")
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'warm-up', 'x')")
    pg.wait_published(1)
    key = next(k for k in (f"k{i}" for i in range(1000)) if java_partition(k.encode(), 8) % 4 != 0)
    p = java_partition(key.encode(), 8)
    # Longer than a topic look-up may wait (kafka_producer.hpp kMetadataLookupMs): the count of
    # 'orders' stays unknown for the batch.
    mock_cluster.rtt("all", 700)
    with pg.connect(autocommit=False) as c:
        c.execute("SELECT outbox.enqueue('orders', %s, 'first', partition => %s)", (key, p))
        c.execute("SELECT outbox.enqueue('orders', %s, 'second')", (key,))
        c.execute("SELECT outbox.enqueue('orders', %s, 'third')", (key,))
        c.commit()
    pg.wait_published(4, timeout=90)
    mock_cluster.rtt("all", 0)
    got, _ = _consume_all(mock_cluster.bootstrap, "orders", 8, 3)
    assert [v for part, k, v in got if part == p] == [b"first", b"second", b"third"], got


@pytest.mark.parametrize("connections", [1, 4])
def test_an_event_is_not_failed_for_a_partition_it_did_not_name(kafka, make_relay, unique_topic, connections):
    """The topic is made anew with fewer partitions: a producer that still counts the old ones
    sends a key's event to a partition that is gone. The event named no partition, so that is a
    stale count, not the event's fault: it waits and is published, attempts unused, and its key's
    next event follows it."""
    kafka.create_topic(unique_topic, partitions=8)
    key = next(k for k in (f"k{i}" for i in range(1000)) if java_partition(k.encode(), 8) >= 4)
    pg = make_relay(kafka.bootstrap, kafka_connections=connections, max_attempts=1)
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue(%s, %s, 'before')", (unique_topic, key))
    pg.wait_published(1)
    admin = kafka._admin()
    admin.delete_topics([unique_topic])[unique_topic].result(60)
    wait_until(lambda: unique_topic not in admin.list_topics(timeout=5).topics, 60, "the topic deleted")
    # A new topic of that name can only be made once the deletion is through.
    wait_until(lambda: _created(kafka, unique_topic, 4), 60, "the topic made anew with 4 partitions")
    eid = pg.value("SELECT outbox.enqueue(%s, %s, 'after')::text", (unique_topic, key))
    later = pg.value("SELECT outbox.enqueue(%s, %s, 'later')::text", (unique_topic, key))
    wait_until(lambda: status_and_error(pg, later)[0] != "pending" or status_and_error(pg, eid)[0] == "failed",
               120, "the events settled")
    assert status_and_error(pg, eid)[0] == "published", status_and_error(pg, eid)
    assert status_and_error(pg, later)[0] == "published", status_and_error(pg, later)
    assert pg.value("SELECT attempts FROM outbox.events WHERE event_id::text = %s", (eid,)) == 0


def _created(kafka, topic, partitions):
    try:
        kafka.create_topic(topic, partitions=partitions)
        return True
    except Exception as e:  # the old topic's deletion still in progress
        if "already exists" in str(e) or "TOPIC_ALREADY_EXISTS" in str(e) or "marked for deletion" in str(e):
            return False
        raise


@pytest.mark.parametrize("connections,named", [(4, True), (1, False)])
def test_a_partitions_share_of_a_batch_leaves_in_one_record_batch(kafka, make_relay, unique_topic, connections,
                                                                  named):
    """The hand-over is grouped by partition (linger.ms is short), also with one connection and
    when one keyed event of the batch names its partition: a partition's share leaves in one
    request, as a rule. Counted from the broker's log."""
    kafka.create_topic(unique_topic, partitions=48)
    pg = make_relay(kafka.bootstrap, kafka_connections=connections)
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue(%s, 'warm', 'x')", (unique_topic,))
    pg.wait_published(1)
    n = 20000 - 1  # with the named one: one batch of the default outbox.batch_size
    with pg.connect(autocommit=False) as c:
        if named:
            c.execute("SELECT outbox.enqueue(%s, 'k-named', 'x', partition => 0)", (unique_topic,))
        c.execute("SELECT outbox.enqueue(%s, 'k' || i, 'x') FROM generate_series(1, %s) i", (unique_topic, n))
        c.commit()
    pg.wait_published(1 + n + named, timeout=180)
    batches = {p: len(ids) for p, ids in kafka.record_batches(unique_topic).items()}
    assert len(batches) == 48, batches
    # The warm-up's partition has one batch more, a batch cut by the claim two: the median says
    # how a partition's share left (grouped: 1; handed over in batch order, 4 or more).
    assert statistics.median(batches.values()) <= 2, batches
