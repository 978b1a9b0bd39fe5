"""Shared machinery of the benchmark: the throwaway PostgreSQL with the extension, the librdkafka
mock cluster, data sets, the relays under test (ours and the baselines), and the verification of
what arrived in Kafka."""

import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "test"))
# The PostgreSQL the extension was installed into: $PG_CONFIG's (bench/run passes it on), else
# Debian's.
def _pg_bindir():
    pg_config = os.environ.get("PG_CONFIG")
    if pg_config:
        try:
            return subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            pass
    return "/usr/lib/postgresql/15/bin"


os.environ["PATH"] = _pg_bindir() + ":" + os.environ.get("PATH", "")

import psycopg
import psycopg.sql
from confluent_kafka import Consumer, KafkaError, TopicPartition, OFFSET_BEGINNING  # noqa: E402

from harness.mock_cluster import MockCluster  # noqa: E402
from harness.pg_cluster import PgCluster  # noqa: E402
from harness.wait import wait_until  # noqa: E402

import sql_floor  # noqa: E402

PARTITIONS = 12  # per topic, over the mock's 3 brokers (a workload may ask for another count)
PYTHON = "/usr/bin/python3"


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def seconds(interval):
    """An outbox.retention value such as "10s", "2min" or "7d" in seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|min|h|d)?\s*", interval)
    if not m:
        raise ValueError(f"not an interval: {interval!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, None: 1, "min": 60, "h": 3600, "d": 86400}[m.group(2)]


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def percentile(sorted_xs, p):
    if not sorted_xs:
        return None
    k = (len(sorted_xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (k - lo)


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------

# The extension's defaults (the test harness shortens some of them); the bench measures the
# relay as shipped. fsync stays on: production durability, every commit waits for its WAL flush.
BENCH_SETTINGS = {
    "fsync": "on",
    "shared_preload_libraries": "'outbox,pg_stat_statements'",
    "pg_stat_statements.track": "all",
    "outbox.poll_interval": "'10s'",
    "outbox.backoff_base": "'1s'",
    "outbox.backoff_max": "'300s'",
    "outbox.publish_timeout": "'30s'",
    "log_autovacuum_min_duration": "0",
    # outbox.delivery = exactly_once (the outbox_040_eos cells) prepares each batch's record
    # (PREPARE TRANSACTION): it needs max_prepared_transactions >= the relay's workers, a
    # restart-only setting, so it is set for the whole bench (the burst cells run up to 4 workers).
    # The other cells prepare nothing; the setting only reserves the shared memory of 8 slots.
    "max_prepared_transactions": "8",
}


class Postgres:
    """One PgCluster for the whole bench; the relay's worker count and bootstrap servers are
    changed with ALTER SYSTEM and a restart (outbox.workers needs one)."""

    def __init__(self, extra_settings=None):
        settings = dict(BENCH_SETTINGS)
        settings.update(extra_settings or {})
        settings["outbox.workers"] = "0"
        # The bench's "outbox" cells are 0.3.0's table, whatever the default version; 0.4.0's are
        # the outbox_040 cells, in a database of their own (preview_database below).
        self.pg = PgCluster(settings=settings, create_extension="0.3.0")
        self.pg.init().start().setup_database()
        self.workers = 0
        self._monitor = None
        self.current = {"outbox.workers": "0"}
        self.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.sql("CREATE SCHEMA IF NOT EXISTS bench")
        with self.connect() as c:
            c.execute(sql_floor.FLOOR_PROCEDURE_SQL)
            # The relay's own statements as a floor, while src/relay/relay_sql.cpp has them in the
            # shape sql_floor.py reads; the bench does not depend on it.
            try:
                c.execute(sql_floor.procedure_sql())
                self.relay_floor = True
            except (KeyError, OSError, psycopg.Error) as e:
                log(f"the relay-statement SQL floor is skipped: {e!r}")
                self.relay_floor = False

    # access
    def connect(self, autocommit=True):
        return self.pg.connect(autocommit=autocommit)

    def sql(self, query, params=None):
        return self.pg.sql(query, params)

    def value(self, query, params=None):
        return self.pg.value(query, params)

    @property
    def dsn(self):
        return f"host={self.pg.tmp} port={self.pg.port} user=postgres dbname=postgres"

    def configure(self, workers, bootstrap=None, settings=None, **outbox):
        """Relay with `workers` workers (0: off) publishing to `bootstrap`, plus any server
        `settings` ({name: value}, e.g. {"jit": "off"}) and outbox.* settings as keywords; ALTER
        SYSTEM and a restart when anything changed (outbox.workers needs one). An outbox.* keyword
        given as None, and outbox.kafka_connections when not given, is the setting's default (so
        a cell that changed it leaves nothing behind for the next). outbox.delivery likewise (the
        exactly_once cells set it); an outbox.* setting the installed relay does not have, asked
        at its default, is left out (a relay from before outbox.delivery)."""
        outbox.setdefault("kafka_connections", None)
        outbox.setdefault("delivery", None)
        wanted = {"outbox.workers": str(workers)}
        if bootstrap is not None:
            wanted["outbox.bootstrap_servers"] = bootstrap
        for name, value in (settings or {}).items():
            wanted[name] = str(value)
        for name, value in outbox.items():
            if value is None:
                value = self.value(f"SELECT boot_val FROM pg_settings WHERE name = 'outbox.{name}'")
                if value is None:
                    continue  # no such setting in the installed relay: nothing to reset
            wanted["outbox." + name] = str(value)
        changes = {k: v for k, v in wanted.items() if self.current.get(k) != v}
        if not changes:
            return
        with self.connect() as c:
            for name, value in changes.items():
                # (ALTER SYSTEM takes no bind parameters: the value is quoted client-side.)
                c.execute(psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(
                    psycopg.sql.SQL(name), psycopg.sql.Literal(value)))
        self.pg.restart()
        self.current.update(changes)
        self.workers = workers
        if workers:
            self.pg.wait_workers_running(workers, timeout=60)
            wait_until(lambda: all(r[2] == "idle" for r in self.pg.workers()), 60, "relay workers idle")

    def reset_outbox(self, keep_identity=False):
        self.sql("TRUNCATE outbox.events" + ("" if keep_identity else " RESTART IDENTITY"))
        self.sql("SELECT pg_stat_statements_reset()")

    def worker_pids(self):
        return [r[1] for r in self.pg.workers() if r[1]]

    def published_by_workers(self):
        """The workers' published counters (shared memory, via outbox.workers), over one kept
        connection: polled every 50 ms during a drain, a new connection per poll would cost the
        server a process start each time, paid by the outbox runs only."""
        for attempt in (0, 1):
            try:
                if self._monitor is None or self._monitor.closed:
                    self._monitor = self.connect()
                return int(self._monitor.execute(
                    "SELECT coalesce(sum(published), 0) FROM outbox.workers").fetchone()[0])
            except psycopg.OperationalError:
                self._monitor = None  # the server was restarted since
                if attempt:
                    raise
        return 0

    def relay_statement_times(self):
        """Mean execution time (ms) and calls of the relay's claim and record statements since the
        last reset (pg_stat_statements)."""
        out = {}
        for name, prefix in (("claim", "%(e.next_attempt_at IS NULL OR e.next_attempt_at <= now())%"),
                             ("record", "%published_at = statement_timestamp(),%kafka_partition = o.kafka_partition%")):
            row = self.sql("SELECT sum(calls), sum(total_exec_time) / nullif(sum(calls), 0), sum(rows) "
                           "FROM pg_stat_statements WHERE query LIKE %s", (prefix,))[0]
            out[name] = {"calls": int(row[0] or 0), "mean_ms": round(float(row[1]), 2) if row[1] else None}
        return out

    def stop(self):
        if self._monitor is not None:
            self._monitor.close()
        self.pg.cleanup()


# --------------------------------------------------------------------------------------------
# The 0.4.0 preview (CREATE EXTENSION outbox VERSION '0.4.0' in a database of its own; the
# default version stays 0.3.0): shared by wal_cost.py and bench.py's enqueue_overhead and burst
# cells. A cell that cannot run on it is skipped with the reason printed and recorded, never faked.
# --------------------------------------------------------------------------------------------

# An event id as enqueue generates it (RFC 9562 version 7, src/enqueue/event_id.cpp), in SQL: the
# Unix milliseconds of the clock, then random bits with the version and variant set. Used where
# the bench or a diagnostic INSERTs a row of enqueue's shape by hand, so that the row lands in
# the event-id index where enqueue's would (a random version 4 id lands on a random leaf).
UUID_V7_SQL = ("encode(set_byte(set_byte(overlay(uuid_send(gen_random_uuid()) PLACING "
               "substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) "
               "FROM 1 FOR 6), 6, 112 + floor(random() * 16)::int), 8, 128 + floor(random() * 64)::int), 'hex')::uuid")

# An event id as enqueue generates it since 0.4.1's library (src/enqueue/event_id.hpp): version 7's
# layout under version 8 with outbox's mark (...-80b0-...). A row of enqueue's shape INSERTed by
# hand into a 0.4.1 member with it says caller_event_id false, as enqueue's own does (no entry in
# the event-id index); with UUID_V7_SQL it would be a caller's id, indexed.
GENERATED_ID_SQL = ("encode(set_byte(set_byte(set_byte(overlay(uuid_send(gen_random_uuid()) PLACING "
                    "substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) "
                    "FROM 1 FOR 6), 6, 128), 7, 176), 8, 128 + floor(random() * 64)::int), 'hex')::uuid")

# 0.4.1 since its event-id index holds caller ids only (the cells keep their 0.4.0 names,
# outbox_040; this library writes 0.4.0's members through enqueue's statement, not directly).
PREVIEW = "0.4.1"
PREVIEW_DB = "bench_preview"
# The 0.4.0 tables of the contract (the counts sum over every table of schema outbox anyway).
PREVIEW_TABLES = ("outbox.events_0", "outbox.events_1", "outbox.events_2", "outbox.events_3", "outbox.landed",
                  "outbox.event_state", "outbox.cursors")


class Skipped(Exception):
    """A cell that cannot be measured here (the reason is printed and recorded, nothing faked)."""


class Database:
    """One database of the bench's cluster with the Postgres helpers' interface (sql, value,
    connect, pg), so that load(), expected_order() and verify() run on it as on "postgres"."""

    def __init__(self, db, dbname):
        self.db = db
        self.pg = db.pg
        self.dbname = dbname

    def connect(self, autocommit=True):
        return self.pg.connect(self.dbname, autocommit=autocommit)

    def sql(self, query, params=None):
        return self.pg.sql(query, params, dbname=self.dbname)

    def value(self, query, params=None):
        return self.pg.value(query, params, dbname=self.dbname)


def relay_paused(db, paused, dbname="postgres", n_workers=None):
    """The database's relay workers off (paused) or back at the server's outbox.workers; the
    launcher applies a per-database count without a restart (no checkpoint in between)."""
    if paused:
        db.sql(f'ALTER DATABASE "{dbname}" SET outbox.workers = 0')
        wait_until(lambda: not any(r[1] for r in db.pg.sql(
            "SELECT worker, pid FROM outbox.workers", dbname=dbname)), 60, f"relay workers of {dbname} stopped")
    else:
        db.sql(f'ALTER DATABASE "{dbname}" RESET outbox.workers')
        if dbname == "postgres":
            db.pg.wait_workers_running(db.workers, timeout=60)


def preview_available(db):
    """None when CREATE EXTENSION outbox VERSION '0.4.0' can be tried, else why not."""
    if not db.value("SELECT count(*) FROM pg_available_extension_versions WHERE name = 'outbox' AND version = %s",
                    (PREVIEW,)):
        installed = ", ".join(v for (v,) in db.sql(
            "SELECT version FROM pg_available_extension_versions WHERE name = 'outbox' ORDER BY version"))
        return (f"the installed extension has no {PREVIEW} script (versions available: {installed}); "
                f"install one built from a tree with sql/outbox--0.3.0--0.4.0.sql")
    return None


def preview_published(db):
    """Events the 0.4.0 relay published: ids named by outbox.landed (the contract's definition:
    published when a landed row names it)."""
    return int(db.pg.value("SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox.landed", dbname=PREVIEW_DB))


def preview_database(db):
    """A database of its own with CREATE EXTENSION outbox VERSION '0.4.0' and its relay paused
    (outbox.workers = 0 for it before the extension exists, so no worker starts at the commit)."""
    db.sql(f'DROP DATABASE IF EXISTS "{PREVIEW_DB}" WITH (FORCE)')
    db.sql(f'CREATE DATABASE "{PREVIEW_DB}"')
    db.sql(f'ALTER DATABASE "{PREVIEW_DB}" SET outbox.workers = 0')
    try:
        db.pg.sql(f"CREATE EXTENSION outbox VERSION '{PREVIEW}'", dbname=PREVIEW_DB)
    except Exception as e:
        raise Skipped(f"CREATE EXTENSION outbox VERSION '{PREVIEW}' failed: {str(e).strip()[:300]}")
    version = db.pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname=PREVIEW_DB)
    missing = [t for t in PREVIEW_TABLES if not db.pg.value("SELECT to_regclass(%s) IS NOT NULL", (t,),
                                                            dbname=PREVIEW_DB)]
    if version != PREVIEW or missing:
        raise Skipped(f"the {PREVIEW} schema is not the contract's (extversion {version}, missing {missing})")
    # A new database's catalogs get their hint bits set at their first reads (full-page images
    # after the checkpoint): done here, before it, as the other shapes' long-used database has.
    db.pg.sql("VACUUM", dbname=PREVIEW_DB)


def copy_table(db, table, dbname):
    """bench.<table> of the "postgres" database copied into `dbname` (same columns and types,
    binary COPY), with a unique index on n and VACUUM ANALYZE: the burst data sets, so that the
    preview drains the same events (ids, keys, payload bytes) as the other relays."""
    cols = db.sql("SELECT quote_ident(attname), format_type(atttypid, atttypmod) FROM pg_attribute "
                  "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                  (f"bench.{table}",))
    target = Database(db, dbname)
    target.sql("CREATE SCHEMA IF NOT EXISTS bench")
    target.sql(f"DROP TABLE IF EXISTS bench.{table}")
    target.sql(f"CREATE TABLE bench.{table} (" + ", ".join(f"{c} {t}" for c, t in cols) + ")")
    with db.connect() as src, target.connect() as dst:
        with src.cursor().copy(f"COPY bench.{table} TO STDOUT (FORMAT binary)") as cin, \
                dst.cursor().copy(f"COPY bench.{table} FROM STDIN (FORMAT binary)") as cout:
            for chunk in cin:
                cout.write(chunk)
    target.sql(f"CREATE UNIQUE INDEX ON bench.{table} (n)")
    target.sql(f"VACUUM ANALYZE bench.{table}")
    if target.value(f"SELECT count(*) FROM bench.{table}") != db.value(f"SELECT count(*) FROM bench.{table}"):
        raise RuntimeError(f"copy of bench.{table} into {dbname}: row counts differ")


def preview_workers(db, dbname=PREVIEW_DB):
    """The preview database's relay workers: [(worker, pid, state, published, last_error)]."""
    return db.pg.sql("SELECT worker, pid, state, published, last_error FROM outbox.workers ORDER BY worker",
                     dbname=dbname)


