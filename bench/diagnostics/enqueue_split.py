"""Where the 0.4.0 preview's per-transaction enqueue cost goes: pgbench, the bench's business
INSERT plus one statement per transaction (enqueue_overhead's shape), on a throwaway cluster with
the bench's settings (fsync on), the extension at 0.4.0 and its relay off. Variants:

    plain      the same bytes into an ordinary table (the baseline)
    member     an INSERT straight into the current ring member (stamp trigger with the row rules, 2 indexes)
    lookup     that INSERT plus outbox.current_ring_member() in the same statement (the ring
               look-up: what enqueue does before its INSERT, nothing else)
    nokey      outbox.enqueue() without a key (no commit-order work)
    key        outbox.enqueue() with a key (the commit-order pre-commit too)
    id         keyed, with a caller event id (the dedup probes of the other members)

CLIENTS clients (default "1,4"), SECONDS per run (default 6), RUNS runs (default 3), the variants'
order rotated per run; medians, and each variant's tps against plain's in the same run. SYNC=off
(synchronous_commit): no wait for the WAL flush, whose time on a shared disk is noise far larger
than the few tens of us being split; the work measured is the same.

    PATH=/usr/lib/postgresql/15/bin:$PATH python3 bench/diagnostics/enqueue_split.py
"""
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster

CLIENTS = [int(c) for c in os.environ.get("CLIENTS", "1,4").split(",")]
SECONDS = int(os.environ.get("SECONDS", "6"))
RUNS = int(os.environ.get("RUNS", "3"))
ONLY = os.environ.get("ONLY")

PAYLOAD = ("'{\"event\": \"invoice.paid\", \"invoice_id\": \"inv-' || :sub || '\", "
           "\"subscription_id\": \"sub-' || :sub || '\", \"amount_cents\": ' || :amount || ', "
           "\"currency\": \"EUR\", \"period\": \"2026-11\"}'")
MEMBER = ("INSERT INTO outbox.events_0 (event_id, topic, key, lane, payload) SELECT gen_random_uuid(), 'billing', "
          f"'sub-' || :sub, outbox.lane_of('sub-' || :sub, NULL), convert_to((({PAYLOAD})::jsonb)::text, 'UTF8')")
STATEMENT = {
    "plain": ("INSERT INTO bench.plain_events (topic, key, payload) VALUES "
              f"('billing', 'sub-' || :sub, ({PAYLOAD})::jsonb);"),
    "member": MEMBER + ";",
    "lookup": MEMBER + " WHERE outbox.current_ring_member() >= 0;",
    "nokey": f"SELECT outbox.enqueue('billing', NULL, ({PAYLOAD})::jsonb);",
    "key": f"SELECT outbox.enqueue('billing', 'sub-' || :sub, ({PAYLOAD})::jsonb);",
    "id": f"SELECT outbox.enqueue('billing', 'sub-' || :sub, ({PAYLOAD})::jsonb, NULL, gen_random_uuid());",
}
BUSINESS = "INSERT INTO bench.invoices (subscription_id, amount_cents, status) VALUES (:sub, :amount, 'paid');"

settings = {"fsync": "on", "shared_preload_libraries": "'outbox'", "outbox.workers": "0",
            "log_min_messages": "warning", "synchronous_commit": os.environ.get("SYNC", "on")}
pg = PgCluster(settings=settings, create_extension=False)
pg.init().start().setup_database()
tmp = Path(tempfile.mkdtemp(prefix="outbox-split-"))
try:
    pg.sql("CREATE EXTENSION outbox VERSION '0.4.0'")
    pg.sql("CREATE SCHEMA bench")
    pg.sql("CREATE TABLE bench.invoices (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
           "subscription_id bigint NOT NULL, amount_cents int NOT NULL, status text NOT NULL, "
           "paid_at timestamptz NOT NULL DEFAULT now())")
    pg.sql("CREATE TABLE bench.plain_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
           "topic text NOT NULL, key text, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())")
    assert pg.value("SELECT outbox.current_ring_member()") == 0
    pg.sql("VACUUM")
    names = [n for n in STATEMENT if not ONLY or n == "plain" or n in ONLY.split(",")]
    files = {}
    for name in names:
        files[name] = tmp / f"{name}.sql"
        files[name].write_text("\\set sub random(1, 100000)\n\\set amount random(100, 100000)\n"
                               f"BEGIN;\n{BUSINESS}\n{STATEMENT[name]}\nEND;\n")
    tps = {}
    for run in range(RUNS):
        for clients in CLIENTS:
            for name in names[run % len(names):] + names[:run % len(names)]:
                pg.sql("CHECKPOINT")
                p = subprocess.run(["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
                                    "-T", str(SECONDS), "-h", pg.tmp, "-p", str(pg.port), "-U", "postgres",
                                    "-f", str(files[name]), "postgres"], capture_output=True, text=True)
                if p.returncode != 0:
                    raise RuntimeError(p.stderr[-2000:])
                t = next(float(line.split()[2]) for line in p.stdout.splitlines() if line.startswith("tps ="))
                tps[(clients, name, run)] = t
    for clients in CLIENTS:
        print(f"{clients} client(s), {SECONDS} s runs, medians of {RUNS}:")
        base = statistics.median(tps[(clients, "plain", r)] for r in range(RUNS))
        for name in names:
            med = statistics.median(tps[(clients, name, r)] for r in range(RUNS))
            per_run = [100 * (1 - tps[(clients, name, r)] / tps[(clients, "plain", r)]) for r in range(RUNS)]
            us = 1e6 * clients * (1 / med - 1 / base)
            print(f"  {name:7s} {med:7.0f} tps  overhead {100 * (1 - med / base):5.1f}% "
                  f"(per run: {', '.join(f'{x:.1f}' for x in per_run)}; median {statistics.median(per_run):.1f}%)"
                  f"  {us:+6.0f} us/tx")
finally:
    pg.cleanup()
