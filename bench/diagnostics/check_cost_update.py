"""The relay record UPDATE of 20,000 rows on a copy of outbox.events with and without its CHECK
constraints (they are evaluated for every updated row)."""
import sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster
pg = PgCluster(settings={"shared_preload_libraries": "'outbox'", "outbox.workers": "0"})
pg.init().start().setup_database()
try:
    pg.sql("""SELECT count(outbox.enqueue('t' || (i % 4), 'sub-' || (i % 1000), jsonb_build_object('event', 'invoice.paid', 'invoice_id', 'inv-' || i)))
              FROM generate_series(1, 20000) i""")
    res = {}
    for run in range(5):
        for name, ddl in [("all", "INCLUDING ALL"), ("nocheck", "INCLUDING DEFAULTS INCLUDING INDEXES INCLUDING IDENTITY")]:
            pg.sql("DROP TABLE IF EXISTS t")
            pg.sql(f"CREATE TABLE t (LIKE outbox.events {ddl})")
            pg.sql("INSERT INTO t OVERRIDING SYSTEM VALUE SELECT * FROM outbox.events")
            pg.sql("VACUUM t")
            t0 = time.monotonic()
            pg.sql("UPDATE t SET status = 'published', published_at = statement_timestamp(), kafka_partition = 0, kafka_offset = id WHERE status = 'pending'")
            res.setdefault(name, []).append((time.monotonic() - t0) * 1000)
    for n, v in res.items():
        print(n, f"{statistics.median(v):.1f} ms for 20,000 rows")
finally:
    pg.cleanup()