def preview_relay_ready(db, workers, dbname=PREVIEW_DB, timeout=60):
    """The preview database's relay back at the server's outbox.workers (relay_paused) and
    `workers` workers running and idle, as the 0.3.0 relay is before a load; a relay that refuses
    the schema (every worker 'misconfigured') is a Skipped cell."""
    relay_paused(db, False, dbname)

    def ready():
        rows = preview_workers(db, dbname)
        if rows and all(r[2] == "misconfigured" for r in rows):
            raise Skipped(f"the relay refuses the {PREVIEW} schema (its workers are misconfigured): {rows}")
        return len(rows) == workers and all(r[1] and r[2] == "idle" for r in rows)
    wait_until(ready, timeout, f"{workers} relay workers of {dbname} idle")


def preview_landed(db, dbname=PREVIEW_DB):
    """(ids named by outbox.landed, distinct ids among them, epoch of the last landed row): the
    contract's definition of published (a landed row names the event)."""
    row = db.pg.sql("SELECT count(u.id), count(DISTINCT u.id), extract(epoch FROM max(l.published_at)) "
                    "FROM outbox.landed l, unnest(l.ids) u(id)", dbname=dbname)[0]
    return int(row[0]), int(row[1]), float(row[2]) if row[2] is not None else None


def preview_phases(db, dbname=PREVIEW_DB):
    """Where the preview's worker spent its batches (outbox.worker_metrics, since the worker
    started: a new database per run, so per run): claim, publish (produce to the last report) and
    record, each {count, seconds}; plus the landed rows' statement times (one per record
    statement: the early records during a publish and the final one), as offsets from the first."""
    row = db.pg.sql("SELECT sum(claim_seconds_count), sum(claim_seconds_sum), sum(publish_seconds_count), "
                    "sum(publish_seconds_sum), sum(record_seconds_count), sum(record_seconds_sum), "
                    "sum(batches), sum(batch_size_sum) FROM outbox.worker_metrics", dbname=dbname)[0]
    phases = {name: {"count": int(row[2 * i] or 0), "seconds": round(float(row[2 * i + 1] or 0), 3)}
              for i, name in enumerate(("claim", "publish", "record"))}
    steps = db.pg.sql("SELECT extract(epoch FROM published_at - min(published_at) OVER ()) * 1000, n FROM "
                      "(SELECT published_at, sum(cardinality(ids)) AS n FROM outbox.landed GROUP BY 1) g ORDER BY 1",
                      dbname=dbname)
    # batches: the batches the workers recorded (one batch_size observation per batch that held
    # events; under exactly_once one Kafka transaction each); batch_events: the events in them.
    return {"phases": phases, "batches": int(row[6] or 0), "batch_events": int(row[7] or 0),
            "record_statements": [(round(float(t), 1), int(n)) for t, n in steps]}


