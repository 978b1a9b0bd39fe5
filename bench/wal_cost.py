"""What an event costs the primary, counted the way a DBA counts it: WAL bytes (with full-page
images), WAL records by kind (heap, index), dead tuples and vacuum, per event, for three shapes
on the same server in the same run:

- outbox: `outbox.enqueue` in the business transaction, published by the relay (librdkafka's
  mock cluster), then retention (`outbox.purge('0 s')`), then the VACUUM that the dead tuples
  left behind cost sooner or later (autovacuum's work, done at once so that it is counted);
- debezium: the Debezium outbox pattern: INSERT into a five-column outbox table and DELETE in
  the same transaction (the connector reads the INSERT from the WAL), then the VACUUM;
- plain: INSERT of the same columns into a table with a bigint primary key (the floor), then
  the VACUUM (it sets the visibility map; nothing is dead);
- outbox_040: the same steps as outbox on the 0.4.0 preview schema (`CREATE EXTENSION outbox
  VERSION '0.4.0'` in a database of its own, bench_preview), counted over every table of schema
  outbox (members events_0..3, landed, event_state, cursors, ring, ring_start). Skipped, with the
  reason printed and kept in the results ("skipped"), when the installed extension has no 0.4.0
  script or its relay does not publish the events within a deadline: never faked.

Per run: WAL per step, dead tuples per event (n_dead_tup after the run, before the VACUUM step,
summed over the shape's tables, and per table), autovacuum's work on the shape's tables
(pg_stat_user_tables' counts, and from the server log, log_autovacuum_min_duration = 0: runs,
pages scanned and removed, tuples removed, its WAL).

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
import os
import re
import subprocess
import time

import common
# The 0.4.0 preview's helpers, shared with the burst and enqueue cells (bench.py).
from common import (PREVIEW, PREVIEW_DB, Skipped, log, median, preview_available, preview_database,  # noqa: F401
                    preview_published, relay_paused)

SHAPES = ("outbox", "outbox_040", "debezium", "plain")
# The extension's shapes: "outbox" is the installed default version (0.3.0); "outbox_040" the
# 0.4.0 preview (CREATE EXTENSION outbox VERSION '0.4.0', in a database of its own), skipped with
# the reason when the installed extension has no 0.4.0 script or its relay does not publish.
OUTBOX_SHAPES = ("outbox", "outbox_040")
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

TABLES = {"outbox": "outbox.events", "outbox_040": "outbox.events_0", "debezium": "bench.debezium_outbox", "plain": "bench.plain_outbox"}

WALDUMP_LINE = re.compile(r"^(\S+/\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)")


def write_sql(shape, keys, lo, hi, topic="invoice"):
    """One transaction's statement for events lo..hi of `shape`."""
    events = EVENTS_SQL.format(keys=keys, lo=lo, hi=hi)
    if shape in OUTBOX_SHAPES:
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
        # The start's segment named: without a file, pg_waldump reads the segment size from the
        # first file it finds in the directory, which may be one created ahead, still all zeros
        # (seen after CREATE DATABASE).
        first, last = self.db.sql("SELECT (pg_walfile_name_offset(%s::pg_lsn)).file_name, pg_walfile_name(%s::pg_lsn)",
                                  (start, end))[0]
        p = subprocess.run(["pg_waldump", "-p", f"{self.db.pg.datadir}/pg_wal", "-s", start, "-e", end,
                            "--stats=record", first, last], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"pg_waldump {start}..{end}: {p.stderr.strip()[-500:]}")
        kinds = {}
        for line in p.stdout.splitlines():
            m = WALDUMP_LINE.match(line.strip())
            if m and int(m.group(2)):
                kinds[m.group(1)] = [int(m.group(2)), int(m.group(3)), int(m.group(4))]
        return kinds


def tables_of(shape):
    """pg_stat_user_tables rows a shape's counts sum over: every table of schema outbox for the
    extension (0.3.0: events, consumed; 0.4.0: events_0..3, landed, event_state, cursors, ring,
    ring_start), the one table for the baselines."""
    if shape in OUTBOX_SHAPES:
        return "schemaname = 'outbox'", ()
    schema, name = TABLES[shape].split(".")
    return "schemaname = %s AND relname = %s", (schema, name)


