"""Where enqueue's per-transaction cost goes (0.4.0): pgbench, the bench's business INSERT plus
one statement per transaction (enqueue_overhead's shape), on a throwaway cluster with the bench's
settings (fsync on), the extension at 0.4.0 and its relay off. Variants:

    plain      the same bytes into an ordinary table (the baseline)
    member     an INSERT straight into the current ring member (stamp trigger with the row rules,
               its id enqueue's kind, common.GENERATED_ID_SQL)
    lookup     that INSERT plus outbox.current_ring_member() in the same statement (the ring
               look-up: what enqueue does before its INSERT, nothing else)
    nokey      outbox.enqueue() without a key (no commit-order work)
    key        outbox.enqueue() with a key (the commit-order pre-commit too)
    nosd       the same C function as key, created without SECURITY DEFINER and SET search_path
               (what the pinned search_path and the owner's rights cost per call; run as superuser)
    id         keyed, with a caller event id (the dedup probes of the other members)
    noidx      member's INSERT into a member without the event-id index (events_1, its unique
               constraint dropped; these three in a database of their own): what that index costs
    notrig     member's INSERT into a member with its stamp trigger disabled (events_2; the
               statement writes order_lsn and writer itself): what the trigger costs
    bare       both (events_3): a row of the member's width with one index, as plain has

Interleaved, as the bench's enqueue_overhead: per client count, run and variant, one pgbench run
with plain's script and the variant's (weight WEIGHT, default 1, against plain's 1), the overhead
the ratio of their average latencies in that run; CLIENTS clients (default "1,4"), SECONDS per
run (default 10), RUNS runs (default 3), medians. SYNC=off (synchronous_commit) leaves out the
WAL flush's wait.

    PATH=/usr/lib/postgresql/15/bin:$PATH python3 bench/diagnostics/enqueue_split.py
"""
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: pgbench_scripts
from bench import pgbench_scripts  # noqa: E402
from common import GENERATED_ID_SQL  # noqa: E402

CLIENTS = [int(c) for c in os.environ.get("CLIENTS", "1,4").split(",")]
SECONDS = int(os.environ.get("SECONDS", "10"))
RUNS = int(os.environ.get("RUNS", "3"))
ONLY = os.environ.get("ONLY")
# The variant's weight against plain's 1 in each run: a control of the interleaving (a variant's
# overhead should not move with its share of the transactions).
WEIGHT = int(os.environ.get("WEIGHT", "1"))

PAYLOAD = ("'{\"event\": \"invoice.paid\", \"invoice_id\": \"inv-' || :sub || '\", "
           "\"subscription_id\": \"sub-' || :sub || '\", \"amount_cents\": ' || :amount || ', "
           "\"currency\": \"EUR\", \"period\": \"2026-11\"}'")
# An INSERT straight into ring member `member` (events_0 as it is; the others this script reshapes
# below to take one part away); stamp: the statement writes order_lsn and writer itself.
# The id is enqueue's kind (caller_event_id false: no event-id index entry, as enqueue's row).
def member_insert(member, stamp):
    columns = "event_id, topic, key, lane, payload, caller_event_id" + (", order_lsn, writer" if stamp else "")
    values = (f"{GENERATED_ID_SQL}, 'billing', 'sub-' || :sub, outbox.lane_of('sub-' || :sub, NULL), "
              f"convert_to((({PAYLOAD})::jsonb)::text, 'UTF8'), false"
              + (", pg_current_wal_insert_lsn(), pg_current_xact_id()" if stamp else ""))
    return f"INSERT INTO outbox.events_{member} ({columns}) SELECT {values}"


MEMBER = member_insert(0, False)
STATEMENT = {
    "plain": ("INSERT INTO bench.plain_events (topic, key, payload) VALUES "
              f"('billing', 'sub-' || :sub, ({PAYLOAD})::jsonb);"),
    "member": MEMBER + ";",
    "lookup": MEMBER + " WHERE outbox.current_ring_member() >= 0;",
    "nokey": f"SELECT outbox.enqueue('billing', NULL, ({PAYLOAD})::jsonb);",
    "key": f"SELECT outbox.enqueue('billing', 'sub-' || :sub, ({PAYLOAD})::jsonb);",
    "nosd": f"SELECT bench.enqueue_nosd('billing', 'sub-' || :sub, ({PAYLOAD})::jsonb);",
    "id": f"SELECT outbox.enqueue('billing', 'sub-' || :sub, ({PAYLOAD})::jsonb, NULL, gen_random_uuid());",
    "noidx": member_insert(1, False) + ";",
    "notrig": member_insert(2, True) + ";",
    "bare": member_insert(3, True) + ";",
}
RESHAPED = ("noidx", "notrig", "bare")
RESHAPED_DB = "reshaped"
BUSINESS = "INSERT INTO bench.invoices (subscription_id, amount_cents, status) VALUES (:sub, :amount, 'paid');"