# --------------------------------------------------------------------------------------------
# outbox.delivery = exactly_once (the outbox_040_eos cells)
# --------------------------------------------------------------------------------------------

def exactly_once_available(db, workers):
    """None when the installed relay has outbox.delivery = exactly_once and the server's
    max_prepared_transactions covers outbox.max_workers (and `workers`), else why not (the cell is skipped)."""
    rows = db.sql("SELECT enumvals FROM pg_settings WHERE name = 'outbox.delivery'")
    if not rows or "exactly_once" not in (rows[0][0] or []):
        return "the installed relay has no outbox.delivery = exactly_once (issue 18)"
    prepared = int(db.value("SELECT setting FROM pg_settings WHERE name = 'max_prepared_transactions'"))
    budget = int(db.value("SELECT setting FROM pg_settings WHERE name = 'outbox.max_workers'"))
    if prepared < max(workers, budget):
        return (f"max_prepared_transactions is {prepared}, exactly_once needs at least outbox.max_workers "
                f"({budget}); common.BENCH_SETTINGS sets it")
    return None


def transactional_ids(db, workers, dbname=PREVIEW_DB):
    """The relay workers' Kafka transactional ids under exactly_once, as the relay makes them
    (src/relay/worker.cpp TransactionalId: prefix-system identifier-database oid-workers-index);
    each is also the group id whose committed offset on the progress topic counts its batches."""
    prefix = db.value("SELECT setting FROM pg_settings WHERE name = 'outbox.transactional_id_prefix'")
    sysid = db.value("SELECT system_identifier FROM pg_control_system()")
    oid = db.value("SELECT oid FROM pg_database WHERE datname = %s", (dbname,))
    return [f"{prefix}-{sysid}-{oid}-{workers}-{i}" for i in range(workers)]


