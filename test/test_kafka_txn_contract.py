"""What exactly-once delivery (issue 18) is to rely on from Kafka itself, pinned against the real
broker before the relay builds on it (docs/design/exactly-once.md, "The design to build": the
batch's Postgres record is prepared, the Kafka transaction commits the batch together with an
offset of a group of the slot's own, and recovery decides the prepared transaction by that
offset). With Python's Kafka client (on the system's librdkafka), not the relay:

- a transactional producer commits an offset for a group that has no members (its id the
  producer's transactional.id) on a partition of a topic of its choosing, in the same
  transaction as its records; an aborted transaction's offset is not committed;
- while such a transaction is open, a read_committed client's read of the group's committed
  offset gives no answer (KIP-447's require_stable), never the offset from before it;
- a producer of the same transactional.id, once initialised, has fenced a producer that died
  mid-transaction and aborted what it left open: the read then gives the offset of the last
  committed transaction, and read_committed consumers never see the aborted records (a
  read_uncommitted one does: they are in the log)."""

import subprocess
import sys
import textwrap

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from harness.kafka_broker import KafkaBroker
from harness.kafka_reader import read_topic

EVENTS = "contract.events"
ANCHOR = "contract.anchor"  # the partition the group's offset is committed for


@pytest.fixture(scope="module")
def kafka():
    with KafkaBroker() as kb:
        kb.create_topic(EVENTS, partitions=1)
        kb.create_topic(ANCHOR, partitions=1)
        yield kb


def producer(kafka, transactional_id):
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": transactional_id,
                  "transaction.timeout.ms": 60000})
    p.init_transactions(60)
    return p


def group_metadata(kafka, group):
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return c.consumer_group_metadata()
    finally:
        c.close()


def batch(kafka, p, transactional_id, seq, commit=True):
    """One Kafka transaction: a record naming the batch, and the group's offset = seq."""
    p.begin_transaction()
    p.produce(EVENTS, key=transactional_id, value=f"batch {seq}")
    p.send_offsets_to_transaction([TopicPartition(ANCHOR, 0, seq)], group_metadata(kafka, transactional_id), 60)
    if commit:
        p.commit_transaction(60)
    else:
        p.flush(60)  # in the log before the abort (an abort purges what was not sent yet)
        p.abort_transaction(60)


def committed(kafka, group, timeout=30):
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        return c.committed([TopicPartition(ANCHOR, 0)], timeout=timeout)[0].offset
    finally:
        c.close()


def own_values(kafka, transactional_id, isolation):
    """The values of the records keyed with this id (the tests share the topic), in log order."""
    records = read_topic(kafka.bootstrap, EVENTS, 1, timeout=30, settle=True, config={"isolation.level": isolation})
    return [r.value.decode() for r in records if r.key == transactional_id.encode()]


# A producer that begins a transaction with a record and the group's offset, and dies with it
# open (SIGKILL once it said so).
DYING_PRODUCER = textwrap.dedent("""
    import sys
    from confluent_kafka import Consumer, Producer, TopicPartition
    bootstrap, tid, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": 60000})
    p.init_transactions(60)
    p.begin_transaction()
    p.produce("%s", key=tid, value=f"batch {seq}")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": tid, "enable.auto.commit": False})
    p.send_offsets_to_transaction([TopicPartition("%s", 0, seq)], c.consumer_group_metadata(), 60)
    p.flush(60)
    print("open", flush=True)
    sys.stdin.read()
""" % (EVENTS, ANCHOR))


def test_the_offset_commits_and_aborts_with_the_batch(kafka):
    tid = "contract-commit"
    p = producer(kafka, tid)
    batch(kafka, p, tid, 1)
    assert committed(kafka, tid) == 1
    batch(kafka, p, tid, 2, commit=False)
    assert committed(kafka, tid) == 1
    batch(kafka, p, tid, 2)
    assert committed(kafka, tid) == 2
    assert own_values(kafka, tid, "read_committed") == ["batch 1", "batch 2"]
    assert own_values(kafka, tid, "read_uncommitted") == ["batch 1", "batch 2", "batch 2"]


def test_an_offset_for_a_partition_that_does_not_exist_is_refused(kafka):
    """The partition the offset hangs on must exist: the design names one of its own."""
    tid = "contract-unknown"
    p = producer(kafka, tid)
    p.begin_transaction()
    p.produce(EVENTS, key=tid, value="batch 1")
    try:
        # The broker refuses at once; librdkafka 2.0.2 returns its answer only at the call's
        # timeout (so a short one), and then the broker's error, not a timeout of its own.
        with pytest.raises(KafkaException) as refused:
            p.send_offsets_to_transaction([TopicPartition("contract.no-such-topic", 0, 1)],
                                          group_metadata(kafka, tid), 5)
            p.commit_transaction(30)
        assert refused.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, refused.value
    finally:
        p.abort_transaction(30)  # an open transaction would hold the topic's last stable offset
    assert committed_anywhere(kafka, tid, "contract.no-such-topic") in (None, -1001)
    assert "batch 1" not in own_values(kafka, tid, "read_committed")


def committed_anywhere(kafka, group, topic):
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        return c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    except KafkaException:
        return None
    finally:
        c.close()


def test_a_producer_that_died_mid_transaction_is_fenced_and_its_offset_never_read(kafka):
    tid = "contract-dying"
    p = producer(kafka, tid)
    batch(kafka, p, tid, 1)
    p.flush(10)
    del p
    dying = subprocess.Popen([sys.executable, "-c", DYING_PRODUCER, kafka.bootstrap, tid, "2"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert dying.stdout.readline().strip() == "open", "the dying producer did not open its transaction"
        # The transaction holding offset 2 is open: no answer rather than the offset before it
        # (the broker says UNSTABLE_OFFSET_COMMIT, librdkafka asks again until the timeout).
        with pytest.raises(KafkaException) as unanswered:
            committed(kafka, tid, timeout=5)
        assert unanswered.value.args[0].code() in (KafkaError._TIMED_OUT, KafkaError.UNSTABLE_OFFSET_COMMIT), \
            unanswered.value
    finally:
        dying.kill()
        dying.wait(30)
    # A new producer of the id: initialising it fences the dead one and aborts its transaction.
    successor = producer(kafka, tid)
    assert committed(kafka, tid) == 1
    batch(kafka, successor, tid, 2)
    assert committed(kafka, tid) == 2
    assert own_values(kafka, tid, "read_committed") == ["batch 1", "batch 2"]
    assert own_values(kafka, tid, "read_uncommitted") == ["batch 1", "batch 2", "batch 2"], \
        "the aborted transaction's record is in the log (read_uncommitted sees it)"
