"""WAL per event under a steady load with the relay publishing as the events commit (the ring, 0.4.1, the
default), against the Debezium outbox pattern and a plain INSERT at the same rate: what
`wal_cost` (a backlog enqueued with the relay paused, then drained in large batches) does not
show. Small batches cost the relay more per event: an `outbox.landed` row per batch and
partition, the cursor's update and the batch's commit, and, at retention, the delete of those
landed rows and their vacuum.

Per shape, on one throwaway cluster (fsync on, autovacuum at its defaults): a CHECKPOINT, then
pgbench at RATE transactions per second for SECONDS with PER_TX events a transaction over 1,000
keys (about 150 bytes of JSON each), then for outbox the wait until the relay has published every
event; the WAL between the two positions divided by the events. Then outbox's retention
(`outbox.purge('0 s')` until the members that held the events are emptied: their landed rows
deleted) and a VACUUM of every table of schema outbox (what autovacuum would do later), each
counted on its own; for the pattern, its VACUUM. The relay publishes to librdkafka's mock cluster
(RTT 0, one topic of 6 partitions).

    PATH=/usr/lib/postgresql/15/bin:$PATH python3 bench/diagnostics/wal_steady.py
    RATE=2000 SECONDS=60 PER_TX=1 (defaults); LINGER=<outbox.batch_linger> (default: its default)
"""
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"))  # the test harness's PgCluster
from harness.pg_cluster import PgCluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the mock cluster
from common import Mock  # noqa: E402

RATE = int(os.environ.get("RATE", "2000"))
SECONDS = int(os.environ.get("SECONDS", "60"))
PER_TX = int(os.environ.get("PER_TX", "1"))
LINGER = os.environ.get("LINGER")  # outbox.batch_linger, e.g. "0" or "20ms"
KEYS = 1000
# Events the relay published, by its landed rows (the view would read every member row).
PUBLISHED = "SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox.landed"

PAYLOAD = ("jsonb_build_object('event', 'invoice.paid', 'invoice_id', 'inv-' || :i, 'subscription_id', "
           "'sub-' || :k, 'amount_cents', 1000 + :i % 9000, 'currency', 'EUR', 'period', '2026-11')")


def statement(shape, topic, n):
    """The n-th event of a transaction (:i and :k set by the script)."""
    key = f"'sub-' || ((:k + {n}) % {KEYS})"
    if shape == "outbox":
        return f"SELECT outbox.enqueue('{topic}', {key}, {PAYLOAD});"
    if shape == "debezium":  # INSERT and DELETE in the transaction: the connector reads the INSERT from the WAL
        return (f"WITH e AS (INSERT INTO bench.debezium_outbox (id, aggregatetype, aggregateid, type, payload) "
                f"VALUES (gen_random_uuid(), 'invoice', {key}, 'invoice.paid', {PAYLOAD}) RETURNING id) "
                "DELETE FROM bench.debezium_outbox d USING e WHERE d.id = e.id;")
    return (f"INSERT INTO bench.plain_outbox (event_id, aggregatetype, aggregateid, type, payload) "
            f"VALUES (gen_random_uuid(), 'invoice', {key}, 'invoice.paid', {PAYLOAD});")


def lsn(pg):
    return int(pg.value("SELECT pg_current_wal_insert_lsn() - '0/0'"))


RECORD = re.compile(r"rmgr: (\S+)\s+len \(rec/tot\):\s*\d+/\s*(\d+),")
BLOCK = re.compile(r"blkref #0: rel \d+/\d+/(\d+)")


def wal_by_relation(pg, start, end):
    """{relation or rmgr: WAL bytes} between two positions (pg_waldump over the kept segments)."""
    wait = time.monotonic() + 30
    while not pg.value("SELECT pg_current_wal_flush_lsn() - '0/0' >= %s", (end,)) and time.monotonic() < wait:
        time.sleep(0.1)
    first, last = pg.sql("SELECT (pg_walfile_name_offset(%s::text::pg_lsn)).file_name, pg_walfile_name(%s::text::pg_lsn)",
                         (f"{start >> 32:X}/{start & 0xFFFFFFFF:X}", f"{end >> 32:X}/{end & 0xFFFFFFFF:X}"))[0]
    p = subprocess.run(["pg_waldump", "-p", f"{pg.datadir}/pg_wal", "-s", f"{start >> 32:X}/{start & 0xFFFFFFFF:X}",
                        "-e", f"{end >> 32:X}/{end & 0xFFFFFFFF:X}", first, last], capture_output=True, text=True)
    names = {str(n): r for n, r in pg.sql("SELECT relfilenode, relname FROM pg_class WHERE relfilenode <> 0")}
    out = collections.Counter()
    for line in p.stdout.splitlines():
        m = RECORD.search(line)
        if m:
            block = BLOCK.search(line)
            kind = f"{m.group(1)}:{names.get(block.group(1), block.group(1))}" if block else m.group(1)
            out[kind] += int(m.group(2))
    return out