def table_stats(db, shape, dbname=None):
    """Sums over the shape's tables, plus each table's dead tuples (by_table)."""
    where, params = tables_of(shape)
    with db.pg.connect(dbname) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        rows = c.execute("SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, "
                         "n_dead_tup, autovacuum_count, vacuum_count, pg_total_relation_size(relid) "
                         f"FROM pg_stat_user_tables WHERE {where} ORDER BY 1", params).fetchall()
    if not rows:
        raise RuntimeError(f"wal_cost {shape}: no table in pg_stat_user_tables ({where} {params})")
    keys = ("ins", "upd", "hot_upd", "del", "dead", "autovacuums", "vacuums", "total_bytes")
    out = {k: sum(int(r[i + 1]) for r in rows) for i, k in enumerate(keys)}
    out["by_table"] = {r[0]: {"dead": int(r[5]), "upd": int(r[2]), "del": int(r[4]), "total_bytes": int(r[8])}
                       for r in rows}
    return out


def stats_settled(db, shape, field, at_least, dbname=None, timeout=30):
    """Table statistics once `field` reached `at_least` (backends report their counts at the end
    of a transaction, workers when idle: up to a second or so later)."""
    try:
        common.wait_until(lambda: table_stats(db, shape, dbname)[field] >= at_least, timeout,
                          f"{shape} {field} counted")
    except Exception:
        log(f"  {shape}: {field} never reached {at_least} in the statistics; reported as it is")
    return table_stats(db, shape, dbname)


# PostgreSQL 15's autovacuum log entry (log_autovacuum_min_duration = 0, bench settings).
AUTOVACUUM_ENTRY = re.compile(r'automatic vacuum of table "([^"]+)"')
AUTOVACUUM_PAGES = re.compile(r"pages: (\d+) removed, (\d+) remain, (\d+) scanned")
AUTOVACUUM_TUPLES = re.compile(r"tuples: (\d+) removed")
AUTOVACUUM_WAL = re.compile(r"WAL usage: (\d+) records, (\d+) full page images, (\d+) bytes")


class AutovacuumLog:
    """Autovacuum's work on a shape's tables from the server log between two points: runs, pages
    scanned and removed, tuples removed, the WAL it wrote (its WAL is in the steps' WAL already)."""

    def __init__(self, db):
        self.path = db.pg.log_path
        self.start = os.path.getsize(self.path)

    def work(self, prefix):
        """prefix: "db.schema." or "db.schema.table" of the tables that count."""
        with open(self.path, errors="replace") as f:
            f.seek(self.start)
            text = f.read()
        out = {"runs": 0, "pages_scanned": 0, "pages_removed": 0, "tuples_removed": 0, "wal_bytes": 0, "tables": {}}
        entries = AUTOVACUUM_ENTRY.split(text)
        # split: [before, table1, body1, table2, body2, ...]; a body runs to the next log line
        # that is not a continuation (the entry's own lines are tab-indented).
        for table, body in zip(entries[1::2], entries[2::2]):
            if not (table == prefix or (prefix.endswith(".") and table.startswith(prefix))):
                continue
            lines = [body.split("\n", 1)[0]]
            for line in body.split("\n")[1:]:
                if not line.startswith("\t"):
                    break
                lines.append(line)
            entry = "\n".join(lines)
            out["runs"] += 1
            out["tables"][table] = out["tables"].get(table, 0) + 1
            if m := AUTOVACUUM_PAGES.search(entry):
                out["pages_removed"] += int(m.group(1))
                out["pages_scanned"] += int(m.group(3))
            if m := AUTOVACUUM_TUPLES.search(entry):
                out["tuples_removed"] += int(m.group(1))
            if m := AUTOVACUUM_WAL.search(entry):
                out["wal_bytes"] += int(m.group(3))
        return out


def one_run(bench, shape, checkpoint, run):
    s = bench.sizes
    db = bench.db
    meter = WalMeter(db)
    steps = {}
    topic = None
    dbname = PREVIEW_DB if shape == "outbox_040" else None
    if shape in OUTBOX_SHAPES:
        # retention 0: the relay purges nothing itself; the purge step below does, at once.
        bench.prepare("outbox", 1, s["rtt_ms"], retention="0")
        topic = bench.mock.new_topic("invoice")
    try:
        if shape in OUTBOX_SHAPES:
            relay_paused(db, True)
            if shape == "outbox_040":
                preview_database(db)
        else:
            bench.prepare("floor", 0, s["rtt_ms"])
            db.sql(f"DROP TABLE IF EXISTS {TABLES[shape]}")
            db.sql(DEBEZIUM_TABLE if shape == "debezium" else PLAIN_TABLE)
        return measured(bench, shape, checkpoint, run, meter, steps, topic, dbname)
    finally:
        if shape in OUTBOX_SHAPES:
            if shape == "outbox_040":
                db.sql(f'DROP DATABASE IF EXISTS "{PREVIEW_DB}" WITH (FORCE)')
            relay_paused(db, False)  # (the publish step did already, unless it failed)
            db.configure(db.workers, retention="7d")  # the default again, for the other workloads
        else:
            db.sql(f"DROP TABLE IF EXISTS {TABLES[shape]}")


