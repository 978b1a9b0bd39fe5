"""What an event costs the primary, counted the way a DBA counts it: WAL bytes (with full-page
images), WAL records by kind (heap, index), dead tuples and vacuum, per event, for three shapes
on the same server in the same run:

- outbox: `outbox.enqueue` in the business transaction, published by the relay (librdkafka's
  mock cluster), then retention (`outbox.purge('0 s')`), then the VACUUM that the dead tuples
  left behind cost sooner or later (autovacuum's work, done at once so that it is counted);
- debezium: the Debezium outbox pattern: INSERT into a five-column outbox table and DELETE in
  the same transaction (the connector reads the INSERT from the WAL), then the VACUUM;
- plain: INSERT of the same columns into a table with a bigint primary key (the floor), then
  the VACUUM (it sets the visibility map; nothing is dead).

Each shape runs the same events: `events` in transactions of `per_transaction` over `keys`
keys, about 150 bytes of JSON each. Two checkpoint placements, both counted: a CHECKPOINT before
each shape only (`checkpoint = "shape"`), and one before every step and in the middle of the
write step (`checkpoint = "steps"`): after a checkpoint the first change of every page writes
the whole page into the WAL, which is part of what a table costs.

The relay stays paused (`ALTER DATABASE ... SET outbox.workers = 0`) while the events are
enqueued, as in a backlog; nothing else writes to the cluster meanwhile (the WAL position is
the cluster's, so any other writer would be counted too). Autovacuum keeps its defaults: its
runs during a step are counted in that step (and reported).
"""
import re
import subprocess
import time

import common
from common import log, median

SHAPES = ("outbox", "debezium", "plain")
CHECKPOINTS = ("shape", "steps")

PAYLOAD_SQL = ("jsonb_build_object('event', 'invoice.paid', 'invoice_id', 'inv-' || i, "
               "'subscription_id', k, 'amount_cents', 1000 + i % 9000, 'currency', 'EUR', "
               "'period', '2026-11')")
# Event i of the run: its key (a fixed pseudo-random sequence over the keys) and payload.
EVENTS_SQL = ("SELECT i, 'sub-' || lpad((abs(hashint4(i)) % {keys})::text, 5, '0') AS k "
              "FROM generate_series({lo}, {hi}) i ORDER BY i")

DEBEZIUM_TABLE = """
CREATE TABLE bench.debezium_outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb)"""
PLAIN_TABLE = """
CREATE TABLE bench.plain_outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id uuid NOT NULL,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb)"""

TABLES = {"outbox": "outbox.events", "debezium": "bench.debezium_outbox", "plain": "bench.plain_outbox"}

WALDUMP_LINE = re.compile(r"^(\S+/\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)")


def write_sql(shape, keys, lo, hi, topic="invoice"):
    """One transaction's statement for events lo..hi of `shape`."""
    events = EVENTS_SQL.format(keys=keys, lo=lo, hi=hi)
    if shape == "outbox":
        return f"SELECT count(outbox.enqueue('{topic}', k, {PAYLOAD_SQL})) FROM ({events}) s"
    if shape == "debezium":
        return (f"WITH ins AS (INSERT INTO bench.debezium_outbox (id, aggregatetype, aggregateid, type, payload) "
                f"SELECT gen_random_uuid(), 'invoice', k, 'invoice.paid', {PAYLOAD_SQL} FROM ({events}) s "
                f"RETURNING id) SELECT count(*) FROM ins")
    return (f"INSERT INTO bench.plain_outbox (event_id, aggregatetype, aggregateid, type, payload) "
            f"SELECT gen_random_uuid(), 'invoice', k, 'invoice.paid', {PAYLOAD_SQL} FROM ({events}) s")


