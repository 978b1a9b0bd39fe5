"""What the order of generated event ids costs a large ring member: WAL bytes and full-page images
per event after a checkpoint, random (version 4) ids against time-ordered (version 7) ones.

A member holds every event of its part of the retention window (millions at a steady load). Its
event-id index takes one entry per event: a random id lands on a random leaf, so after each
checkpoint nearly every insert is the first change of its leaf page and writes the whole page to
the WAL (a full-page image), and a member larger than shared_buffers reads that leaf from disk; a
time-ordered id lands on the rightmost leaf, one page image per filled leaf.

Per variant, on a throwaway cluster (0.4.0, relay off): ROWS events already in outbox.events_0
(default 1,000,000) with that variant's ids, CHECKPOINT, then EVENTS (default 10,000) one-event
transactions (pgbench, one client) INSERTing into the member as enqueue does, ids of the same
variant; WAL bytes and full-page images per event (pg_stat_wal), RUNS runs (default 1).

    PATH=/usr/lib/postgresql/15/bin:$PATH python3 bench/diagnostics/event_id_order.py
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the id as enqueue makes it
from common import UUID_V7_SQL  # noqa: E402

ROWS = int(os.environ.get("ROWS", "1000000"))
EVENTS = int(os.environ.get("EVENTS", "10000"))
RUNS = int(os.environ.get("RUNS", "1"))

IDS = {"random (v4)": "gen_random_uuid()", "time-ordered (v7)": UUID_V7_SQL}
PAYLOAD = "convert_to('{\"event\": \"invoice.paid\", \"invoice_id\": \"inv-' || {n} || '\", \"amount_cents\": 4200}', 'UTF8')"


def member_insert(id_sql, n):
    return (f"INSERT INTO outbox.events_0 (event_id, topic, key, lane, payload) SELECT {id_sql}, 'billing', "
            f"'sub-' || {n}, outbox.lane_of('sub-' || {n}, NULL), {PAYLOAD.replace('{n}', n)}")


def measure(id_sql, tmp):
    """One run of one variant on a throwaway cluster: (WAL bytes, full-page images) per event and
    the event-id index's size in MB."""
    pg = PgCluster(settings={"shared_preload_libraries": "'outbox'", "outbox.workers": "0",
                             "log_min_messages": "warning", "max_wal_size": "'4GB'"}, create_extension=False)
    pg.init().start().setup_database()
    try:
        pg.sql("CREATE EXTENSION outbox VERSION '0.4.0'")
        pg.sql(member_insert(id_sql, "i") + f" FROM generate_series(1, {ROWS}) i")
        pg.sql("VACUUM ANALYZE outbox.events_0")
        script = tmp / "insert.sql"
        script.write_text("\\set n random(1, 100000)\n" + member_insert(id_sql, ":n") + ";\n")
        pg.sql("CHECKPOINT")
        before = pg.sql("SELECT wal_fpi, wal_bytes FROM pg_stat_wal")[0]
        p = subprocess.run(["pgbench", "-n", "-c", "1", "-t", str(EVENTS), "-h", pg.tmp, "-p", str(pg.port),
                            "-U", "postgres", "-f", str(script), "postgres"], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-2000:])
        after = pg.sql("SELECT wal_fpi, wal_bytes FROM pg_stat_wal")[0]
        index_mb = pg.value("SELECT pg_relation_size('outbox.events_0_event_id_key') / 1048576.0")
        return float(after[1] - before[1]) / EVENTS, float(after[0] - before[0]) / EVENTS, float(index_mb)
    finally:
        pg.cleanup()


results = {name: [] for name in IDS}
tmp = Path(tempfile.mkdtemp(prefix="outbox-idorder-"))
try:
    for run in range(RUNS):
        for name, id_sql in IDS.items():
            results[name].append(measure(id_sql, tmp))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
print(f"{ROWS:,} events in the member, a CHECKPOINT, then {EVENTS:,} one-event transactions (median of {RUNS}):")
for name, rows in results.items():
    wal = statistics.median(r[0] for r in rows)
    fpi = statistics.median(r[1] for r in rows)
    print(f"  {name:18s} WAL {wal:8,.0f} bytes/event  full-page images {fpi:.3f}/event  "
          f"event-id index {statistics.median(r[2] for r in rows):.0f} MB")