def measured(bench, shape, checkpoint, run, meter, steps, topic, dbname):
    s = bench.sizes
    db = bench.db
    n, per_tx, keys = s["wal_events"], s["wal_per_transaction"], s["wal_keys"]
    # Every shape starts from a vacuumed database (catalog hint bits set, nothing left to
    # prune by an earlier workload), then the checkpoint.
    db.pg.sql("VACUUM", dbname=dbname)
    db.pg.sql("SELECT pg_stat_reset()", dbname=dbname)
    db.sql("CHECKPOINT")
    before = table_stats(db, shape, dbname)
    autovacuum = AutovacuumLog(db)

    def step(name, work):
        a = meter.point()
        t0 = time.time()
        work()
        b = meter.point()
        steps[name] = meter.between(a, b)
        steps[name]["seconds"] = round(time.time() - t0, 2)

    def write():
        with db.pg.connect(dbname, autocommit=False) as c:
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

    step("write" if shape not in OUTBOX_SHAPES else "enqueue", write)
    published = None
    if shape in OUTBOX_SHAPES:
        if checkpoint == "steps":
            db.sql("CHECKPOINT")

        def publish():
            if shape == "outbox":
                relay_paused(db, False)
                common.wait_until(lambda: db.value("SELECT count(*) FROM outbox.events WHERE status = 'published'") >= n,
                                  max(120, n / 100), "wal_cost events published")
                return
            relay_paused(db, False, PREVIEW_DB)
            deadline = s.get("wal_preview_deadline_s") or max(120, n / 100)

            # Polled with a deadline; a relay that refuses the schema says so in outbox.workers'
            # state ('misconfigured', with its reason): the cell is skipped then at once.
            t_end = time.monotonic() + deadline
            while True:
                done = preview_published(db)
                if done >= n:
                    return
                try:
                    workers = db.pg.sql("SELECT state, last_error FROM outbox.workers", dbname=PREVIEW_DB)
                    refused = bool(workers) and all(state == "misconfigured" for state, _ in workers)
                except Exception as e:  # the preview may have no outbox.workers view: the deadline then
                    workers, refused = repr(e), False
                if refused or time.monotonic() > t_end:
                    raise Skipped(f"the relay did not publish on {PREVIEW} "
                                  + ("(its workers are misconfigured)" if refused else f"within {deadline:.0f} s")
                                  + f": {done} of {n} events named by outbox.landed; outbox.workers (state, "
                                  f"last_error): {str(workers)[:300]}")
                time.sleep(0.1)
        step("publish", publish)
        published = n if shape == "outbox" else preview_published(db)
        if checkpoint == "steps":
            db.sql("CHECKPOINT")

        def purge():
            # 0.3.0's outbox.purge deletes at most batch_size rows a call (10,000): call until
            # done. 0.4.0's returns 0: it seals the current member and empties those the cursors passed
            # (a TRUNCATE, their landed rows deleted), nothing row by row.
            with db.pg.connect(dbname) as c:
                while c.execute("SELECT outbox.purge('0 s')").fetchone()[0]:
                    pass
        step("purge", purge)
        if shape == "outbox":
            settled = stats_settled(db, shape, "del", before["del"] + n, dbname)
        else:
            settled = stats_settled(db, shape, "ins", before["ins"] + n, dbname)
    else:
        settled = stats_settled(db, shape, "ins", before["ins"] + n, dbname)
    if checkpoint == "steps":
        db.sql("CHECKPOINT")
    where, params = tables_of(shape)
    tables = [t for (t,) in db.pg.sql(f"SELECT quote_ident(schemaname) || '.' || quote_ident(relname) "
                                      f"FROM pg_stat_user_tables WHERE {where}", params, dbname=dbname)]
    vacuum = {"pages_scanned": 0, "pages_removed": 0, "tuples_removed": 0, "wal_bytes": 0}

    def vacuum_step():
        # VERBOSE: the pages it scanned and removed (autovacuum's work, done at once), from the
        # same report autovacuum logs.
        def notice(d):
            text = d.message_primary or ""
            if m := AUTOVACUUM_PAGES.search(text):
                vacuum["pages_removed"] += int(m.group(1))
                vacuum["pages_scanned"] += int(m.group(3))
            if m := AUTOVACUUM_TUPLES.search(text):
                vacuum["tuples_removed"] += int(m.group(1))
            if m := AUTOVACUUM_WAL.search(text):
                vacuum["wal_bytes"] += int(m.group(3))
        with db.pg.connect(dbname) as c:
            c.add_notice_handler(notice)
            c.execute("VACUUM (VERBOSE) " + ", ".join(tables))
    step("vacuum", vacuum_step)
    after = table_stats(db, shape, dbname)
    database = dbname or "postgres"
    av = autovacuum.work(f"{database}.outbox." if shape in OUTBOX_SHAPES else f"{database}.{TABLES[shape]}")
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
        "shape": shape, "checkpoint": checkpoint, "run": run, "events": n, "published": published,
        "extversion": db.pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname=dbname)
        if shape in OUTBOX_SHAPES else None,
        "steps": steps,
        "wal_bytes_per_event": round(no_vacuum["wal_bytes"] / n, 1),
        "wal_bytes_per_event_with_vacuum": round(total["wal_bytes"] / n, 1),
        "wal_per_step_per_event": {name: round(st["wal_bytes"] / n, 1) for name, st in steps.items()},
        "fpi_per_event": round(total["fpi"] / n, 3),
        "records_per_event": round(total["records"] / n, 2),
        "index_inserts_per_event": round(index_inserts / n, 2),
        "heap_updates_per_event": round(sum(v[0] for k, v in kinds.items() if k.startswith("Heap/") and "UPDATE" in k) / n, 2),
        # n_dead_tup after the run (before the VACUUM step), summed over the shape's tables.
        "dead_tuples_per_event": round((settled["dead"]) / n, 2),
        "dead_tuples_by_table": {t: v["dead"] for t, v in settled["by_table"].items() if v["dead"]},
        "updates": settled["upd"] - before["upd"], "hot_updates": settled["hot_upd"] - before["hot_upd"],
        "deletes": settled["del"] - before["del"],
        "autovacuums": after["autovacuums"] - before["autovacuums"],
        "autovacuum": av,
        "autovacuum_pages_scanned_per_1000_events": round(1000 * av["pages_scanned"] / n, 2),
        "vacuum": vacuum,
        "vacuum_pages_scanned_per_1000_events": round(1000 * vacuum["pages_scanned"] / n, 2),
        "by_kind": kinds,
    }
    log(f"  wal_cost {shape:10s} checkpoint={checkpoint:5s} run {run}: {res['wal_bytes_per_event']} B/event "
        f"(+vacuum {res['wal_bytes_per_event_with_vacuum']}), per step {res['wal_per_step_per_event']}, "
        f"fpi/event {res['fpi_per_event']}, index inserts/event {res['index_inserts_per_event']}, "
        f"dead tuples/event {res['dead_tuples_per_event']}, autovacuums {res['autovacuums']} "
        f"({av['pages_scanned']} pages scanned), VACUUM step {vacuum['pages_scanned']} pages scanned")
    return res


