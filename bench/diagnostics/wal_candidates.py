"""WAL floors of candidate queue designs (issue 16): the statements each design would run per
event and per batch, in SQL alone (no relay, no Kafka: offsets are made up), on the same events
as bench/wal_cost.py (EVENTS events in transactions of 100 over 1,000 keys, ~150 bytes of JSON),
with a CHECKPOINT before each design and, with CHECKPOINTS=steps, before every step too.

- current: outbox.events as it is (six indexes), the claim locks the batch, one UPDATE records
  status, partition and offset per event (not HOT), retention DELETEs the rows.
- hot_record: the same columns, indexed only on what the record does not change (id, event_id,
  order_lsn): the record UPDATE is HOT (fillfactor 50), retention DELETEs.
- delete_on_publish: a lean queue (two indexes: the claim order and the event_id dedup), the
  claim locks the batch, the record DELETEs it and writes one landing row per (batch, topic,
  partition): base offset plus the events' ids in offset order.
- insert_only: the queue is only ever INSERTed into (PgQ's way): the claim locks the lanes'
  cursor rows FOR UPDATE SKIP LOCKED, reads the events after the cursor, the record moves the
  cursor once per batch and writes the landing rows; retention TRUNCATEs a rotated table.
- debezium / plain: the baselines of bench/wal_cost.py.

Run as an unprivileged user with the server's programs first in PATH:
    PATH=/usr/lib/postgresql/15/bin:$PATH python3 bench/diagnostics/wal_candidates.py
EVENTS (default 20000), BATCH (default 2000), RUNS (default 3), CHECKPOINTS (shape | steps)."""
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster  # noqa: E402

N = int(os.environ.get("EVENTS", "20000"))
BATCH = int(os.environ.get("BATCH", "2000"))
RUNS = int(os.environ.get("RUNS", "3"))
CHECKPOINTS = os.environ.get("CHECKPOINTS", "shape")
PER_TX = 100
PARTITIONS = 12

EVENTS = ("SELECT i, 'sub-' || lpad((abs(hashint4(i)) % 1000)::text, 5, '0') AS k, "
          "convert_to(jsonb_build_object('event', 'invoice.paid', 'invoice_id', 'inv-' || i, 'subscription_id', "
          "'sub-' || lpad((abs(hashint4(i)) % 1000)::text, 5, '0'), 'amount_cents', 1000 + i % 9000, "
          "'currency', 'EUR', 'period', '2026-11')::text, 'UTF8') AS p "
          "FROM generate_series({lo}, {hi}) i ORDER BY i")

LEAN_COLUMNS = """
    id bigint GENERATED ALWAYS AS IDENTITY,
    event_id uuid NOT NULL,
    topic text NOT NULL,
    key text,
    lane smallint NOT NULL,
    order_lsn pg_lsn NOT NULL DEFAULT pg_current_wal_insert_lsn(),
    payload bytea,
    headers jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    attempts integer,
    next_attempt_at timestamptz,
    last_error text"""

LANDING = """CREATE TABLE bench.landing (batch bigint NOT NULL, topic text NOT NULL, kafka_partition int NOT NULL,
    base_offset bigint NOT NULL, event_ids uuid[] NOT NULL, published_at timestamptz NOT NULL DEFAULT now())"""

