"""A real Postgres consumer of the billing demo's events (test/demo/billing_demo.py): it keeps
per-subscription balances in a database of its own and gets exactly-once effects from
at-least-once delivery with outbox.consume_once(), in the pattern docs/consumers.md documents:

    consume a record -> BEGIN; consume_once(consumer, event_id); apply only if true; COMMIT
                     -> then commit the record's Kafka offset

A crash anywhere in between redelivers the record: before COMMIT nothing of it is left (it is
applied then), after COMMIT its mark is there (consume_once says false, nothing is applied)."""

import json
import time
import uuid

import psycopg
from confluent_kafka import Consumer, KafkaError, TopicPartition

CONSUMER = "invoice-projector"

# The consumer's own database: what it applies, with an append-only log of each application so
# that a second application of an event would show (no unique constraint on purpose).
LEDGER_SCHEMA_SQL = """
CREATE TABLE balances (
    subscription_id text   PRIMARY KEY,
    invoiced_cents  bigint NOT NULL DEFAULT 0,
    paid_cents      bigint NOT NULL DEFAULT 0,
    failed_payments int    NOT NULL DEFAULT 0
);
CREATE TABLE applied (
    event_id   uuid NOT NULL,
    kind       text NOT NULL,
    invoice_id text NOT NULL
);
-- The consumer's role: its tables, and consume_once (docs/privileges.md), nothing else.
CREATE ROLE invoice_projector LOGIN;
GRANT SELECT, INSERT, UPDATE ON balances, applied TO invoice_projector;
GRANT USAGE ON SCHEMA outbox TO invoice_projector;
GRANT EXECUTE ON FUNCTION outbox.consume_once(text, uuid) TO invoice_projector;
"""

# What each kind of event does to the subscription's balance.
APPLY_SQL = {
    "invoice.created": "invoiced_cents = invoiced_cents + %(amount)s",
    "invoice.paid": "paid_cents = paid_cents + %(amount)s",
    "payment.failed": "failed_payments = failed_payments + 1",
}


class Crash(Exception):
    """The projector 'process' died: the caller throws this consumer away and starts another."""


class InvoiceProjector:
    """One consumer process: a Kafka consumer in group `group` and a connection to the ledger.

    seen[event_id] = [consume_once results in order], committed or not; crash_before_commit /
    crash_after_commit: event ids whose handling dies (the backend is terminated before the
    database COMMIT, or the process stops after it but before the offset commit)."""

    def __init__(self, bootstrap, ledger, topics, group, seen,
                 crash_before_commit=(), crash_after_commit=()):
        self.ledger = ledger
        self.seen = seen
        self.crash_before_commit = set(crash_before_commit)
        self.crash_after_commit = set(crash_after_commit)
        self.db = psycopg.connect(host=ledger.tmp, port=ledger.port, dbname=ledger.database,
                                  user="invoice_projector", autocommit=True)
        self.kafka = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                               "enable.auto.commit": False, "auto.offset.reset": "earliest",
                               "enable.partition.eof": False,
                               "socket.connection.setup.timeout.ms": 5000})
        self.kafka.subscribe(list(topics))

    def close(self):
        """Stop like a crashed process would: no offset commit, the connection dropped."""
        try:
            self.kafka.close()
        finally:
            self.db.close()

    def run(self, until, timeout=90.0):
        """Handles records until until() is true. Returns how many records it handled."""
        handled = 0
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise AssertionError(f"{CONSUMER}: not done after {timeout}s ({handled} records handled)")
            for msg in self.kafka.consume(100, 0.2):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(msg.error())
                self.handle(msg)
                handled += 1
        return handled

    def handle(self, msg):
        headers = {k: v.decode() for k, v in (msg.headers() or [])}
        event_id = str(uuid.UUID(headers["event_id"]))
        event = json.loads(msg.value())
        try:
            with self.db.transaction():
                first = self.db.execute("SELECT outbox.consume_once(%s, %s)", (CONSUMER, event_id)).fetchone()[0]
                self.seen.setdefault(event_id, []).append(first)
                if first:
                    self.apply(event_id, event)
                if event_id in self.crash_before_commit:
                    self.crash_before_commit.discard(event_id)
                    # The backend dies (waited for) with the transaction open: the server rolls it back.
                    self.ledger.sql("SELECT pg_terminate_backend(%s, 10000)", (self.db.info.backend_pid,))
        except psycopg.OperationalError as e:
            raise Crash(f"connection lost while handling {event_id}") from e
        if event_id in self.crash_after_commit:
            self.crash_after_commit.discard(event_id)
            raise Crash(f"stopped after committing {event_id}, before its offset")
        self.kafka.commit(message=msg, asynchronous=False)

    def apply(self, event_id, event):
        params = {"subscription": event["subscription"], "amount": event["amount_cents"]}
        self.db.execute("INSERT INTO balances (subscription_id) VALUES (%(subscription)s) "
                        "ON CONFLICT (subscription_id) DO NOTHING", params)
        self.db.execute(f"UPDATE balances SET {APPLY_SQL[event['type']]} "
                        "WHERE subscription_id = %(subscription)s", params)
        self.db.execute("INSERT INTO applied (event_id, kind, invoice_id) VALUES (%s, %s, %s)",
                        (event_id, event["type"], event["invoice"]))


def reset_offsets_to_beginning(bootstrap, group, topics, partitions):
    """Moves the (idle) group's committed offsets back to the start of every partition, as an
    operator replaying a topic would."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        offsets = [TopicPartition(t, p, 0) for t in topics for p in range(partitions)]
        c.commit(offsets=offsets, asynchronous=False)
        committed = c.committed([TopicPartition(t, p) for t in topics for p in range(partitions)], timeout=10)
        assert all(tp.offset == 0 for tp in committed), committed
    finally:
        c.close()
