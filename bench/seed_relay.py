#!/usr/bin/python3
"""The seed-style relay: the relay loop of "Using the Outbox Pattern for Reliable Billing Events"
(/work/shared/seeds), written the way its readers would write it with psycopg and confluent-kafka.

One transaction per tick: SELECT ... WHERE status = 'pending' ORDER BY created_at LIMIT 200
FOR UPDATE SKIP LOCKED, then for each row a produce, a flush (wait for that row's delivery) and an
UPDATE, then COMMIT; sleep 0.2 s when the queue is empty. Run several copies for several workers.

Differences from the article, all forced by the benchmark and none touching the algorithm:
  - the table is outbox.events (same table and data as the other relays), so "sent" is written
    'published' and sent_at is published_at;
  - published_at = clock_timestamp(), not now(): now() is the transaction start, i.e. the claim
    time of the whole batch, while the latency figures need the time of each row's broker ack;
  - it prints "ready" once connected to PostgreSQL and the brokers, then the cumulative number of
    published rows after each commit (for the harness);
  - SIGTERM stops it after the current tick.

Usage: seed_relay.py DSN BOOTSTRAP_SERVERS
"""

import signal
import sys
import time

import psycopg
from confluent_kafka import Producer

POLL_INTERVAL = 0.2   # seconds
BATCH = 200
MAX_ATTEMPTS = 8

stopping = False


class BrokerError(Exception):
    pass


class Broker:
    """broker.publish() of the article: produce one message and wait for its delivery."""

    def __init__(self, bootstrap):
        self.producer = Producer({"bootstrap.servers": bootstrap})

    def publish(self, topic, key, value, headers):
        result = []
        self.producer.produce(topic, key=key, value=value, headers=headers,
                              on_delivery=lambda err, msg: result.append(err))
        self.producer.flush()
        if not result or result[0] is not None:
            raise BrokerError(result[0] if result else "no delivery report")


def relay_tick(db, broker) -> int:
    with db.transaction():
        rows = db.execute(f"""
            SELECT id, event_id, key, topic, payload, attempts
              FROM outbox.events
             WHERE status = 'pending'
             ORDER BY created_at
             LIMIT {BATCH}
               FOR UPDATE SKIP LOCKED
        """).fetchall()
        for outbox_id, event_id, key, topic, payload, attempts in rows:
            try:
                broker.publish(topic=topic, key=key, value=payload,
                               headers={"event_id": str(event_id)})
                db.execute("UPDATE outbox.events SET status = 'published', published_at = clock_timestamp() "
                           "WHERE id = %s", (outbox_id,))
            except BrokerError:
                if attempts + 1 >= MAX_ATTEMPTS:
                    db.execute("UPDATE outbox.events SET status = 'failed', attempts = attempts + 1 "
                               "WHERE id = %s", (outbox_id,))
                else:
                    db.execute("UPDATE outbox.events SET attempts = attempts + 1 WHERE id = %s", (outbox_id,))
    return len(rows)


def relay_forever(db, broker):
    published = 0
    while not stopping:
        n = relay_tick(db, broker)
        if n == 0:
            time.sleep(POLL_INTERVAL)
        else:
            published += n
            print(published, flush=True)


def main():
    def stop(*_):
        global stopping
        stopping = True
    signal.signal(signal.SIGTERM, stop)
    dsn, bootstrap = sys.argv[1], sys.argv[2]
    broker = Broker(bootstrap)
    broker.producer.list_topics(timeout=30)  # connected to the cluster before the harness times us
    with psycopg.connect(dsn, autocommit=True) as db:
        print("ready", flush=True)
        relay_forever(db, broker)


if __name__ == "__main__":
    main()
