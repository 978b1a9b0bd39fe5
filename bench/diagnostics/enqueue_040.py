"""Where the 0.4.0 preview's enqueue overhead goes: per-call cost of outbox.enqueue() against an
INSERT of the same row straight into the current ring member (its stamp trigger, CHECK and two
indexes) and a plain INSERT of the same bytes into an ordinary table, N calls in ONE transaction
from PL/pgSQL (so no commit, no WAL flush wait: the statements' own cost), medians of RUNS runs,
the variants' order rotated per run. KEYS: distinct keys over the N calls (1: the pre-commit's
commit-order work is one key lock). What the commit path adds per single-event transaction
(pre-commit key lock, the WAL flush) is what bench.py's enqueue_overhead measures with pgbench
beside it.

    PATH=/usr/lib/postgresql/15/bin:$PATH python3 bench/diagnostics/enqueue_040.py
"""
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster

N = int(os.environ.get("N", "20000"))
RUNS = int(os.environ.get("RUNS", "5"))
KEYS = int(os.environ.get("KEYS", "1"))
PAYLOAD = ("'{\"event\": \"invoice.paid\", \"invoice_id\": \"inv-' || i || '\", \"subscription_id\": \"sub-' || k || "
           "'\", \"amount_cents\": ' || (100 + i % 1000) || ', \"currency\": \"EUR\", \"period\": \"2026-11\"}'")
BODY = {
    "plain": f"INSERT INTO bench.plain_events (topic, key, payload) VALUES ('billing', 'sub-' || k, ({PAYLOAD})::jsonb)",
    "member": (f"INSERT INTO outbox.events_0 (event_id, topic, key, lane, payload) VALUES (gen_random_uuid(), 'billing', "
               f"'sub-' || k, outbox.lane_of('sub-' || k, NULL), convert_to((({PAYLOAD})::jsonb)::text, 'UTF8'))"),
    "enqueue": f"PERFORM outbox.enqueue('billing', 'sub-' || k, ({PAYLOAD})::jsonb)",
}
# Copies of a member without its triggers (LIKE ... INCLUDING ALL: defaults, the CHECK, both
# indexes), order_lsn and writer given as the stamp would: "copy" tells the stamp trigger's cost,
# "copy_nocheck" (no CHECK either) the CHECK's.
for name in ("copy", "copy_nocheck"):
    BODY[name] = (f"INSERT INTO bench.{name} (event_id, topic, key, lane, payload, order_lsn, writer) VALUES "
                  f"(gen_random_uuid(), 'billing', 'sub-' || k, outbox.lane_of('sub-' || k, NULL), "
                  f"convert_to((({PAYLOAD})::jsonb)::text, 'UTF8'), pg_current_wal_insert_lsn(), pg_current_xact_id())")

# The same statements with the event number and key as parameters (single-statement transactions).
PAYLOAD_P = (PAYLOAD.replace("|| i ||", "|| %(i)s::int ||").replace("|| k ||", "|| %(k)s::int ||")
             .replace("(100 + i % 1000)", "(100 + %(i)s::int %% 1000)"))
SINGLE = {name: BODY[name].replace(PAYLOAD, PAYLOAD_P).replace("'sub-' || k", "'sub-' || %(k)s::int")
          .replace("PERFORM ", "SELECT ") for name in ("plain", "member", "enqueue")}

pg = PgCluster(settings={"shared_preload_libraries": "'outbox'", "outbox.workers": "0"}, create_extension=False)
pg.init().start().setup_database()
try:
    pg.sql("CREATE EXTENSION outbox VERSION '0.4.0'")
    pg.sql("CREATE SCHEMA bench")
    pg.sql("CREATE TABLE bench.plain_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text NOT NULL, "
           "key text, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())")
    pg.sql("CREATE TABLE bench.copy (LIKE outbox.events_1 INCLUDING ALL)")
    pg.sql("CREATE TABLE bench.copy_nocheck (LIKE outbox.events_1 INCLUDING DEFAULTS INCLUDING INDEXES)")
    res = {}
    names = list(BODY)
    for run in range(RUNS):
        for name in names[run % len(names):] + names[:run % len(names)]:
            pg.sql("TRUNCATE bench.plain_events, bench.copy, bench.copy_nocheck")
            # A new database state per variant would need a new database (the members cannot be
            # truncated): the member's rows of earlier runs stay; N per run is small against it.
            block = (f"DO $$ DECLARE k int; BEGIN FOR i IN 1..{N} LOOP k := i % {KEYS}; {BODY[name]}; END LOOP; END $$")
            t0 = time.monotonic()
            pg.sql(block)
            res.setdefault(name, []).append((time.monotonic() - t0) / N * 1e6)
    base = statistics.median(res["plain"])
    print(f"{N} calls in one transaction (PL/pgSQL), per call:")
    for name in names:
        m = statistics.median(res[name])
        print(f"  {name:12s} {m:6.1f} us (+{m - base:5.1f} over the plain INSERT); runs: "
              + ", ".join(f"{x:.1f}" for x in res[name]))
    # The same statements as single-statement transactions (TX of them, one connection, prepared),
    # with synchronous_commit off so that the WAL flush wait (the same for every variant) does
    # not hide the commit path's own work (enqueue's pre-commit commit-order key lock).
    TX = int(os.environ.get("TX", "4000"))
    single = {}
    for run in range(RUNS):
        for name in ("plain", "member", "enqueue"):
            stmt = SINGLE[name]
            with pg.connect() as c:
                c.execute("SET synchronous_commit = off")
                t0 = time.monotonic()
                for i in range(TX):
                    c.execute(stmt, {"i": i, "k": i % KEYS}, prepare=True)
                single.setdefault(name, []).append((time.monotonic() - t0) / TX * 1e6)
    base = statistics.median(single["plain"])
    print(f"{TX} single-statement transactions (synchronous_commit off, one connection, prepared), per transaction:")
    for name in ("plain", "member", "enqueue"):
        m = statistics.median(single[name])
        print(f"  {name:12s} {m:6.1f} us (+{m - base:5.1f} over the plain INSERT); runs: "
              + ", ".join(f"{x:.1f}" for x in single[name]))
finally:
    pg.cleanup()