def progress_offsets(bootstrap, groups, topic):
    """{group: its committed offset on partition 0 of `topic`, or None when Kafka has none, or the
    error's name} read as a consumer of the group would (OffsetFetch). The relay commits its batch
    count there inside each Kafka transaction (send_offsets_to_transaction). librdkafka 2.0.2's
    mock cluster answers TxnOffsetCommit without storing the offsets (rdkafka_mock_handlers.c), so
    on the bench's mock this is None for every group: the batches are counted from the workers'
    metrics instead (preview_phases)."""
    out = {}
    for group in groups:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            tp = c.committed([TopicPartition(topic, 0)], timeout=10)[0]
            out[group] = tp.error.name() if tp.error else (tp.offset if tp.offset >= 0 else None)
        except Exception as e:  # recorded, not fatal: a diagnostic beside the workers' count
            out[group] = f"error: {e}"
        finally:
            c.close()
    return out


def prepared_batches_left(db):
    """Prepared transactions of the relay (gid outbox:...) left in the cluster: none once a drain
    is over (each batch's PREPARE is followed by its COMMIT PREPARED)."""
    return int(db.value("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'outbox:%'"))


def statement_profile(db, dbname, top=8):
    """The statements run in `dbname` since the last pg_stat_statements_reset(), by total time:
    the preview relay's per-batch SQL profile (calls, mean and total ms, rows)."""
    rows = db.sql("SELECT s.calls, s.total_exec_time, s.rows, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 160) "
                  "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
                  # not the bench's own: the load (enqueue and its member INSERT), the polls
                  "AND s.query NOT ILIKE '%%outbox.enqueue(%%' AND s.query NOT ILIKE 'INSERT INTO outbox.events\\_%%' "
                  "AND s.query NOT ILIKE '%%outbox.workers%%' AND s.query NOT ILIKE '%%FROM outbox.landed%%' "
                  "ORDER BY s.total_exec_time DESC LIMIT %s", (dbname, top))
    return [{"calls": int(c), "mean_ms": round(t / c, 2) if c else None, "total_ms": round(t, 1), "rows": int(r),
             "query": q} for c, t, r, q in rows]