def summarize(runs):
    """Medians per (checkpoint, shape), and each outbox shape's ratios to the Debezium pattern
    and to the plain INSERT."""
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
                "autovacuum_pages_scanned_per_1000_events": median(
                    [r.get("autovacuum_pages_scanned_per_1000_events") for r in rs]),
                "vacuum_pages_scanned_per_1000_events": median(
                    [r.get("vacuum_pages_scanned_per_1000_events") for r in rs]),
            }
        for shape in OUTBOX_SHAPES:
            if shape in row:
                for base in ("debezium", "plain"):
                    if base in row:
                        for field in ("wal_bytes_per_event", "wal_bytes_per_event_with_vacuum"):
                            row[shape][f"{field}_vs_{base}"] = round(row[shape][field] / row[base][field], 2)
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
    skipped = {}  # shape -> the reason (printed once; the shape's other cells are not tried)
    reason = preview_available(bench.db)
    if reason:
        skipped["outbox_040"] = reason
        log(f"  wal_cost outbox {PREVIEW} preview skipped: {reason}")
    for r in range(bench.runs):
        for checkpoint in CHECKPOINTS:
            # Each run starts with another shape (no shape always first after a restart).
            order = SHAPES[r % len(SHAPES):] + SHAPES[:r % len(SHAPES)]
            for shape in order:
                if shape in skipped:
                    continue

                def cell():
                    try:
                        return one_run(bench, shape, checkpoint, r)
                    except Skipped as e:
                        skipped[shape] = str(e)
                        log(f"  wal_cost {shape} checkpoint={checkpoint} run {r} skipped: {e}")
                        return None
                res = bench.cell(f"wal_cost {shape} {checkpoint} run {r}", cell)
                if res:
                    runs.append(res)
    return {"runs": runs, "summary": summarize(runs), "skipped": skipped}
