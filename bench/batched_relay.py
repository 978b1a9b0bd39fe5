#!/usr/bin/python3
"""Hand-written batched relays, two variants of one loop: one transaction per batch, a locking
claim (FOR UPDATE SKIP LOCKED), async produce of the whole batch, one flush, one UPDATE of the
delivered rows, COMMIT. Idempotent producer (acks=all), Nagle off. Sleeps 0.2 s when empty.

  naive (default): the articles' claim, SELECT ... ORDER BY created_at LIMIT 200, and
      published_at = clock_timestamp() (the time the batch's acks are in).
  --tuned: what a competent engineer tunes it to: SELECT id, topic, key, payload, headers ...
      ORDER BY id LIMIT 5000 (the pending index on id, batches as large as the relay's), and
      UPDATE ... SET status = 'published', published_at = now(); JIT off in its session (the claim
      is costed high on an unanalyzed backlog, and a JIT compile per claim would cost more than
      the claim itself).

Both also select event_id and send it as the header event_id, as every relay in the bench does
(the verification identifies each message by it). Both print "ready" once connected, then after each commit "<cumulative published> <epoch>",
epoch = wall clock when the batch's flush returned (all acks in): the harness times a drain by
it, since --tuned's published_at is the transaction start. SIGTERM stops after the current batch.

Usage: batched_relay.py DSN BOOTSTRAP_SERVERS [--tuned]
"""

import signal
import sys
import time

import psycopg
from confluent_kafka import Producer

POLL_INTERVAL = 0.2

NAIVE = {"batch": 200, "order": "created_at", "published_at": "clock_timestamp()", "jit": True}
TUNED = {"batch": 5000, "order": "id", "published_at": "now()", "jit": False}

stopping = False


def relay_tick(db, producer, v):
    """One batch; returns (published, epoch of the flush's return)."""
    with db.transaction():
        rows = db.execute(f"""
            SELECT id, event_id, topic, key, payload, headers
              FROM outbox.events
             WHERE status = 'pending'
             ORDER BY {v['order']}
             LIMIT {v['batch']}
               FOR UPDATE SKIP LOCKED
        """).fetchall()
        if not rows:
            return 0, None
        delivered = []
        failed = []

        def report(outbox_id):
            return lambda err, msg: (failed if err else delivered).append(outbox_id)

        for outbox_id, event_id, topic, key, payload, headers in rows:
            hdrs = dict(headers or {}, event_id=str(event_id))
            producer.produce(topic, key=key, value=payload, headers=hdrs, on_delivery=report(outbox_id))
            producer.poll(0)
        producer.flush()
        acked = time.time()
        db.execute(f"UPDATE outbox.events SET status = 'published', published_at = {v['published_at']} "
                   "WHERE id = ANY(%s)", (delivered,))
        if failed:
            db.execute("UPDATE outbox.events SET attempts = attempts + 1 WHERE id = ANY(%s)", (failed,))
    return len(delivered), acked


def main():
    def stop(*_):
        global stopping
        stopping = True
    signal.signal(signal.SIGTERM, stop)
    dsn, bootstrap = sys.argv[1], sys.argv[2]
    v = TUNED if "--tuned" in sys.argv[3:] else NAIVE
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 1, "socket.nagle.disable": True})
    producer.list_topics(timeout=30)  # connected to the cluster before the harness times us
    published = 0
    with psycopg.connect(dsn, autocommit=True) as db:
        if not v["jit"]:
            db.execute("SET jit = off")
        print("ready", flush=True)
        while not stopping:
            n, acked = relay_tick(db, producer, v)
            if n == 0:
                time.sleep(POLL_INTERVAL)
            else:
                published += n
                print(published, acked, flush=True)


if __name__ == "__main__":
    main()
