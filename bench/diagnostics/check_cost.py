"""Per-statement cost of each CHECK constraint of outbox.events: 20,000 single-row INSERTs from
PL/pgSQL into a copy of the table without checks plus one check (ExecRelCheck builds every
check's expression per statement)."""
import sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster
pg = PgCluster(settings={"shared_preload_libraries": "'outbox'", "outbox.workers": "0"})
pg.init().start().setup_database()
try:
    checks = pg.sql("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'outbox.events'::regclass AND contype = 'c' ORDER BY conname")
    body = """DO $$ BEGIN FOR i IN 1..20000 LOOP
      INSERT INTO t (event_id, topic, key, lane, payload) VALUES (gen_random_uuid(), 'billing', 'sub-' || i,
        outbox.lane_of('sub-' || i, NULL), '\\x7b7d'::bytea);
    END LOOP; END $$"""
    variants = [("none", [])] + [(n, [(n, d)]) for n, d in checks] + [("all", checks)]
    res = {}
    for run in range(3):
        for name, cs in variants:
            pg.sql("DROP TABLE IF EXISTS t")
            pg.sql("CREATE TABLE t (LIKE outbox.events INCLUDING DEFAULTS INCLUDING IDENTITY)")
            for n, d in cs:
                pg.sql(f"ALTER TABLE t ADD CONSTRAINT {n} {d}")
            t0 = time.monotonic(); pg.sql(body); dt = time.monotonic() - t0
            res.setdefault(name, []).append(dt / 20000 * 1e6)
    base = statistics.median(res["none"])
    for name, _ in variants:
        print(f"{name:36s} {statistics.median(res[name]):7.1f} us/insert  (+{statistics.median(res[name]) - base:5.1f})")
finally:
    pg.cleanup()
