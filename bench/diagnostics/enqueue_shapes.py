"""Attribute enqueue overhead: pgbench a business INSERT plus one of several second statements."""
import os, subprocess, sys, tempfile, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster

SECONDS = int(os.environ.get("SECS", "12"))
RUNS = int(os.environ.get("RUNS", "3"))
CLIENTS = [int(c) for c in os.environ.get("CLIENTS", "1").split(",")]
settings = {"fsync": "on", "shared_preload_libraries": "'outbox'", "outbox.workers": "0"}
pg = PgCluster(settings=settings)
pg.init().start().setup_database()
try:
    pg.sql("CREATE SCHEMA bench")
    pg.sql("CREATE TABLE bench.invoices (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, subscription_id bigint NOT NULL, amount_cents int NOT NULL, status text NOT NULL, paid_at timestamptz NOT NULL DEFAULT now())")
    pg.sql("CREATE TABLE bench.plain_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text NOT NULL, key text, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())")
    pg.sql("CREATE TABLE bench.shape (LIKE outbox.events INCLUDING ALL)")
    pg.sql("CREATE TABLE bench.shape_noeid (LIKE outbox.events INCLUDING ALL)")
    idx = pg.sql("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname='bench' AND tablename='shape_noeid'")
    print(idx)
    for name, d in idx:
        if "(event_id)" in d:
            pg.sql(f"ALTER TABLE bench.shape_noeid DROP CONSTRAINT {name}")
    pg.sql("CREATE TABLE bench.shape_nopend (LIKE outbox.events INCLUDING ALL)")
    for name, d in pg.sql("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname='bench' AND tablename='shape_nopend'"):
        if "order_lsn, id" in d and "pending" in d:
            pg.sql(f"DROP INDEX bench.{name}")
    pg.sql("CREATE TABLE bench.shape_nocheck (LIKE outbox.events INCLUDING DEFAULTS INCLUDING INDEXES INCLUDING IDENTITY)")
    pg.sql("CREATE SEQUENCE bench.useq")
    # The insert-only queue's generation table (DESIGN.md "The insert-only queue"): the lean columns,
    # the writer's top-level xid, and only the claim's (order_lsn, id) index and the event_id dedup;
    # gen_noeid without the dedup index, gen_caller_ids with a separate unique table of caller ids
    # instead (generated ids need no dedup, so only an event with a caller's id writes to it).
    lean = ("id bigint GENERATED ALWAYS AS IDENTITY, event_id uuid NOT NULL, topic text NOT NULL, key text, "
            "lane smallint NOT NULL, order_lsn pg_lsn NOT NULL DEFAULT pg_current_wal_insert_lsn(), "
            "writer xid8 NOT NULL DEFAULT pg_current_xact_id(), payload bytea, headers jsonb, "
            "created_at timestamptz NOT NULL DEFAULT now(), target_partition int, ce_content_type text, "
            "ce_type text, ce_source text")
    for t in ("gen", "gen_noeid"):
        pg.sql(f"CREATE TABLE bench.{t} ({lean})")
        pg.sql(f"CREATE INDEX ON bench.{t} (order_lsn, id)")
    pg.sql("CREATE UNIQUE INDEX ON bench.gen (event_id)")
    # gen_trigger: gen's shape stamped by the generation trigger itself (src/enqueue/generation_stamp.cpp:
    # the registry of open writers, then order_lsn and writer), not by column defaults.
    pg.sql("CREATE TABLE bench.gen_trigger (LIKE bench.gen INCLUDING ALL)")
    pg.sql("CREATE FUNCTION bench.gen_stamp() RETURNS trigger LANGUAGE C AS '$libdir/outbox', 'outbox_generation_stamp'")
    pg.sql("CREATE TRIGGER stamp BEFORE INSERT ON bench.gen_trigger FOR EACH ROW EXECUTE FUNCTION bench.gen_stamp()")
    pg.sql("ALTER TABLE bench.gen_trigger ENABLE ALWAYS TRIGGER stamp")
    pg.sql("CREATE TABLE bench.caller_ids (event_id uuid PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now())")
    business = "INSERT INTO bench.invoices (subscription_id, amount_cents, status) VALUES (:sub, :amount, 'paid');"
    payload = ("'{\"event\": \"invoice.paid\", \"invoice_id\": \"inv-' || :sub || '\", \"subscription_id\": \"sub-' || :sub || '\", \"amount_cents\": ' || :amount || ', \"currency\": \"EUR\", \"period\": \"2026-11\"}'")
    def shape_insert(table, eid="gen_random_uuid()"):
        return (f"INSERT INTO bench.{table} (event_id, topic, key, lane, payload) VALUES ({eid}, 'billing', 'sub-' || :sub, "
                f"outbox.lane_of('sub-' || :sub, NULL), convert_to((({payload})::jsonb)::text, 'UTF8'));")
    seq_uuid = "(lpad(to_hex(nextval('bench.useq')), 32, '0'))::uuid"
    scripts = {
        "plain": f"INSERT INTO bench.plain_events (topic, key, payload) VALUES ('billing', 'sub-' || :sub, ({payload})::jsonb);",
        "outbox": f"SELECT outbox.enqueue('billing', 'sub-' || :sub, ({payload})::jsonb);",
        "shape": shape_insert("shape"),
        "shape_seq_uuid": shape_insert("shape", seq_uuid),
        "shape_noeid": shape_insert("shape_noeid"),
        "shape_nopend": shape_insert("shape_nopend"),
        "shape_nocheck": shape_insert("shape_nocheck"),
        "gen": shape_insert("gen"),
        "gen_noeid": shape_insert("gen_noeid"),
        "gen_trigger": shape_insert("gen_trigger"),
        "gen_caller_ids": "INSERT INTO bench.caller_ids (event_id) VALUES (gen_random_uuid()); " + shape_insert("gen_noeid"),
        "business_only": "",
    }
    only = os.environ.get("ONLY")
    if only:
        scripts = {k: v for k, v in scripts.items() if k in only.split(",") or k == "plain"}
    tmp = tempfile.mkdtemp()
    files = {}
    for n, second in scripts.items():
        p = os.path.join(tmp, n + ".sql")
        open(p, "w").write(f"\\set sub random(1, 100000)\n\\set amount random(100, 100000)\nBEGIN;\n{business}\n{second}\nEND;\n")
        files[n] = p
    res = {}
    names = list(scripts)
    for r in range(RUNS):
        for c in CLIENTS:
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                pg.sql("TRUNCATE bench.invoices, bench.plain_events, bench.shape, bench.shape_noeid, bench.shape_nopend, bench.shape_nocheck, bench.gen, bench.gen_noeid, bench.gen_trigger, bench.caller_ids, outbox.events")
                pg.sql("CHECKPOINT")
                cmd = [pg.program("pgbench"), "-n", "-M", "prepared", "-c", str(c), "-j", str(min(c, 2)), "-T", str(SECONDS),
                       "-h", pg.tmp, "-p", str(pg.port), "-U", "postgres", "-f", files[n], "postgres"]
                out = subprocess.run(cmd, capture_output=True, text=True)
                tps = [float(l.split()[2]) for l in out.stdout.splitlines() if l.startswith("tps =")]
                if not tps:
                    print(out.stderr); raise SystemExit(1)
                res.setdefault((n, c), []).append(tps[0])
                print(f"run {r} c={c} {n}: {tps[0]:.0f}", flush=True)
    for c in CLIENTS:
        base = statistics.median(res[("plain", c)])
        for n in names:
            m = statistics.median(res[(n, c)])
            print(f"c={c} {n:16s} {m:8.0f} tps  overhead vs plain {100*(1-m/base):5.1f}%")
finally:
    pg.cleanup()
