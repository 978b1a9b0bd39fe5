#!/usr/bin/python3
"""Chaos run of the relay: writers in business transactions while a driver injects faults, then
a check of what reached Kafka against what committed.

- writers: each transaction locks an aggregate row (invoices, FOR UPDATE), bumps its per-key
  sequence number and enqueues one or two events carrying it, so per key commit order = sequence
  order; some transactions roll back; one writer runs with synchronous_commit = off.
- relay: outbox.workers = 3, three topics, librdkafka's mock cluster (3 brokers).
- faults, one per cycle, drawn with a fixed, printed seed: SIGKILL of a relay worker, immediate
  stop and restart of Postgres, every broker down and up again, retriable produce errors
  (NOT_ENOUGH_REPLICAS).
- truth: the database after the final recovery (a synchronous_commit = off commit may be lost
  by an immediate stop: then it must not be in Kafka either), plus every commit a synchronous
  writer saw acknowledged must have survived.

Asserts (exit status 1 otherwise): no committed event missing from Kafka (lost), none in Kafka
that did not commit (phantom), no acknowledged synchronous commit lost, per (topic, key) first
deliveries in sequence order, nothing failed. Duplicates are counted (at-least-once).

--exactly-once: outbox.delivery = exactly_once against a real Kafka broker (harness KafkaBroker,
KRaft, one node; the mock cluster writes no transaction markers), read back read_committed; the
faults are SIGKILL of a relay worker, immediate stop and restart of Postgres, and SIGKILL and
restart of the broker; duplicates must be 0 too.

    test/chaos/run --minutes 30 --cycles 100 --seed 42      # the long run (docs/chaos.md)
    test/chaos/run --seconds 75 --cycles 5                   # the short run of the test suite
    test/chaos/run --exactly-once --seconds 120 --cycles 8   # exactly once (docs/chaos.md)
"""

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import psycopg  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from harness.kafka_broker import KafkaBroker  # noqa: E402
from harness.kafka_reader import read_topic  # noqa: E402
from harness.mock_cluster import MockCluster  # noqa: E402
from harness.pg_cluster import PgCluster  # noqa: E402
from harness.wait import wait_until  # noqa: E402

# The mock cluster keeps at most 5 MB or 100,000 messages per partition and drops the oldest
# beyond: enough partitions, and writers paced, keep a 30-minute run well inside (checked).
TOPICS = {"chaos.a": 8, "chaos.b": 8, "chaos.c": 4}
WORKERS = 3
NOT_ENOUGH_REPLICAS = 19  # retriable: the producer retries it itself
FAULTS = ["kill_worker", "postgres_immediate_restart", "brokers_down_up", "produce_errors"]
# exactly_once runs against a real broker: its faults are a worker's, Postgres' and the broker's.
EXACTLY_ONCE_FAULTS = ["kill_worker", "postgres_immediate_restart", "broker_kill_restart"]


class Writer(threading.Thread):
    """Business transactions until told to stop; remembers what it committed or rolled back."""

    def __init__(self, pg, index, seed, keys, stop, synchronous=True, rollback_share=0.1):
        super().__init__(name=f"writer-{index}", daemon=True)
        self.pg, self.index, self.keys, self.stop_event = pg, index, keys, stop
        self.rng = random.Random(seed)
        self.synchronous = synchronous
        self.rollback_share = rollback_share
        self.acked = []         # event ids whose COMMIT returned
        self.rolled_back = []   # event ids of transactions this writer rolled back
        self.unknown = []       # event ids whose COMMIT got no answer (the server went away)
        self.errors = 0

    def run(self):
        conn = None
        while not self.stop_event.is_set():
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = self.pg.connect(autocommit=False)
                    if not self.synchronous:
                        conn.execute("SET synchronous_commit = off")
                        conn.commit()
                self.transaction(conn)
                # Pacing, not a wait for a condition: about 20 transactions a second per writer
                # keep the check at the end short and the mock's partitions untruncated.
                self.stop_event.wait(self.rng.uniform(0.02, 0.08))
            except psycopg.Error:
                self.errors += 1
                try:
                    conn.close()
                except Exception:
                    pass
                conn = None
                self.stop_event.wait(0.2)  # the server is restarting: try again shortly
        if conn is not None:
            conn.close()

    def transaction(self, conn):
        key = self.rng.choice(self.keys)
        events = []
        seq = conn.execute("SELECT seq FROM invoices WHERE key = %s FOR UPDATE", (key,)).fetchone()[0]
        for _ in range(self.rng.choice((1, 1, 2))):
            seq += 1
            event_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
            topic = self.rng.choice(list(TOPICS))
            conn.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb, NULL, %s::uuid)",
                         (topic, key, Jsonb({"key": key, "seq": seq, "writer": self.index}), event_id))
            events.append(event_id)
        conn.execute("UPDATE invoices SET seq = %s WHERE key = %s", (seq, key))
        if self.rng.random() < self.rollback_share:
            conn.rollback()
            self.rolled_back.extend(events)
            return
        try:
            conn.commit()
        except psycopg.OperationalError:
            self.unknown.extend(events)  # committed or not: the database after recovery decides
            raise
        self.acked.extend(events)