# --------------------------------------------------------------------------------------------
# Data sets: built once with outbox.enqueue, replayed into outbox.events for every run with
# outbox.enqueue again (same event ids, keys, payload bytes, lanes), so every relay gets the same
# table shape and the same data.
# --------------------------------------------------------------------------------------------

def make_dataset(db, name, n, keys):
    """bench.<name>(n, event_id, key, payload, headers): n billing events (about 230 bytes of JSON)
    over `keys` keys. Keys follow a fixed pseudo-random sequence (hashint4(i) mod keys), not
    round-robin: with round-robin keys, consecutive 200-row claims of the baselines would hold
    disjoint keys and hide their per-key order problems."""
    db.reset_outbox()
    with db.connect() as c:
        c.execute("""
            SELECT count(outbox.enqueue('dataset', k, jsonb_build_object(
                'event', 'invoice.paid', 'invoice_id', 'inv-' || i, 'subscription_id', k,
                'amount_cents', 1000 + i %% 9000, 'currency', 'EUR', 'period', '2026-11',
                'customer_email', 'customer-' || (i %% 997) || '@example.com')))
            FROM (SELECT i, 'sub-' || lpad((abs(hashint4(i)) %% %s)::text, 5, '0') AS k
                  FROM generate_series(0, %s) i) s""",
                  (keys, n - 1))
        c.execute(f"DROP TABLE IF EXISTS bench.{name}")
        # The ids are given back to enqueue by load(), as a caller's: time-ordered ones of a
        # caller's kind (version 7), not enqueue's own (marked: refused when given back on 0.4.1).
        c.execute(f"CREATE TABLE bench.{name} AS SELECT row_number() OVER (ORDER BY id) AS n, {UUID_V7_SQL} AS event_id, "
                  f"key, payload, headers FROM outbox.events")
        c.execute(f"CREATE UNIQUE INDEX ON bench.{name} (n)")
    db.reset_outbox()


def load(db, dataset, n, topic, analyze=True):
    """Enqueues the first n events of a data set in one transaction (with analyze, ANALYZE
    included, so the planner knows the backlog as it would in a table that has been in use).
    `topic`: one topic, or a list: event n goes to topic[n % len], so each key's events are spread
    over all of them. Returns the wall-clock time of the commit (epoch seconds)."""
    topics = [topic] if isinstance(topic, str) else list(topic)
    with db.connect(autocommit=False) as c:
        c.execute(f"SELECT count(outbox.enqueue((%s::text[])[1 + s.n %% %s], s.key, s.payload, s.headers, s.event_id)) "
                  f"FROM (SELECT * FROM bench.{dataset} WHERE n <= %s ORDER BY n) s", (topics, len(topics), n))
        if analyze:
            c.execute("ANALYZE outbox.events")
        c.commit()
        return time.time()