settings = {"fsync": "on", "shared_preload_libraries": "'outbox'", "outbox.workers": "0",
            "log_min_messages": "warning", "synchronous_commit": os.environ.get("SYNC", "on")}
pg = PgCluster(settings=settings, create_extension=False)
pg.init().start().setup_database()
tmp = Path(tempfile.mkdtemp(prefix="outbox-split-"))
try:
    # The reshaped members live in a database of their own: with their event-id index dropped,
    # the caller-id variant's dedup probes of the other members would scan them.
    for db in ("postgres", RESHAPED_DB):
        if db != "postgres":
            pg.sql(f"CREATE DATABASE {db}")
        pg.sql("CREATE EXTENSION outbox", dbname=db)  # the default version (0.4.1)
        pg.sql("CREATE SCHEMA bench", dbname=db)
        pg.sql("CREATE TABLE bench.invoices (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
               "subscription_id bigint NOT NULL, amount_cents int NOT NULL, status text NOT NULL, "
               "paid_at timestamptz NOT NULL DEFAULT now())", dbname=db)
        pg.sql("CREATE TABLE bench.plain_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
               "topic text NOT NULL, key text, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())", dbname=db)
        assert pg.value("SELECT outbox.current_ring_member()", dbname=db) == 0
    # The reshaped members (never current: enqueue writes events_0).
    for member in (1, 3):
        pg.sql(f"DROP INDEX outbox.events_{member}_event_id_key", dbname=RESHAPED_DB)  # 0.4.1: an index
    for member in (2, 3):
        pg.sql(f'ALTER TABLE outbox.events_{member} DISABLE TRIGGER "~outbox_stamp"', dbname=RESHAPED_DB)
    pg.sql("VACUUM")
    pg.sql("VACUUM", dbname=RESHAPED_DB)
    pg.sql("CREATE FUNCTION bench.enqueue_nosd(topic text, key text, payload jsonb, headers jsonb DEFAULT NULL, "
           "event_id uuid DEFAULT NULL) RETURNS uuid AS 'outbox', 'outbox_enqueue_jsonb' LANGUAGE C VOLATILE")
    names = [n for n in STATEMENT if n != "plain" and (not ONLY or n in ONLY.split(","))]
    files = {}
    for name in ["plain"] + names:
        files[name] = tmp / f"{name}.sql"
        files[name].write_text("\\set sub random(1, 100000)\n\\set amount random(100, 100000)\n"
                               f"BEGIN;\n{BUSINESS}\n{STATEMENT[name]}\nEND;\n")
    latency = {}
    for run in range(RUNS):
        for clients in CLIENTS:
            # Each variant paired with plain alone: in one run of many variants, the keyed ones
            # met each other's commit-order stamps and cost more than each does beside plain.
            for name in names[run % len(names):] + names[:run % len(names)]:
                pg.sql("CHECKPOINT")  # the cluster's, for either database
                cmd = ["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
                       "-T", str(SECONDS), "-h", pg.tmp, "-p", str(pg.port), "-U", "postgres",
                       "-f", f"{files['plain']}@1", "-f", f"{files[name]}@{WEIGHT}",
                       RESHAPED_DB if name in RESHAPED else "postgres"]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    raise RuntimeError(p.stderr[-2000:])
                plain, variant = pgbench_scripts(p.stdout, 2)
                latency[(clients, name, run)] = (variant["latency_avg_ms"], plain["latency_avg_ms"])
    for clients in CLIENTS:
        print(f"{clients} client(s), {SECONDS} s runs, each variant interleaved with plain, medians of {RUNS}:")
        for name in names:
            runs = [latency[(clients, name, r)] for r in range(RUNS)]
            per_run = [100 * (v / b - 1) for v, b in runs]
            print(f"  {name:7s} {statistics.median(v for v, _ in runs):6.3f} ms vs plain "
                  f"{statistics.median(b for _, b in runs):6.3f} ms  overhead {statistics.median(per_run):5.1f}% "
                  f"(per run: {', '.join(f'{x:.1f}' for x in per_run)})  "
                  f"{1000 * statistics.median(v - b for v, b in runs):+6.0f} us/tx")
finally:
    pg.cleanup()