def main():
    mock = Mock(brokers=1)
    topic = mock.new_topic("steady", 6)
    settings = {"fsync": "on", "wal_keep_size": "'4GB'", "outbox.workers": "1", "outbox.bootstrap_servers": f"'{mock.bootstrap}'",
                "log_min_messages": "warning"}
    if LINGER is not None:  # else the default
        settings["outbox.batch_linger"] = f"'{LINGER}'"
    pg = PgCluster(settings=settings)
    pg.init().start().setup_database()
    tmp = Path(tempfile.mkdtemp(prefix="outbox-wal-steady-"))
    try:
        pg.sql("CREATE SCHEMA bench")
        pg.sql("CREATE TABLE bench.debezium_outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, "
               "aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)")
        pg.sql("CREATE TABLE bench.plain_outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
               "event_id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, "
               "type varchar(255) NOT NULL, payload jsonb)")
        pg.wait_workers_running(1, timeout=60)
        print(f"rate {RATE} tx/s, {SECONDS} s, {PER_TX} event(s) a transaction, relay publishing (1 worker, "
              f"mock cluster RTT 0, {topic}: 6 partitions, outbox.batch_linger "
              f"{pg.value('SHOW outbox.batch_linger')}); WAL bytes per event")
        results = {}
        for shape in ("debezium", "plain", "outbox"):
            script = tmp / f"{shape}.sql"
            script.write_text(f"\\set i random(1, 1000000000)\n\\set k random(0, {KEYS - 1})\nBEGIN;\n"
                              + "\n".join(statement(shape, topic, n) for n in range(PER_TX)) + "\nEND;\n")
            published_before = pg.value(PUBLISHED)
            pg.sql("CHECKPOINT")
            start = lsn(pg)
            p = subprocess.run(["pgbench", "-n", "-M", "prepared", "-c", "4", "-j", "2", "-R", str(RATE),
                                "-T", str(SECONDS), "-h", pg.tmp, "-p", str(pg.port), "-U", "postgres",
                                "-f", str(script), "postgres"], capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(p.stderr[-2000:])
            tx = int(next(line.split(":")[1].split()[0] for line in p.stdout.splitlines()
                          if line.startswith("number of transactions actually processed")))
            events = tx * PER_TX
            if shape == "outbox":
                deadline = time.monotonic() + 120
                while pg.value(PUBLISHED) < published_before + events:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the relay did not publish the events within 120 s")
                    time.sleep(0.2)
            end = lsn(pg)
            write = end - start
            row = {"events": events, "write": write / events}
            parts = wal_by_relation(pg, start, end)
            row["by_relation"] = {k: round(v / events, 1) for k, v in parts.most_common(8)}
            if shape == "outbox":
                row["landed_rows_per_event"] = pg.value("SELECT count(*) FROM outbox.landed") / events
                start = lsn(pg)
                for _ in range(4):  # seal, then empty the members the cursor passed (their landed rows go)
                    pg.sql("SELECT outbox.purge('0 s')")
                    time.sleep(1)
                row["retention"] = (lsn(pg) - start) / events
                row["landed_left"] = pg.value("SELECT count(*) FROM outbox.landed")
            start = lsn(pg)
            pg.sql("VACUUM")
            row["vacuum"] = (lsn(pg) - start) / events
            row["total"] = row["write"] + row.get("retention", 0) + row["vacuum"]
            results[shape] = row
            print(f"  {shape:9s} {events:7d} events: write+publish {row['write']:7.1f}"
                  + (f" (landed rows per event {row['landed_rows_per_event']:.2f}), retention {row['retention']:6.1f} "
                     f"(landed rows left {row['landed_left']})" if shape == "outbox" else "")
                  + f", vacuum {row['vacuum']:6.1f}: total {row['total']:7.1f}\n"
                  + f"            write+publish by relation or record kind: {row['by_relation']}")
        base = results["debezium"]["total"]
        print(f"outbox / Debezium pattern: {results['outbox']['total'] / base:.2f}x; "
              f"plain / Debezium pattern: {results['plain']['total'] / base:.2f}x")
    finally:
        pg.cleanup()
        mock.close()


if __name__ == "__main__":
    main()