def expected_order(db, only_published=False):
    """{(topic, key): [event_id, ...]} in enqueue order, and the number of events (only the
    published ones when a relay was stopped before the end of the backlog)."""
    by_key = {}
    rows = db.sql("SELECT topic, key, event_id::text FROM outbox.events "
                  + ("WHERE status = 'published' " if only_published else "") + "ORDER BY id")
    for topic, key, eid in rows:
        by_key.setdefault((topic, key), []).append(eid)
    return by_key, len(rows)


# --------------------------------------------------------------------------------------------
# Kafka side
# --------------------------------------------------------------------------------------------

class Mock:
    """The project's mock cluster program (3 brokers unless asked, TCP_NODELAY fixed), one topic per run."""

    def __init__(self, brokers=3):
        self.brokers = brokers
        self.mc = MockCluster(brokers=brokers, topics={})
        self.bootstrap = self.mc.bootstrap
        self.rtt_ms = 0
        self.topics = 0
        self.fixed_topics = set()

    def set_rtt(self, ms):
        if ms != self.rtt_ms:
            self.mc.rtt("all", ms)
            self.rtt_ms = ms

    def ensure_topic(self, name, partitions=1):
        """A topic of a fixed name, made once (the exactly_once relay's progress topic: the
        relay's CreateTopics is not served by librdkafka 2.0.2's mock cluster, and its OffsetFetch
        answers UNKNOWN_TOPIC_OR_PART for a topic that does not exist)."""
        if name not in self.fixed_topics:
            self.mc.create_topic(name, partitions)
            self.fixed_topics.add(name)
        return name

    def new_topic(self, prefix, partitions=PARTITIONS):
        self.topics += 1
        name = f"{prefix}-{self.topics}"
        self.mc.create_topic(name, partitions)
        return name

    def sockets(self):
        """{"accepted": broker connections accepted, "nodelay": of which with TCP_NODELAY on}."""
        return self.mc.stats()

    def close(self):
        self.mc.close()


class TopicReader(threading.Thread):
    """Reads every partition of `topic` (a name or a list of names) from the beginning:
    [(topic, partition, offset, key, event_id)].

    The mock cluster keeps only the last 5 MiB (or 100,000 record batches) of each partition and
    silently drops older data, so a run that sends more than that per partition must be read
    while it runs: start() the reader before the load, finish(expected) after the drain. Small
    runs are read afterwards with read_all(). Either way the low watermarks are checked, so that
    data the mock dropped is reported as such, never as lost.

    The reading ends once it holds the records expected and every partition was read to its end
    (its high watermark, asked when a poll found nothing new): every record sent until then, a
    late duplicate included, is read. A partition whose end cannot be reached ends the reading
    after `settle` seconds without a new record."""

    def __init__(self, bootstrap, topic, settle=1.0, isolation="read_committed"):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        # librdkafka's default, said explicitly: records of aborted Kafka transactions (the
        # exactly_once relay's) must not count. (librdkafka 2.0.2's mock cluster writes no
        # transaction markers and answers every Fetch with no aborted transactions: on it, an
        # aborted batch's records would be read, and counted as duplicates.)
        self.isolation = isolation
        self.topics = [topic] if isinstance(topic, str) else list(topic)
        self.settle = settle
        self.records = []
        self.expected = None
        self.deadline = None
        self.error = None
        self.dropped_by_mock = 0

    def run(self):
        try:
            self._read()
        except Exception as e:  # reported by finish()
            self.error = e

    def _read(self):
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "outbox-bench-reader",
                             "enable.auto.commit": False, "enable.partition.eof": False,
                             "auto.offset.reset": "earliest", "isolation.level": self.isolation,
                             "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
        try:
            # Each topic's own partition count, from the cluster (workloads differ).
            meta = consumer.list_topics(timeout=10).topics
            partitions = {t: sorted(meta[t].partitions) if t in meta else list(range(PARTITIONS)) for t in self.topics}
            every = [(t, p) for t in self.topics for p in partitions[t]]
            consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in every])
            read_to = {}  # (topic, partition) -> the offset after the last record read
            watermarks = None  # (topic, partition) -> (low, high), asked when the reading is over
            stalled_since = None
            read_at_check = None
            while True:
                msgs = consumer.consume(50000, timeout=0.2)
                got = 0
                for m in msgs:
                    if m.error():
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        raise RuntimeError(m.error())
                    eid = None
                    for k, v in (m.headers() or []):
                        if k == "event_id":
                            eid = v.decode()
                    self.records.append((m.topic(), m.partition(), m.offset(),
                                         m.key().decode() if m.key() is not None else None, eid))
                    read_to[m.topic(), m.partition()] = m.offset() + 1
                    got += 1
                if self.expected is None:
                    continue  # still tailing a run in progress
                if time.monotonic() > self.deadline:
                    break
                if got or len(self.records) < self.expected:
                    continue
                # Each partition's end, asked with the consumer unassigned: it stops fetching (each
                # broker holds an idle Fetch up to fetch.wait.max.ms, 500 ms, and a watermark query
                # on that connection waited behind it: 20 s for 48 partitions).
                consumer.unassign()
                watermarks = {tp: consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10) for tp in every}
                behind = [(t, p) for (t, p), (lo, hi) in watermarks.items() if read_to.get((t, p), lo) < hi]
                if not behind:
                    break
                if len(self.records) != read_at_check:
                    read_at_check, stalled_since = len(self.records), time.monotonic()
                elif time.monotonic() - stalled_since >= self.settle:
                    break
                consumer.assign([TopicPartition(t, p, read_to.get((t, p), OFFSET_BEGINNING)) for t, p in behind])
                watermarks = None
            if watermarks is None:
                consumer.unassign()
                watermarks = {tp: consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10) for tp in every}
            # Offsets the mock no longer has: everything below a partition's low watermark that
            # this reader did not see.
            seen = {}
            for topic, part, off, _, _ in self.records:
                seen[topic, part] = seen.get((topic, part), 0) + 1
            for tp, (lo, hi) in watermarks.items():
                if lo > 0:
                    self.dropped_by_mock += max(0, hi - seen.get(tp, 0))
        finally:
            consumer.close()

    def finish(self, expected, timeout=300.0):
        self.deadline = time.monotonic() + timeout
        self.expected = expected
        if not self.is_alive() and self.ident is None:
            self.start()
        self.join(timeout + 30)
        if self.error:
            raise self.error
        return self.records


