#!/usr/bin/python3
"""A competent hand-written batched relay: the seed-style relay's claim (one transaction,
SELECT ... WHERE status = 'pending' ORDER BY created_at LIMIT 200 FOR UPDATE SKIP LOCKED), but
the whole batch is produced asynchronously, flushed once, and recorded with one UPDATE before the
COMMIT. Idempotent producer (acks=all), Nagle off. Sleeps 0.2 s when the queue is empty.

Like seed_relay.py: outbox.events as the table, published_at = clock_timestamp() (the time the
batch's acks are in), "ready" printed once connected, then the cumulative count after each
commit; SIGTERM stops it.

Usage: batched_relay.py DSN BOOTSTRAP_SERVERS
"""

import signal
import sys
import time

import psycopg
from confluent_kafka import Producer

POLL_INTERVAL = 0.2
BATCH = 200

stopping = False


def relay_tick(db, producer) -> int:
    with db.transaction():
        rows = db.execute(f"""
            SELECT id, event_id, key, topic, payload
              FROM outbox.events
             WHERE status = 'pending'
             ORDER BY created_at
             LIMIT {BATCH}
               FOR UPDATE SKIP LOCKED
        """).fetchall()
        if not rows:
            return 0
        delivered = []
        failed = []

        def report(outbox_id):
            return lambda err, msg: (failed if err else delivered).append(outbox_id)

        for outbox_id, event_id, key, topic, payload in rows:
            producer.produce(topic, key=key, value=payload, headers={"event_id": str(event_id)},
                             on_delivery=report(outbox_id))
            producer.poll(0)
        producer.flush()
        db.execute("UPDATE outbox.events SET status = 'published', published_at = clock_timestamp() "
                   "WHERE id = ANY(%s)", (delivered,))
        if failed:
            db.execute("UPDATE outbox.events SET attempts = attempts + 1 WHERE id = ANY(%s)", (failed,))
    return len(delivered)


def main():
    def stop(*_):
        global stopping
        stopping = True
    signal.signal(signal.SIGTERM, stop)
    dsn, bootstrap = sys.argv[1], sys.argv[2]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 1, "socket.nagle.disable": True})
    producer.list_topics(timeout=30)  # connected to the cluster before the harness times us
    published = 0
    with psycopg.connect(dsn, autocommit=True) as db:
        print("ready", flush=True)
        while not stopping:
            n = relay_tick(db, producer)
            if n == 0:
                time.sleep(POLL_INTERVAL)
            else:
                published += n
                print(published, flush=True)


if __name__ == "__main__":
    main()