class WalMeter:
    """WAL written between two points: bytes (insert position), records and full-page images
    (pg_stat_wal), and the records by kind (pg_waldump --stats over the range: index inserts,
    heap updates, ...)."""

    def __init__(self, db):
        self.db = db

    def point(self):
        row = self.db.sql("SELECT pg_current_wal_insert_lsn()::text, wal_records, wal_fpi, wal_bytes "
                          "FROM pg_stat_wal")[0]
        return {"lsn": row[0], "records": int(row[1]), "fpi": int(row[2])}

    def between(self, a, b):
        wal_bytes = int(self.db.value("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (b["lsn"], a["lsn"])))
        out = {"wal_bytes": wal_bytes, "records": b["records"] - a["records"], "fpi": b["fpi"] - a["fpi"],
               "by_kind": self.kinds(a["lsn"], b["lsn"])}
        return out

    def kinds(self, start, end):
        """{rmgr/record: [count, record bytes, fpi bytes]} (run() keeps the segments: wal_keep_size)."""
        if start == end:
            return {}
        # pg_waldump reads the files: the range's last records may still be in WAL buffers
        # (asynchronous ones, e.g. a hint's): the WAL writer flushes them within moments.
        common.wait_until(lambda: self.db.value("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (end,)), 30,
                          f"WAL flushed to {end}")
        p = subprocess.run(["pg_waldump", "-p", f"{self.db.pg.datadir}/pg_wal", "-s", start, "-e", end,
                            "--stats=record"], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"pg_waldump {start}..{end}: {p.stderr.strip()[-500:]}")
        kinds = {}
        for line in p.stdout.splitlines():
            m = WALDUMP_LINE.match(line.strip())
            if m and int(m.group(2)):
                kinds[m.group(1)] = [int(m.group(2)), int(m.group(3)), int(m.group(4))]
        return kinds


def table_stats(db, table):
    schema, name = table.split(".")
    db.sql("SELECT pg_stat_clear_snapshot()")
    row = db.sql("SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup, autovacuum_count, "
                 "vacuum_count, pg_total_relation_size(relid) FROM pg_stat_user_tables "
                 "WHERE schemaname = %s AND relname = %s", (schema, name))[0]
    keys = ("ins", "upd", "hot_upd", "del", "dead", "autovacuums", "vacuums", "total_bytes")
    return dict(zip(keys, (int(v) for v in row)))


def stats_settled(db, table, field, at_least, timeout=30):
    """Table statistics once `field` reached `at_least` (backends report their counts at the end
    of a transaction, workers when idle: up to a second or so later)."""
    try:
        common.wait_until(lambda: table_stats(db, table)[field] >= at_least, timeout, f"{table} {field} counted")
    except Exception:
        log(f"  {table}: {field} never reached {at_least} in the statistics; reported as it is")
    return table_stats(db, table)


def relay_paused(db, paused):
    """The database's relay workers off (paused) or back at the server's outbox.workers; the
    launcher applies a per-database count without a restart (no checkpoint in between)."""
    if paused:
        db.sql("ALTER DATABASE postgres SET outbox.workers = 0")
        common.wait_until(lambda: not any(r[1] for r in db.pg.workers()), 60, "relay workers stopped")
    else:
        db.sql("ALTER DATABASE postgres RESET outbox.workers")
        db.pg.wait_workers_running(db.workers, timeout=60)


def one_run(bench, shape, checkpoint, run):
    s = bench.sizes
    db = bench.db
    n, per_tx, keys = s["wal_events"], s["wal_per_transaction"], s["wal_keys"]
    meter = WalMeter(db)
    table = TABLES[shape]
    steps = {}
    topic = None
    if shape == "outbox":
        # retention 0: the relay purges nothing itself; the purge step below does, at once.
        bench.prepare("outbox", 1, s["rtt_ms"], retention="0")
        topic = bench.mock.new_topic("invoice")
        relay_paused(db, True)
    else:
        bench.prepare("floor", 0, s["rtt_ms"])
        db.sql(f"DROP TABLE IF EXISTS {table}")
        db.sql(DEBEZIUM_TABLE if shape == "debezium" else PLAIN_TABLE)
    db.sql("SELECT pg_stat_reset()")
    db.sql("CHECKPOINT")
    before = table_stats(db, table)

    def step(name, work):
        a = meter.point()
        t0 = time.time()
        work()
        b = meter.point()
        steps[name] = meter.between(a, b)
        steps[name]["seconds"] = round(time.time() - t0, 2)

    def write():
        with db.connect(autocommit=False) as c:
            for t, lo in enumerate(range(0, n, per_tx)):
                if checkpoint == "steps" and t == n // per_tx // 2:
                    c.commit()
                    db.sql("CHECKPOINT")
                c.execute(write_sql(shape, keys, lo, min(lo + per_tx, n) - 1, topic))
                if shape == "debezium":
                    # The pattern's DELETE in the same transaction: the connector reads the
                    # INSERT from the WAL, the table stays empty.
                    c.execute("DELETE FROM bench.debezium_outbox")
                c.commit()

    step("write" if shape != "outbox" else "enqueue", write)
    if shape == "outbox":
        if checkpoint == "steps":
            db.sql("CHECKPOINT")

        def publish():
            relay_paused(db, False)
            common.wait_until(lambda: db.value("SELECT count(*) FROM outbox.events WHERE status = 'published'") >= n,
                              max(120, n / 100), "wal_cost events published")
        step("publish", publish)
        if checkpoint == "steps":
            db.sql("CHECKPOINT")
        def purge():
            # outbox.purge deletes at most batch_size rows a call (10,000): call until done.
            while db.value("SELECT outbox.purge('0 s')"):
                pass
        step("purge", purge)
        settled = stats_settled(db, table, "del", before["del"] + n)
    else:
        settled = stats_settled(db, table, "ins", before["ins"] + n)
    if checkpoint == "steps":
        db.sql("CHECKPOINT")
    step("vacuum", lambda: db.sql(f"VACUUM {table}"))
    after = table_stats(db, table)
    total = {k: sum(st[k] for st in steps.values()) for k in ("wal_bytes", "records", "fpi")}
    no_vacuum = {k: sum(st[k] for name, st in steps.items() if name != "vacuum") for k in ("wal_bytes", "records", "fpi")}
    kinds = {}
    for st in steps.values():
        for kind, (count, rec, fpi) in st["by_kind"].items():
            k = kinds.setdefault(kind, [0, 0, 0])
            k[0] += count
            k[1] += rec
            k[2] += fpi
    index_inserts = sum(v[0] for k, v in kinds.items() if k.startswith("Btree/INSERT"))
    res = {
        "shape": shape, "checkpoint": checkpoint, "run": run, "events": n,
        "steps": steps,
        "wal_bytes_per_event": round(no_vacuum["wal_bytes"] / n, 1),
        "wal_bytes_per_event_with_vacuum": round(total["wal_bytes"] / n, 1),
        "wal_per_step_per_event": {name: round(st["wal_bytes"] / n, 1) for name, st in steps.items()},
        "fpi_per_event": round(total["fpi"] / n, 3),
        "records_per_event": round(total["records"] / n, 2),
        "index_inserts_per_event": round(index_inserts / n, 2),
        "heap_updates_per_event": round(sum(v[0] for k, v in kinds.items() if k.startswith("Heap/") and "UPDATE" in k) / n, 2),
        "dead_tuples_per_event": round((settled["dead"]) / n, 2),
        "updates": settled["upd"] - before["upd"], "hot_updates": settled["hot_upd"] - before["hot_upd"],
        "deletes": settled["del"] - before["del"],
        "autovacuums": after["autovacuums"] - before["autovacuums"],
        "by_kind": kinds,
    }
    log(f"  wal_cost {shape:8s} checkpoint={checkpoint:5s} run {run}: {res['wal_bytes_per_event']} B/event "
        f"(+vacuum {res['wal_bytes_per_event_with_vacuum']}), per step {res['wal_per_step_per_event']}, "
        f"fpi/event {res['fpi_per_event']}, index inserts/event {res['index_inserts_per_event']}, "
        f"dead tuples/event {res['dead_tuples_per_event']}, autovacuums {res['autovacuums']}")
    if shape == "outbox":
        db.configure(db.workers, retention="7d")  # the default again, for the other workloads
    else:
        db.sql(f"DROP TABLE {table}")
    return res


def summarize(runs):
    """Medians per (checkpoint, shape), and the outbox's ratios to the Debezium pattern and to
    the plain INSERT."""
    out = {}
    for checkpoint in CHECKPOINTS:
        row = {}
        for shape in SHAPES:
            rs = [r for r in runs if r["shape"] == shape and r["checkpoint"] == checkpoint]
            if not rs:
                continue
            steps = list(rs[0]["wal_per_step_per_event"])  # in the order they ran
            row[shape] = {
                "runs": len(rs),
                "wal_bytes_per_event": median([r["wal_bytes_per_event"] for r in rs]),
                "wal_bytes_per_event_with_vacuum": median([r["wal_bytes_per_event_with_vacuum"] for r in rs]),
                "per_step": {name: median([r["wal_per_step_per_event"].get(name, 0) for r in rs]) for name in steps},
                "fpi_per_event": median([r["fpi_per_event"] for r in rs]),
                "index_inserts_per_event": median([r["index_inserts_per_event"] for r in rs]),
                "heap_updates_per_event": median([r["heap_updates_per_event"] for r in rs]),
                "dead_tuples_per_event": median([r["dead_tuples_per_event"] for r in rs]),
                "autovacuums": median([r["autovacuums"] for r in rs]),
            }
        if "outbox" in row:
            for base in ("debezium", "plain"):
                if base in row:
                    for field in ("wal_bytes_per_event", "wal_bytes_per_event_with_vacuum"):
                        row["outbox"][f"{field}_vs_{base}"] = round(row["outbox"][field] / row[base][field], 2)
        out[checkpoint] = row
    return out


def run(bench):
    # A checkpoint recycles the WAL segments before it: keep them for pg_waldump's counts (how
    # long segments stay changes nothing of what is written).
    bench.db.sql("ALTER SYSTEM SET wal_keep_size = '4GB'")
    bench.db.sql("SELECT pg_reload_conf()")
    try:
        return run_all(bench)
    finally:
        bench.db.sql("ALTER SYSTEM RESET wal_keep_size")
        bench.db.sql("SELECT pg_reload_conf()")


def run_all(bench):
    runs = []
    for r in range(bench.runs):
        for checkpoint in CHECKPOINTS:
            # Each run starts with another shape (no shape always first after a restart).
            order = SHAPES[r % 3:] + SHAPES[:r % 3]
            for shape in order:
                res = bench.cell(f"wal_cost {shape} {checkpoint} run {r}", lambda: one_run(bench, shape, checkpoint, r))
                if res:
                    runs.append(res)
    return {"runs": runs, "summary": summarize(runs)}