def read_all(bootstrap, topic, expected, timeout=300.0):
    reader = TopicReader(bootstrap, topic)
    records = reader.finish(expected, timeout)
    return records, reader.dropped_by_mock


def check(records, by_key, n_expected):
    """lost / duplicates / per-(topic, key) order (judged on first deliveries in partition append
    order; by_key is keyed by (topic, key)). Same rules as
    test/harness/kafka_reader.check_delivery, in linear time."""
    seen = set()
    first_order = {}
    duplicates = 0
    for topic, part, off, key, eid in sorted(records, key=lambda r: r[:3]):
        if eid in seen:
            duplicates += 1
            continue
        seen.add(eid)
        first_order.setdefault((topic, key), []).append(eid)
    lost = 0
    violating_keys = 0
    out_of_place = 0
    unexpected = len(seen)
    for key, ids in by_key.items():
        idset = set(ids)
        lost += sum(1 for e in ids if e not in seen)
        got = [e for e in first_order.get(key, []) if e in idset]
        want = [e for e in ids if e in seen]
        unexpected -= len(want)
        if got != want:
            violating_keys += 1
            out_of_place += sum(1 for a, b in zip(got, want) if a != b)
    return {"expected": n_expected, "delivered": len(records), "unique": len(seen), "lost": lost,
            "duplicates": duplicates, "order_violation_keys": violating_keys,
            "events_out_of_place": out_of_place, "unexpected": unexpected}


def verify(db, mock, topic, only_published=False, reader=None):
    """Consumes every partition of `topic` (a name or a list; or finishes the reader that has been tailing it) and
    checks it against the table: lost (a row that is not in Kafka), duplicates, per-key order,
    and rows the relay left unpublished."""
    by_key, n = expected_order(db, only_published)
    if reader is None:
        reader = TopicReader(mock.bootstrap, topic)
    records = reader.finish(n)
    result = check(records, by_key, n)
    result["dropped_by_mock"] = reader.dropped_by_mock
    result["isolation_level"] = reader.isolation
    if reader.dropped_by_mock:
        raise RuntimeError(f"verification of {topic} impossible: the mock cluster dropped {reader.dropped_by_mock} "
                           "records (5 MiB per partition retention) before they were read")
    statuses = dict(db.sql("SELECT status, count(*) FROM outbox.events GROUP BY status"))
    result["unpublished_rows"] = 0 if only_published else n - statuses.get("published", 0)
    return result


# --------------------------------------------------------------------------------------------
# Worker memory
# --------------------------------------------------------------------------------------------

def proc_memory(pid):
    """{'VmRSS': kB, 'RssAnon': kB, 'RssFile': kB, 'RssShmem': kB, 'VmHWM': kB} of a process."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


class RssSampler(threading.Thread):
    """Samples the relay workers' memory every `interval` seconds."""

    def __init__(self, pids, interval=0.5):
        super().__init__(daemon=True)
        self.pids = pids
        self.interval = interval
        self.samples = []  # (t, pid, {..})
        self.stop_event = threading.Event()
        self.t0 = time.time()

    def run(self):
        while not self.stop_event.is_set():
            t = time.time() - self.t0
            for pid in self.pids:
                m = proc_memory(pid)
                if m:
                    self.samples.append((round(t, 2), pid, m))
            self.stop_event.wait(self.interval)

    def stop(self):
        self.stop_event.set()
        self.join()
        return self.summary()

    def summary(self):
        def peak(field):
            vals = [m.get(field, 0) for _, _, m in self.samples]
            return round(max(vals) / 1024, 1) if vals else None
        return {"peak_vmrss_mb": max(peak("VmRSS") or 0, peak("VmHWM") or 0), "peak_rss_anon_mb": peak("RssAnon"),
                "peak_rss_file_mb": peak("RssFile"), "peak_rss_shmem_mb": peak("RssShmem"),
                "peak_private_mb": round(max(((m.get("RssAnon", 0) + m.get("RssFile", 0)) for _, _, m in
                                              self.samples), default=0) / 1024, 1),
                "samples": len(self.samples)}