DESIGNS = {
    "current": {
        "ddl": ["CREATE TABLE bench.q (LIKE outbox.events INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING INDEXES)"],
        "insert": "INSERT INTO bench.q (event_id, topic, key, lane, payload) SELECT gen_random_uuid(), 'invoice', k, "
                  "abs(hashtext(k)) % 1024, p FROM ({events}) s",
        "claim": "SELECT id, event_id FROM bench.q WHERE status = 'pending' ORDER BY order_lsn, id LIMIT {batch} "
                 "FOR UPDATE SKIP LOCKED",
        "record": "UPDATE bench.q SET status = 'published', published_at = now(), kafka_partition = mod(id, 12)::int, "
                  "kafka_offset = id WHERE id = ANY(%s)",
        "retention": "DELETE FROM bench.q WHERE status = 'published'",
    },
    "hot_record": {
        "ddl": ["CREATE TABLE bench.q (LIKE outbox.events INCLUDING DEFAULTS INCLUDING IDENTITY) WITH (fillfactor = 50)",
                "ALTER TABLE bench.q ADD PRIMARY KEY (id)", "CREATE UNIQUE INDEX ON bench.q (event_id)",
                "CREATE INDEX ON bench.q (order_lsn, id)"],
        "insert": "INSERT INTO bench.q (event_id, topic, key, lane, payload) SELECT gen_random_uuid(), 'invoice', k, "
                  "abs(hashtext(k)) % 1024, p FROM ({events}) s",
        "claim": "SELECT id, event_id FROM bench.q WHERE order_lsn >= %s::pg_lsn AND status = 'pending' "
                 "ORDER BY order_lsn, id LIMIT {batch} FOR UPDATE SKIP LOCKED",
        "record": "UPDATE bench.q SET status = 'published', published_at = now(), kafka_partition = mod(id, 12)::int, "
                  "kafka_offset = id WHERE id = ANY(%s)",
        "retention": "DELETE FROM bench.q WHERE status = 'published'",
        "cursor": True,
    },
    "delete_on_publish": {
        "ddl": [f"CREATE TABLE bench.q ({LEAN_COLUMNS})", "CREATE INDEX ON bench.q (order_lsn, id)",
                "CREATE UNIQUE INDEX ON bench.q (event_id)", LANDING],
        "insert": "INSERT INTO bench.q (event_id, topic, key, lane, payload) SELECT gen_random_uuid(), 'invoice', k, "
                  "abs(hashtext(k)) % 1024, p FROM ({events}) s",
        "claim": "SELECT id, event_id FROM bench.q ORDER BY order_lsn, id LIMIT {batch} FOR UPDATE SKIP LOCKED",
        "record": "DELETE FROM bench.q WHERE id = ANY(%s)",
        "landing": True,
        "retention": "DELETE FROM bench.landing",
    },
    "insert_only": {
        "ddl": [f"CREATE TABLE bench.q ({LEAN_COLUMNS})", "CREATE INDEX ON bench.q (order_lsn, id)",
                "CREATE UNIQUE INDEX ON bench.q (event_id)", LANDING,
                "CREATE TABLE bench.cursor (lane int PRIMARY KEY, order_lsn pg_lsn NOT NULL, id bigint NOT NULL)",
                "INSERT INTO bench.cursor SELECT l, '0/0', 0 FROM generate_series(0, 0) l"],
        "insert": "INSERT INTO bench.q (event_id, topic, key, lane, payload) SELECT gen_random_uuid(), 'invoice', k, "
                  "abs(hashtext(k)) % 1024, p FROM ({events}) s",
        "lock_cursor": "SELECT order_lsn, id FROM bench.cursor WHERE lane = 0 FOR UPDATE SKIP LOCKED",
        "claim": "SELECT q.id, q.event_id, q.order_lsn FROM bench.q q WHERE (q.order_lsn, q.id) > (%s::pg_lsn, %s) "
                 "ORDER BY q.order_lsn, q.id LIMIT {batch}",
        "record": "UPDATE bench.cursor SET order_lsn = %s::pg_lsn, id = %s WHERE lane = 0",
        "landing": True,
        "retention": "TRUNCATE bench.q",
    },
    "debezium": {
        "ddl": ["CREATE TABLE bench.q (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, "
                "aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)"],
        "insert": "INSERT INTO bench.q SELECT gen_random_uuid(), 'invoice', k, 'invoice.paid', "
                  "convert_from(p, 'UTF8')::jsonb FROM ({events}) s; DELETE FROM bench.q",
    },
    "plain": {
        "ddl": ["CREATE TABLE bench.q (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id uuid NOT NULL, "
                "aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, "
                "payload jsonb)"],
        "insert": "INSERT INTO bench.q (event_id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), "
                  "'invoice', k, 'invoice.paid', convert_from(p, 'UTF8')::jsonb FROM ({events}) s",
    },
}