class Driver:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.faults = {kind: 0 for kind in (EXACTLY_ONCE_FAULTS if args.exactly_once else FAULTS)}
        self.log = []

    def say(self, message):
        line = f"[chaos {time.strftime('%H:%M:%S')}] {message}"
        self.log.append(line)
        print(line, flush=True)

    def inject(self, kind, pg, mock):
        if kind == "kill_worker":
            worker = self.rng.randrange(WORKERS)
            pid = wait_until(lambda: pg.value("SELECT pid FROM outbox.workers WHERE worker = %s", (worker,)), 60,
                             f"relay worker {worker} running")
            pg.expect_killed(pid)
            os.kill(pid, signal.SIGKILL)
            self.say(f"SIGKILL relay worker {worker} (pid {pid})")
        elif kind == "postgres_immediate_restart":
            pg.stop("immediate")
            self.say("postgres stopped -m immediate")
            time.sleep(self.rng.uniform(0.2, 2.0))  # the outage: writers and relay see no server
            pg.start()
            self.say("postgres started")
        elif kind == "brokers_down_up":
            for b in range(1, 4):
                mock.down(b)
            outage = self.rng.uniform(1.0, 6.0)
            self.say(f"all brokers down for {outage:.1f} s")
            time.sleep(outage)  # the fault's length, not a wait for a condition
            for b in range(1, 4):
                mock.up(b)
            self.say("all brokers up")
        elif kind == "broker_kill_restart":
            mock.kill()
            outage = self.rng.uniform(1.0, 6.0)
            self.say(f"broker SIGKILLed, down for {outage:.1f} s")
            time.sleep(outage)  # the fault's length, not a wait for a condition
            mock.restart()
            self.say("broker restarted")
        elif kind == "produce_errors":
            n = self.rng.randint(3, 30)
            mock.produce_errors(n, NOT_ENOUGH_REPLICAS)
            self.say(f"next {n} produce requests fail with NOT_ENOUGH_REPLICAS")
        self.faults[kind] += 1

    def run(self):
        args = self.args
        self.say(f"seed {args.seed}: {args.seconds:.0f} s, {args.cycles} fault cycles, {args.writers} writers, "
                 f"{WORKERS} relay workers, topics {TOPICS}")
        keys = [f"invoice-{i}" for i in range(args.keys)]
        with self.kafka() as mock:
            for topic, partitions in TOPICS.items() if args.exactly_once else ():
                mock.create_topic(topic, partitions)
            settings = {
                "outbox.bootstrap_servers": f"'{mock.bootstrap}'", "outbox.workers": str(WORKERS),
                "outbox.max_attempts": "1000", "outbox.publish_timeout": "'2s'", "outbox.retention": "0",
                "outbox.poll_interval": "'200ms'", "outbox.batch_size": "200",
                "outbox.kafka_properties": "'socket.connection.setup.timeout.ms=1000;reconnect.backoff.max.ms=200'",
                "fsync": "on",  # an immediate stop must lose only what was never flushed
            }
            if args.exactly_once:
                settings.update({"outbox.delivery": "'exactly_once'", "max_prepared_transactions": "8"})
            pg = PgCluster(settings=settings)
            try:
                pg.init().start().setup_database()
                return self.run_with(pg, mock, keys)
            finally:
                if os.environ.get("OUTBOX_CHAOS_KEEP_LOG"):
                    print(pg.log()[-20000:])
                pg.cleanup()

    def kafka(self):
        """The mock cluster (3 brokers), or for --exactly-once a real broker (its topics made once
        it runs)."""
        return KafkaBroker() if self.args.exactly_once else MockCluster(brokers=3, topics=TOPICS)

    def run_with(self, pg, mock, keys):
        args = self.args
        pg.sql("CREATE TABLE invoices (key text PRIMARY KEY, seq bigint NOT NULL)")
        pg.sql("INSERT INTO invoices SELECT k, 0 FROM unnest(%s::text[]) k", (keys,))
        pg.wait_workers_running(WORKERS)
        stop = threading.Event()
        writers = [Writer(pg, i, self.rng.getrandbits(64), keys, stop, synchronous=(i != 0))
                   for i in range(args.writers)]
        for w in writers:
            w.start()
        start = time.monotonic()
        interval = args.seconds / (args.cycles + 1)
        for cycle in range(args.cycles):
            # Faults at seeded times, spread over the run.
            at = start + interval * (cycle + 1) + self.rng.uniform(-interval / 3, interval / 3)
            time.sleep(max(0.0, at - time.monotonic()))
            kind = self.rng.choice(EXACTLY_ONCE_FAULTS if args.exactly_once else FAULTS)
            self.say(f"cycle {cycle + 1}/{args.cycles}: {kind}")
            self.inject(kind, pg, mock)
        time.sleep(max(0.0, start + args.seconds - time.monotonic()))
        stop.set()
        for w in writers:
            w.join(60)
        self.say("writers stopped; final recovery: an immediate stop and start")
        # The final recovery: what an immediate stop keeps is the truth (an async commit the
        # relay never claimed may go; one it claimed was flushed by the claim's commit).
        pg.stop("immediate")
        pg.start()
        pg.wait_workers_running(WORKERS, timeout=120)
        return self.verify(pg, mock, writers)

    def verify(self, pg, mock, writers):
        total = pg.value("SELECT count(*) FROM outbox.events")
        try:
            wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status IN ('published', 'failed')")
                       == total, 300, f"all {total} committed events published")
        except AssertionError as e:
            self.say(str(e))  # judged below: whatever is not in Kafka counts as lost
        rows = pg.sql("SELECT event_id::text, topic, (convert_from(payload, 'UTF8')::jsonb->>'seq')::bigint, status "
                      "FROM outbox.events")
        per_topic = {}
        for r in rows:
            per_topic[r[1]] = per_topic.get(r[1], 0) + 1
        records = {}
        for topic in TOPICS:
            records[topic] = [(r.partition, r.offset, r.event_id, r.value)
                              for r in read_topic(mock.bootstrap, topic, per_topic.get(topic, 0), timeout=600,
                                                  settle=True, config=self.read_config())]
            self.say(f"{topic}: {len(records[topic])} records read back, {per_topic.get(topic, 0)} committed")
        truncated = [] if self.args.exactly_once else truncated_partitions(mock.bootstrap)
        if truncated:
            self.say(f"the mock cluster dropped the oldest records of {truncated}: the run cannot be judged")
        report = judge(rows, records,
                       acked_sync={e for w in writers if w.synchronous for e in w.acked},
                       acked_async={e for w in writers if not w.synchronous for e in w.acked},
                       rolled_back={e for w in writers for e in w.rolled_back})
        report["mock_truncated_partitions"] = truncated
        report["ok"] = report["ok"] and not truncated
        if self.args.exactly_once:
            report["delivery"] = "exactly_once"
            report["ok"] = report["ok"] and report["duplicates"] == 0
        report.update({"seed": self.args.seed, "seconds": self.args.seconds, "cycles": self.args.cycles,
                       "faults": self.faults, "commit_unknown": sum(len(w.unknown) for w in writers),
                       "writer_errors": sum(w.errors for w in writers)})
        return report


    def read_config(self):
        # exactly_once's records are read as its consumers must read them.
        return {"isolation.level": "read_committed"} if self.args.exactly_once else None


