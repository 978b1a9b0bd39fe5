"""Floors of record shapes on 100k rows of outbox.events' shape, batches of 20,000, no Kafka:
current (partial pending index, status+published_at change: non-HOT) vs a HOT-able record
(no index on a column the record changes, fillfactor 50, claim by id cursor over the primary key)."""
import os, sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster

N = 100_000
B = int(os.environ.get("BATCH", "20000"))
pg = PgCluster(settings={"fsync": "on", "shared_preload_libraries": "'outbox'", "outbox.workers": "0"})
pg.init().start().setup_database()
try:
    pg.sql("CREATE SCHEMA bench")
    # a dataset of real enqueue rows
    pg.sql(f"""SELECT count(outbox.enqueue('t' || (i % 4), 'sub-' || lpad((abs(hashint4(i)) % 1000)::text, 5, '0'),
              jsonb_build_object('event', 'invoice.paid', 'invoice_id', 'inv-' || i, 'amount_cents', 1000 + i % 9000,
              'currency', 'EUR', 'period', '2026-11', 'customer_email', 'customer-' || (i % 997) || '@example.com')))
              FROM generate_series(1, {N}) i""")
    pg.sql("CREATE TABLE bench.src AS SELECT * FROM outbox.events ORDER BY id")
    shapes = {
        # the relay's table as it is
        "current": ("CREATE TABLE bench.t (LIKE outbox.events INCLUDING ALL)", False),
        # HOT-able: only id and event_id indexed, room on every page
        "hot": ("CREATE TABLE bench.t (LIKE outbox.events INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH (fillfactor = 50);"
                "ALTER TABLE bench.t ADD PRIMARY KEY (id); CREATE UNIQUE INDEX ON bench.t (event_id)", True),
        "delete": ("CREATE TABLE bench.t (LIKE outbox.events INCLUDING ALL)", False),
    }
    res = {}
    for run in range(3):
        for name, (ddl, hot) in shapes.items():
            pg.sql("DROP TABLE IF EXISTS bench.t")
            for stmt in ddl.split(";"):
                pg.sql(stmt)
            pg.sql("INSERT INTO bench.t OVERRIDING SYSTEM VALUE SELECT * FROM bench.src ORDER BY id")
            pg.sql("VACUUM (FREEZE) bench.t")  # visible, like a committed backlog after a while
            pg.sql("DELETE FROM pg_statistic WHERE starelid = 'bench.t'::regclass")
            pg.sql("CHECKPOINT")
            cursor = 0
            t0 = time.monotonic()
            with pg.connect(autocommit=False) as c:
                while True:
                    if hot:
                        ids = [r[0] for r in c.execute(
                            "SELECT id FROM bench.t WHERE id > %s AND status = 'pending' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                            (cursor, B)).fetchall()]
                    else:
                        ids = [r[0] for r in c.execute(
                            "SELECT id FROM bench.t WHERE status = 'pending' ORDER BY order_lsn, id LIMIT %s FOR UPDATE SKIP LOCKED",
                            (B,)).fetchall()]
                    if not ids:
                        c.commit(); break
                    if name == "delete":
                        c.execute("DELETE FROM bench.t WHERE id = ANY(%s)", (ids,))
                    elif hot:
                        c.execute("UPDATE bench.t e SET status = 'published', published_at = statement_timestamp(), kafka_partition = 0, "
                                  "kafka_offset = o.id, next_attempt_at = NULL FROM unnest(%s::bigint[]) o(id) WHERE e.id = o.id AND e.status = 'pending'", (ids,))
                        cursor = ids[-1]
                    else:
                        c.execute("UPDATE bench.t e SET status = 'published', published_at = statement_timestamp(), kafka_partition = 0, "
                                  "kafka_offset = o.id, next_attempt_at = NULL FROM unnest(%s::bigint[]) o(id) WHERE e.id = o.id AND e.status = 'pending'", (ids,))
                    c.commit()
            dt = time.monotonic() - t0
            hot_upd = pg.value("SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'bench.t'::regclass")
            res.setdefault(name, []).append(N / dt)
            print(f"run {run} {name}: {N/dt:.0f} rows/s  (hot updates so far {hot_upd})", flush=True)
    for n, v in res.items():
        print(f"{n:8s} median {statistics.median(v):.0f} rows/s")
finally:
    pg.cleanup()