def lsn(c):
    return c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]


def diff(c, a, b):
    return int(c.execute("SELECT pg_wal_lsn_diff(%s, %s)", (b, a)).fetchone()[0])


def run_design(pg, name, d):
    steps = {}
    with pg.connect(autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS bench.q, bench.landing, bench.cursor")
        for stmt in d["ddl"]:
            c.execute(stmt)
        c.execute("CHECKPOINT")

        def measure(step, work):
            if CHECKPOINTS == "steps":
                c.execute("CHECKPOINT")
            a = lsn(c)
            work()
            steps[step] = diff(c, a, lsn(c)) / N

        def write():
            for lo in range(0, N, PER_TX):
                with c.transaction():
                    for stmt in d["insert"].format(events=EVENTS.format(lo=lo, hi=min(lo + PER_TX, N) - 1)).split("; "):
                        c.execute(stmt)
        measure("write", write)
        if "claim" not in d:
            measure("vacuum", lambda: c.execute("VACUUM bench.q"))
            return steps

        def publish():
            batch_no = 0
            position = ("0/0", 0)
            while True:
                with c.transaction():
                    if "lock_cursor" in d:
                        position = c.execute(d["lock_cursor"]).fetchone()
                        rows = c.execute(d["claim"].format(batch=BATCH), position).fetchall()
                    elif d.get("cursor"):
                        rows = c.execute(d["claim"].format(batch=BATCH), (position[0],)).fetchall()
                    else:
                        rows = c.execute(d["claim"].format(batch=BATCH)).fetchall()
                    if not rows:
                        return
                    batch_no += 1
                    ids = [r[0] for r in rows]
                    if "lock_cursor" in d:
                        c.execute(d["record"], (rows[-1][2], rows[-1][0]))
                    else:
                        c.execute(d["record"], (ids,))
                    if d.get("landing"):
                        by_partition = {}
                        for r in rows:
                            by_partition.setdefault(r[0] % PARTITIONS, []).append(r[1])
                        for part, event_ids in by_partition.items():
                            c.execute("INSERT INTO bench.landing (batch, topic, kafka_partition, base_offset, event_ids) "
                                      "VALUES (%s, 'invoice', %s, %s, %s)", (batch_no, part, batch_no * BATCH, event_ids))
                    if d.get("cursor"):
                        position = (c.execute("SELECT max(order_lsn) FROM bench.q WHERE id = ANY(%s)",
                                              (ids,)).fetchone()[0], 0)
        measure("publish", publish)
        measure("retention", lambda: c.execute(d["retention"]))
        measure("vacuum", lambda: c.execute("VACUUM bench.q"))
    return steps


def main():
    pg = PgCluster(settings={"fsync": "on", "shared_preload_libraries": "'outbox'", "outbox.workers": "0"})
    pg.init().start().setup_database()
    results = {name: [] for name in DESIGNS}
    try:
        pg.sql("CREATE SCHEMA bench")
        for run in range(RUNS):
            for name, d in DESIGNS.items():
                results[name].append(run_design(pg, name, d))
    finally:
        pg.cleanup()
    print(f"WAL bytes per event, median of {RUNS} runs, {N} events, batches of {BATCH}, checkpoints: {CHECKPOINTS}")
    base = None
    for name, runs in results.items():
        steps = {s: statistics.median(r[s] for r in runs) for s in runs[0]}
        total = sum(v for s, v in steps.items() if s != "vacuum")
        if name == "debezium":
            base = total
        results[name] = (steps, total)
    for name, (steps, total) in results.items():
        ratio = f"{total / base:.2f}x Debezium" if base else ""
        print(f"{name:18s} {total:7.0f} B/event (+ vacuum {steps.get('vacuum', 0):4.0f})  {ratio:16s} "
              + ", ".join(f"{s} {v:.0f}" for s, v in steps.items()))


if __name__ == "__main__":
    main()