def truncated_partitions(bootstrap):
    """Partitions whose log no longer starts at offset 0 (the mock's size limit dropped records)."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-watermarks"})
    try:
        return [f"{topic}[{p}]" for topic, n in TOPICS.items() for p in range(n)
                if consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] != 0]
    finally:
        consumer.close()


MUST_BE_ZERO = ("lost", "phantom", "acked_sync_lost", "rolled_back_in_kafka", "order_violations", "failed",
                "unpublished")


def judge(rows, records, acked_sync, acked_async, rolled_back):
    """rows: the events table after the final recovery, [(event_id, topic, seq, status)];
    records: {topic: [(partition, offset, event_id, value)]} read back from Kafka."""
    committed = {r[0] for r in rows}
    failed = [r[0] for r in rows if r[3] == "failed"]
    unpublished = [r[0] for r in rows if r[3] not in ("published", "failed")]
    seen, duplicates, order_violations, last_seq, n_records = set(), 0, [], {}, 0
    for topic, topic_records in records.items():
        n_records += len(topic_records)
        # First deliveries per (topic, key) in log order (a key lives on one partition of a
        # topic): their sequence numbers must rise.
        for partition, offset, event_id, value in sorted(topic_records, key=lambda r: (r[0], r[1])):
            if event_id in seen:
                duplicates += 1
                continue
            seen.add(event_id)
            body = json.loads(value)
            k = (topic, body["key"])
            if body["seq"] <= last_seq.get(k, 0):
                order_violations.append((topic, body["key"], last_seq[k], body["seq"]))
            last_seq[k] = body["seq"]
    lost = sorted(committed - seen)
    phantom = sorted(seen - committed)
    acked_sync_lost = sorted(acked_sync - committed)
    report = {
        "committed": len(committed), "in_kafka_unique": len(seen), "records_in_kafka": n_records,
        "duplicates": duplicates, "lost": len(lost), "phantom": len(phantom),
        "acked_sync_lost": len(acked_sync_lost), "rolled_back_in_kafka": len(rolled_back & seen),
        "order_violations": len(order_violations), "failed": len(failed), "unpublished": len(unpublished),
        "acked_sync": len(acked_sync), "acked_async": len(acked_async),
        "acked_async_lost": len(acked_async - committed), "rolled_back": len(rolled_back),
        "examples": {"lost": lost[:5], "phantom": phantom[:5], "acked_sync_lost": acked_sync_lost[:5],
                     "order_violations": order_violations[:5], "failed": failed[:5]},
    }
    report["ok"] = all(report[k] == 0 for k in MUST_BE_ZERO)
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, help="run length in minutes")
    p.add_argument("--seconds", type=float, default=75.0, help="run length in seconds (default 75)")
    p.add_argument("--cycles", type=int, default=5, help="fault cycles (default 5)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: drawn and printed)")
    p.add_argument("--writers", type=int, default=4, help="writer threads, one of them asynchronous (default 4)")
    p.add_argument("--keys", type=int, default=40, help="aggregates (keys) the writers update (default 40)")
    p.add_argument("--json", help="also write the report to this file")
    p.add_argument("--exactly-once", action="store_true",
                   help="outbox.delivery = exactly_once against a real Kafka broker, read read_committed")
    args = p.parse_args(argv)
    if args.minutes is not None:
        args.seconds = args.minutes * 60
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    report = Driver(args).run()
    print("CHAOS REPORT " + json.dumps(report, sort_keys=True), flush=True)
    print(f"chaos seed {report['seed']}: committed {report['committed']}, in Kafka {report['in_kafka_unique']} "
          f"(+{report['duplicates']} duplicates), lost {report['lost']}, phantom {report['phantom']}, "
          f"order violations {report['order_violations']}, failed {report['failed']}, faults {report['faults']}: "
          + ("OK" if report["ok"] else "FAILED"), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