# --------------------------------------------------------------------------------------------
# Relays under test
# --------------------------------------------------------------------------------------------

# The baselines: kind -> (script, extra arguments).
BASELINES = {"seed": ("seed_relay.py", []), "batched": ("batched_relay.py", []),
             "tuned": ("batched_relay.py", ["--tuned"])}


class ExternalRelays:
    """N processes of a baseline relay (BASELINES); each prints its cumulative published count
    after every commit, and (batched_relay.py) the epoch its batch's acks were in."""

    def __init__(self, kind, n, dsn, bootstrap):
        script, extra = BASELINES[kind]
        self.procs = [subprocess.Popen([PYTHON, str(BENCH / script), dsn, bootstrap, *extra], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True) for _ in range(n)]
        self.counts = [0] * n
        self.acked = [None] * n
        self.ready = [False] * n
        self.threads = []
        for i, p in enumerate(self.procs):
            t = threading.Thread(target=self._read, args=(i, p), daemon=True)
            t.start()
            self.threads.append(t)

    def _read(self, i, p):
        for line in p.stdout:
            fields = line.split()
            if fields and fields[0].isdigit():
                self.counts[i] = int(fields[0])
                if len(fields) > 1:
                    self.acked[i] = float(fields[1])
            elif fields == ["ready"]:
                self.ready[i] = True

    def wait_ready(self, timeout=60.0):
        """Until every relay has connected to PostgreSQL and the brokers (it prints "ready"), so
        that no start-up time falls into a timed interval."""
        def ready():
            self.published()  # raises if one died
            return all(self.ready)
        wait_until(ready, timeout, "baseline relays ready")

    def published(self):
        for p in self.procs:
            if p.poll() is not None and p.returncode != 0:
                raise RuntimeError(f"baseline relay exited {p.returncode}: {p.stderr.read()[-2000:]}")
        return sum(self.counts)

    def last_ack(self):
        """Epoch of the last batch's acks over all processes (None if they do not report it)."""
        acked = [a for a in self.acked if a is not None]
        return max(acked) if acked else None

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_drained(published, n, timeout, what):
    """Polls published() (one kept connection reading shared memory, or the relays' own
    counters) until it reaches n."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if published() >= n:
            return True
        time.sleep(0.05)
    raise TimeoutError(f"{what}: {published()} of {n} published after {timeout} s")


def last_published_epoch(db):
    return float(db.value("SELECT extract(epoch FROM max(published_at)) FROM outbox.events"))


# --------------------------------------------------------------------------------------------
# Machine and versions
# --------------------------------------------------------------------------------------------

def machine_info():
    def cmd(args):
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            return None
    cpu = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    import confluent_kafka
    import psycopg
    os_release = {}
    try:
        for line in open("/etc/os-release"):
            k, _, v = line.strip().partition("=")
            os_release[k] = v.strip('"')
    except OSError:
        pass
    git = os.environ.get("OUTBOX_COMMIT") or cmd(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    # What was built: a digest of the extension's sources, so that runs on uncommitted trees
    # can still be told apart.
    import hashlib
    digest = hashlib.sha1()
    for path in sorted(list((REPO / "src").rglob("*.[ch]pp")) + list((REPO / "sql").glob("outbox--*.sql"))):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem_kb / 1048576, 1) if mem_kb else None,
        "os": os_release.get("PRETTY_NAME"), "kernel": platform.release(),
        "postgres": cmd(["postgres", "--version"]),
        "librdkafka": confluent_kafka.libversion()[0],
        "confluent_kafka_python": confluent_kafka.version()[0],
        "psycopg": psycopg.__version__, "python": platform.python_version(),
        "pgbench": cmd(["pgbench", "--version"]),
        "outbox_commit": git, "outbox_sources_sha1": digest.hexdigest()[:12],
    }


def flushbench():
    """test/mockbroker/flushbench: one 200-message flush at RTT 0, with and without TCP_NODELAY."""
    d = REPO / "test" / "mockbroker"
    res = subprocess.run([str(d / "flushbench"), "--mockbroker", str(d / "mockbroker")],
                         capture_output=True, text=True, timeout=120)
    out = res.stdout.strip()
    m = re.search(r"([\d.]+) ms \(nodelay\) vs ([\d.]+) ms", out)
    return {"output": out, "details": res.stderr.strip(),
            "nodelay_ms": float(m.group(1)) if m else None, "stock_ms": float(m.group(2)) if m else None}
