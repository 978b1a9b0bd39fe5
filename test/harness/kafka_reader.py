"""Reads a topic back with a real Kafka consumer (confluent-kafka) and checks what arrived:
lost, duplicated, and per-key order of first deliveries."""

import time
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition


@dataclass
class Record:
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: dict
    timestamp: tuple = None  # (timestamp type, ms): confluent_kafka's Message.timestamp()
    raw_headers: list = None  # [(name, bytes)] as the record carries them

    @property
    def event_id(self):
        return self.headers.get("event_id")


def read_topic(bootstrap, topic, expected, timeout=60.0, settle=False, config=None):
    """All records of every partition of `topic`, from the beginning, once at least `expected`
    have arrived (or the deadline passes). With settle=True, keeps reading until no new record
    has come for a while after reaching `expected` (to catch duplicates). `config`: more
    consumer properties (TLS, SASL)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "outbox-test-reader",
                         "enable.auto.commit": False, "enable.partition.eof": False,
                         "socket.connection.setup.timeout.ms": 5000, **(config or {})})
    try:
        deadline = time.monotonic() + timeout
        metadata = None
        while time.monotonic() < deadline:
            metadata = consumer.list_topics(topic, timeout=5)
            t = metadata.topics.get(topic)
            if t is not None and t.error is None and t.partitions:
                break
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records = []
        quiet_until = None
        while time.monotonic() < deadline:
            # In batches: one poll() per record reads a few thousand records a second, too slow
            # for a chaos run's hundreds of thousands.
            batch = consumer.consume(1000, 0.2)
            if not batch:
                if len(records) >= expected:
                    if not settle:
                        break
                    if quiet_until is None:
                        quiet_until = time.monotonic() + 2.0
                    elif time.monotonic() > quiet_until:
                        break
                continue
            for msg in batch:
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(msg.error())
                quiet_until = None
                headers = {k: (v.decode() if v is not None else None) for k, v in (msg.headers() or [])}
                records.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value(), headers,
                                      msg.timestamp(), list(msg.headers() or [])))
        return records
    finally:
        consumer.close()


@dataclass
class Check:
    delivered: int = 0
    unique: int = 0
    lost: list = field(default_factory=list)
    duplicates: int = 0
    order_violations: list = field(default_factory=list)


def check_delivery(records, expected_ids_in_order_by_key):
    """expected_ids_in_order_by_key: {key: [event_id, ...] in enqueue order}.
    Per-key order is judged on first deliveries in partition (append) order."""
    check = Check(delivered=len(records))
    seen = set()
    first_order = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.event_id in seen:
            check.duplicates += 1
            continue
        seen.add(r.event_id)
        first_order.setdefault(r.key.decode() if r.key is not None else None, []).append(r.event_id)
    check.unique = len(seen)
    for key, ids in expected_ids_in_order_by_key.items():
        for eid in ids:
            if eid not in seen:
                check.lost.append(eid)
        got = [e for e in first_order.get(key, []) if e in set(ids)]
        want = [e for e in ids if e in seen]
        if got != want:
            check.order_violations.append(key)
    return check
