#!/usr/bin/python3
"""The outbox benchmark suite (bench/README.md). Run it through bench/run, which installs and
builds what it needs and runs this as an unprivileged user when started as root.

    bench.py [--quick] [--runs N] [--out DIR] [--only drain,hot_keys,...]

Workloads: burst_4topic, burst_1topic, burst_4topic_3x6, burst_4topic_1broker, drain, hot_keys, burst, idle_latency,
enqueue_overhead, memory, table_health, wal_cost.
Writes DIR/results.json and DIR/*.png, prints a table."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

import common  # noqa: E402
import sql_floor  # noqa: E402
import wal_cost  # noqa: E402
from common import (ExternalRelays, Mock, Postgres, RssSampler, last_published_epoch, load, log,  # noqa: E402
                    make_dataset, median, percentile, verify, wait_drained)

WORKLOADS = ["burst_4topic", "burst_1topic", "burst_4topic_3x6", "burst_4topic_1broker", "drain", "hot_keys", "burst", "idle_latency", "enqueue_overhead",
             "memory", "table_health", "wal_cost"]
# The burst-drain workloads: name -> the topics each key's events are spread over.
BURST_TOPICS = {"burst_4topic": ["invoice", "payment", "refund", "dunning"], "burst_1topic": ["billing"],
                "burst_4topic_3x6": ["invoice", "payment", "refund", "dunning"],
                "burst_4topic_1broker": ["invoice", "payment", "refund", "dunning"]}
# Per burst workload: (partitions per topic, data set, keys); the default shape is 12 partitions
# per topic over the mock's 3 brokers. burst_4topic_3x6: 3 brokers x 6 partitions per topic and
# 1,024 keys, a shape the relay is not tuned on.
BURST_SHAPES = {"burst_4topic_3x6": (6, "ds_burst_1024", 1024)}
# Per burst workload: the brokers of its mock cluster (default: the bench's one, 3 brokers).
# burst_4topic_1broker: burst_4topic's topics, partitions and keys with every partition on ONE
# broker (each batch's produce requests go to one leader).
BURST_BROKERS = {"burst_4topic_1broker": 1}
# outbox_040: the 0.4.0 preview's relay (CREATE EXTENSION outbox VERSION '0.4.0' in a database of
# its own, common.PREVIEW_DB) on the same data set; skipped with the reason when it cannot run.
# table_health: the 0.4.0 preview by default (issue 16 item 4 is measured there), 0.3.0 on request.
HEALTH_SYSTEMS = ["outbox_040", "outbox"]
HEALTH_SYSTEMS_DEFAULT = ["outbox_040"]
# outbox_040_1conn: the same relay with outbox.kafka_connections = 1 (one producer that partitions
# itself, the relay before that setting): what the connections give, in the same run.
# outbox_040_eos: the same relay with outbox.delivery = exactly_once (issue 18): one transactional
# producer per worker (kafka_connections ignored), one Kafka transaction per batch, the batch's
# record prepared before the Kafka commit and COMMIT PREPARED after; what that costs, in the same run
# (common.BENCH_SETTINGS gives the server the max_prepared_transactions it needs).
BURST_SYSTEMS = ["outbox", "outbox_040", "outbox_040_1conn", "outbox_040_eos", "tuned", "batched", "floor_delete",
                 "floor_update", "floor_update2"]
# The preview's relay cells: system -> its outbox.* settings (None: the setting's default).
PREVIEW_SYSTEMS = {"outbox_040": {"kafka_connections": None, "delivery": None},
                   "outbox_040_1conn": {"kafka_connections": 1, "delivery": None},
                   "outbox_040_eos": {"kafka_connections": None, "delivery": "exactly_once"}}


def pgbench_scripts(stdout, n):
    """Per script of a pgbench run given n scripts (-f a@1 -f b@1 ...), in their order: the
    transactions it ran and its average latency (pgbench prints a section per script)."""
    sections = stdout.split("SQL script ")[1:]
    if len(sections) != n:
        raise RuntimeError(f"pgbench printed {len(sections)} script sections, not {n}: {stdout[-2000:]}")
    scripts = []
    for section in sections:
        transactions = latency = None
        for line in section.splitlines():
            words = line.replace("-", " ").split()
            if len(words) > 1 and words[1] == "transactions" and words[0].isdigit():
                transactions = int(words[0])
            if line.strip().startswith("- latency average ="):
                latency = float(line.split("=")[1].split()[0])
        if not transactions or latency is None:
            raise RuntimeError(f"pgbench printed no transactions or latency for a script: {section[:500]}")
        scripts.append({"transactions": transactions, "latency_avg_ms": latency})
    return scripts

# Sizes. FULL follows the issue except where the time budget of one run (about 50 minutes on a
# 2-core machine) forces a scale-down; RESULTS.md lists each one and why.
FULL = {
    "drain_events": 100_000, "many_keys": 1000, "hot_keys": 10,
    "drain_workers": [1, 2, 4], "drain_rtts_ms": [0, 5],
    "baseline_window_s": 12,         # the seed-style relay runs this long on the full backlog
    "memory_window_s": 150,          # at most this much of the 1M-event drain (RSS sampled)
    "burst_events": 40_000, "burst_seconds": 120,
    "latency_seconds": 60, "latency_interval_ms": 20, "latency_baseline_seconds": 30,
    "pgbench_seconds": 12, "pgbench_clients": [1, 4],
    "memory_events": 1_000_000,
    # Issue 16 item 4: 30 minutes at 2,000 events/s (--health-minutes, --health-rate).
    "health_seconds": 1800, "health_rate": 2000, "health_retention": "10s",
    "rtt_ms": 5,
    "burst_drain_events": 100_000, "burst_drain_keys": 1000,
    "burst_drain_rtts_ms": [0, 5, 20], "burst_drain_workers": [1, 2, 4],
    "wal_events": 20_000, "wal_per_transaction": 100, "wal_keys": 1000,
    "wal_preview_deadline_s": 300,   # the 0.4.0 relay publishes the events within this, or the cell is skipped
}
QUICK = {
    "drain_events": 3000, "many_keys": 100, "hot_keys": 10,
    "drain_workers": [1, 2], "drain_rtts_ms": [0, 5],
    "baseline_window_s": 2, "memory_window_s": 4,
    "burst_events": 600, "burst_seconds": 3,
    "latency_seconds": 3, "latency_interval_ms": 20, "latency_baseline_seconds": 2,
    "pgbench_seconds": 2, "pgbench_clients": [1],
    "memory_events": 10_000,
    "health_seconds": 20, "health_rate": 200, "health_retention": "2s",
    "rtt_ms": 5,
    # The real burst size (so that a quick run of one burst workload says something), in one cell
    # per relay: RTT 5 ms, one worker. --burst-events shrinks it (the smoke test does).
    "burst_drain_events": 100_000, "burst_drain_keys": 1000,
    "burst_drain_rtts_ms": [5], "burst_drain_workers": [1],
    "wal_events": 2000, "wal_per_transaction": 100, "wal_keys": 100,
    "wal_preview_deadline_s": 60,
}

PREVIEW_LABEL = f"outbox {common.PREVIEW} (default)"

# The design-independent floors (sql_floor.py): system -> bench.floor_claim mode.
FLOOR_SYSTEMS = {"floor_" + mode: mode for mode in sql_floor.FLOOR_MODES}


class Bench:
    def __init__(self, args):
        self.args = args
        self.sizes = dict(QUICK if args.quick else FULL)
        # A part of the burst grid (for a targeted run; the full grid is hours).
        for option, size in (("burst_rtts", "burst_drain_rtts_ms"), ("burst_workers", "burst_drain_workers")):
            if getattr(args, option):
                self.sizes[size] = [int(v) for v in getattr(args, option).split(",")]
        if args.health_minutes is not None:
            self.sizes["health_seconds"] = round(args.health_minutes * 60)
        if args.burst_events is not None:
            self.sizes["burst_drain_events"] = args.burst_events
        if args.health_rate is not None:
            self.sizes["health_rate"] = args.health_rate
        if args.wal_events is not None:
            self.sizes["wal_events"] = args.wal_events
        self.runs = args.runs if args.runs else (1 if args.quick else 3)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results = {"meta": {}, "config": self.sizes, "flushbench": None, "workloads": {}, "errors": [],
                        "skipped": {}}  # workload -> {system: why it was not measured}
        self.preview_reason = None  # why the 0.4.0 preview cannot run here (checked once), or None
        self.db = None
        self.mock = None
        self.seed_index = False
        self.tuned_index = None

    # -- helpers --------------------------------------------------------------------------------
    def save(self):
        with open(self.out / "results.json", "w") as f:
            json.dump(self.results, f, indent=1, default=str)

    def seed_index_on(self, on):
        """The articles' partial index for their claim (ORDER BY created_at WHERE status = 'pending');
        present only while a baseline runs, so the outbox relay never pays for it."""
        if on and not self.seed_index:
            self.db.sql("CREATE INDEX IF NOT EXISTS bench_seed_pending_created_idx ON outbox.events (created_at) "
                        "WHERE status = 'pending'")
        elif not on and self.seed_index:
            self.db.sql("DROP INDEX IF EXISTS outbox.bench_seed_pending_created_idx")
        self.seed_index = on

    def tuned_index_on(self, on):
        """The tuned baseline's claim (ORDER BY id WHERE status = 'pending') needs a partial index
        on id: the relay's own if it has one of exactly that shape, else one of the bench's,
        present only while the tuned baseline runs."""
        if on and self.tuned_index is None:
            has = self.db.value("SELECT count(*) FROM pg_indexes WHERE schemaname = 'outbox' AND tablename = 'events' "
                                "AND indexdef LIKE %s", ("%USING btree (id) WHERE (status = 'pending'::text)",))
            if not has:
                self.db.sql("CREATE INDEX bench_tuned_pending_id_idx ON outbox.events (id) WHERE status = 'pending'")
            self.tuned_index = not has
        elif not on and self.tuned_index is not None:
            if self.tuned_index:
                self.db.sql("DROP INDEX IF EXISTS outbox.bench_tuned_pending_id_idx")
            self.tuned_index = None

    def prepare(self, system, workers, rtt, commit_timestamps=False, **outbox):
        """Relay `system` ready on an empty outbox.events at RTT `rtt`: the outbox relay with
        `workers` workers, or the relay off for the baselines and the SQL floor.
        commit_timestamps: track_commit_timestamp on (the latency workload reads each enqueue's
        exact commit time; off elsewhere, it costs every commit a little)."""
        self.mock.set_rtt(rtt)
        # The SQL floor runs with JIT off: it stands for the statements' own cost. (Run from
        # PL/pgSQL, its custom plans can cross jit_above_cost where the relay's do not, and it
        # would then measure LLVM compile time instead; RESULTS.md.)
        settings = {"jit": "off" if system.endswith("_jit_off") or system == "floor" else "on",
                    "track_commit_timestamp": "on" if commit_timestamps else "off"}
        self.db.reset_outbox()  # a restarted relay must find nothing left from the last run
        if system.startswith("outbox"):
            self.seed_index_on(False)
            self.tuned_index_on(False)
            self.db.configure(workers, self.mock.bootstrap, settings, **outbox)
        else:
            self.db.configure(0, self.mock.bootstrap, settings)
            self.seed_index_on(system in ("seed", "batched"))
            self.tuned_index_on(system == "tuned")
        self.db.reset_outbox()

    def cell(self, label, run, kind="cell"):
        """One measured cell (or a whole workload); an error is recorded (results "errors") and
        the run goes on with the next one instead of losing the rest."""
        try:
            return run()
        except Exception as e:
            traceback.print_exc()
            self.results["errors"].append({kind: label, "error": repr(e)})
            self.save()
            return None

    @staticmethod
    def median_run(runs, key):
        """A copy of the run with the median `key`: its timeline is the one charted."""
        return dict(sorted(runs, key=key)[len(runs) // 2])

    # -- one drain --------------------------------------------------------------------------
    def drain(self, system, workers, rtt, dataset, n, label, window=None, rss=False, tail=False, topics=None,
              analyze=True, partitions=common.PARTITIONS):
        """Loads n events of `dataset` as one committed backlog (the relay is running and idle)
        and lets `system` drain it, all of it, or for at most `window` seconds when a full drain
        may not fit the time budget (the rate is then over what was published in the window,
        and the verification covers the published rows). Rate = published / (last published_at
        - commit of the load). tail: read the topic while the relay runs (more data than the mock
        cluster keeps per partition; costs the relay some CPU). topics: names the events are
        spread over (load), one topic per name and run; else one topic. analyze: ANALYZE in the
        load's transaction (the burst workloads load without)."""
        db = self.db
        seen_drained = None
        if system in PREVIEW_SYSTEMS:
            return self.preview_drain(workers, rtt, dataset, n, label, topics, partitions, system)
        self.prepare(system, workers, rtt)
        if topics:
            topic = [self.mock.new_topic(f"{label}-{t}", partitions) for t in topics]
        else:
            topic = self.mock.new_topic(label, partitions)
        res = {"system": system, "workers": workers, "rtt_ms": rtt, "dataset": dataset, "events": n,
               "partitions": partitions, "brokers": self.mock.brokers,
               "window_s": window, "tailing_reader": tail, "topics": len(topics or [topic]), "analyze": analyze}
        analyzed = self.analyze_count()
        if system == "tuned":
            res["claim_index"] = "the bench's" if self.tuned_index else "the relay's"
        reader = common.TopicReader(self.mock.bootstrap, topic) if tail else None
        if reader:
            reader.start()
        timeout = max(300, n / 200)
        if system.startswith("outbox"):
            base = db.published_by_workers()
            sampler = RssSampler(db.worker_pids()) if rss else None
            if sampler:
                sampler.start()
            t0 = load(db, dataset, n, topic, analyze)
            if window:
                while time.time() < t0 + window and db.published_by_workers() - base < n:
                    time.sleep(0.05)
                if sampler:
                    res["memory"] = sampler.stop()
                db.configure(0)  # fast shutdown: each worker finishes and records its batch
            else:
                wait_drained(lambda: db.published_by_workers() - base, n, timeout, label)
                seen_drained = time.time()
                if sampler:
                    res["memory"] = sampler.stop()
            if sampler:
                res["memory_timeline"] = [(t, m.get("VmRSS"), m.get("RssAnon"), m.get("RssShmem"))
                                          for t, _, m in sampler.samples]
            res["statements"] = db.relay_statement_times()
        elif system in FLOOR_SYSTEMS:
            return self.floor_drain(res, FLOOR_SYSTEMS[system], dataset, n, topic, label)
        elif system.startswith("floor"):
            # The relay's own batch settings (outbox.batch_size, outbox.batch_max_bytes).
            batch_size, max_bytes = (int(x) for x in db.sql(
                "SELECT (SELECT setting FROM pg_settings WHERE name = 'outbox.batch_size'), "
                "(SELECT setting FROM pg_settings WHERE name = 'outbox.batch_max_bytes')")[0])
            t0 = load(db, dataset, n, topic, analyze)
            errors = []

            def one(i):
                try:
                    with db.connect() as c:
                        c.execute("SET application_name = 'bench sql floor'")
                        c.execute("CALL bench.sql_floor(%s, %s, %s, %s)", (workers, i, batch_size, max_bytes))
                except psycopg.errors.QueryCanceled:
                    pass  # end of the window; claim and record commit separately, nothing half-done
                except Exception as e:  # reported below
                    errors.append(repr(e))
            threads = [threading.Thread(target=one, args=(i,)) for i in range(workers)]
            for t in threads:
                t.start()
            if window:
                while time.time() < t0 + window and any(t.is_alive() for t in threads):
                    time.sleep(0.05)
                db.sql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'bench sql floor'")
            for t in threads:
                t.join()
            if errors:
                raise RuntimeError(errors[0])
            res["statements"] = db.relay_statement_times()
        else:
            relays = ExternalRelays(system, workers, db.dsn, self.mock.bootstrap)
            try:
                relays.wait_ready()  # connected and idle-polling, as in production
                t0 = load(db, dataset, n, topic, analyze)
                if window:
                    while time.time() < t0 + window and relays.published() < n:
                        time.sleep(0.05)
                else:
                    wait_drained(relays.published, n, timeout, label)
                    seen_drained = time.time()
            finally:
                relays.stop()  # each finishes its tick (transaction) first
            acked = relays.last_ack()
        published = db.value("SELECT count(*) FROM outbox.events WHERE status = 'published'")
        # The end: the last batch's acks (the outbox relay's published_at; the baselines report
        # it, the tuned one writes now(), its transaction's start, into published_at).
        t_end = acked if system in ("batched", "tuned") and acked else last_published_epoch(db)
        res["analyzed_during_run"] = self.analyze_count() - analyzed
        res["published"] = published
        res["seconds"] = round(t_end - t0, 3)
        res["rate"] = round(published / (t_end - t0), 1)
        if seen_drained:
            # The same drain timed from outside the relay: when the harness, polling every 50 ms,
            # saw the relay's published count reach n (after the record commit).
            res["seconds_observed"] = round(seen_drained - t0, 3)
            res["rate_observed"] = round(n / (seen_drained - t0), 1)
        if system.startswith("floor"):
            res["verify"] = None  # nothing is sent
        else:
            res["verify"] = verify(db, self.mock, topic, only_published=bool(window), reader=reader)
        self.log_drain(label, res, window)
        return res

    def log_drain(self, label, res, window=None):
        v = res["verify"] or {}
        published = res["published"]
        log(f"  {label}: {res['rate']:.0f} events/s ({published} in {res['seconds']:.1f} s"
            + (f", window {window} s" if window else "") + ")"
            + (f"; lost {v['lost'] + v['unpublished_rows']}, dup {v['duplicates']}, "
               f"order-violating keys {v['order_violation_keys']}" if v else "")
            + (f"; claim {res['statements']['claim']['mean_ms']} ms, record {res['statements']['record']['mean_ms']} ms"
               if "statements" in res else "")
            + (f"; ANALYZEd {res['analyzed_during_run']} time(s) during the run" if res.get("analyzed_during_run") else ""))

    def analyze_count(self):
        """ANALYZEs of outbox.events so far (manual and autovacuum's)."""
        return int(self.db.value("SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables "
                                 "WHERE relid = 'outbox.events'::regclass"))

    def skip(self, workload, system, reason):
        """A cell that cannot run here: the reason printed once and kept (results "skipped")."""
        if system not in self.results["skipped"].setdefault(workload, {}):
            log(f"  {workload} {system} skipped: {reason}")
        self.results["skipped"][workload][system] = reason
        self.save()

    def preview_drain(self, workers, rtt, dataset, n, label, topics, partitions, system="outbox_040"):
        """drain() for the 0.4.0 preview: a database of its own (common.preview_database) with the
        data set copied in, the 0.3.0 relay of "postgres" paused, the preview's relay running and
        idle at the same settings; the same load (one transaction, no ANALYZE, autovacuum off for
        the schema's tables), drained at once. Published = named by outbox.landed (the contract's
        definition); rate = n / (the last landed row's published_at - commit of the load); the
        delivery is read back from Kafka (read_committed) and checked against the preview's
        outbox.events view (lost, duplicates, per-key order, unpublished rows) and the landed ids
        (each once). Per run also the batches the workers recorded (outbox.worker_metrics) and the
        time per batch; outbox_040_eos (outbox.delivery = exactly_once) also its transactional ids,
        the progress group's committed offsets as Kafka reports them, and the prepared batches
        left (none)."""
        db = self.db
        if self.preview_reason:
            raise common.Skipped(self.preview_reason)
        outbox = dict(PREVIEW_SYSTEMS[system])
        exactly_once = outbox["delivery"] == "exactly_once"
        if exactly_once:
            reason = common.exactly_once_available(db, workers)
            if reason:
                raise common.Skipped(reason)
        self.mock.set_rtt(rtt)
        db.reset_outbox()
        self.seed_index_on(False)
        self.tuned_index_on(False)
        bootstrap = self.mock.bootstrap
        progress_topic = None
        if exactly_once:
            # librdkafka 2.0.2's mock cluster and the exactly_once relay (README "exactly_once on
            # the mock cluster"): the mock serves no CreateTopics, so the progress topic is made
            # here, one partition, as an operator would; the relay finds it and makes nothing.
            # (The server-wide setting also puts the paused 0.3.0 relay of "postgres" in
            # exactly_once: it recovers the same way and stays idle.)
            progress_topic = db.value("SELECT setting FROM pg_settings WHERE name = 'outbox.progress_topic'")
            self.mock.ensure_topic(progress_topic, 1)
        # exactly_once: track_commit_timestamp on, so that the drain ends at the last batch's COMMIT
        # PREPARED (after its Kafka commit), not at its record statement, which runs before both.
        db.configure(workers, bootstrap, {"jit": "on", "track_commit_timestamp": "on" if exactly_once else "off"},
                     **outbox)
        connections = int(db.value("SELECT setting FROM pg_settings WHERE name = 'outbox.kafka_connections'"))
        delivery = db.value("SELECT setting FROM pg_settings WHERE name = 'outbox.delivery'")
        pdb = common.Database(db, common.PREVIEW_DB)
        try:
            common.relay_paused(db, True)  # the 0.3.0 relay of "postgres": nothing to do, but off
            common.preview_database(db)
            common.copy_table(db, dataset, common.PREVIEW_DB)
            tables = [t for (t,) in pdb.sql("SELECT quote_ident(schemaname) || '.' || quote_ident(relname) "
                                            "FROM pg_stat_user_tables WHERE schemaname = 'outbox'")]
            for t in tables:
                pdb.sql(f"ALTER TABLE {t} SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)")
            common.preview_relay_ready(db, workers)
            topic = [self.mock.new_topic(f"{label}-{t}", partitions) for t in topics]
            res = {"system": system, "kafka_connections": connections, "delivery": delivery,
                   "progress_topic": progress_topic,
                   "workers": workers, "rtt_ms": rtt, "dataset": dataset, "events": n,
                   "partitions": partitions, "brokers": self.mock.brokers, "window_s": None, "tailing_reader": False,
                   "topics": len(topics), "analyze": False, "database": common.PREVIEW_DB,
                   "extversion": pdb.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'")}
            analyzed = "SELECT coalesce(sum(analyze_count + autoanalyze_count), 0) FROM pg_stat_user_tables " \
                       "WHERE schemaname = 'outbox'"
            analyzed_before = int(pdb.value(analyzed))
            db.sql("SELECT pg_stat_statements_reset()")
            t0 = load(pdb, dataset, n, topic, analyze=False)
            timeout = max(300, n / 200)
            with pdb.connect() as mon:
                deadline = time.monotonic() + timeout
                while True:
                    done = int(mon.execute("SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox.landed").fetchone()[0])
                    if done >= n:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{label}: {done} of {n} named by outbox.landed after {timeout:.0f} s; "
                                           f"outbox.workers: {common.preview_workers(db)}")
                    time.sleep(0.05)
            seen_drained = time.time()
            res["statements_profile"] = common.statement_profile(db, common.PREVIEW_DB)
            res["worker_metrics"] = [dict(zip(("worker", "state", "published", "last_error"), r[:1] + r[2:]))
                                     for r in common.preview_workers(db)]
            res.update(common.preview_phases(db))
            landed_ids, distinct_ids, t_end = common.preview_landed(db)
            if exactly_once:
                # The last landed row's published_at is its record statement's time, in the batch's
                # prepared transaction, before the Kafka commit; the batch is visible to
                # read_committed consumers only after it: the end is the last COMMIT PREPARED.
                res["seconds_to_last_record"] = round(t_end - t0, 3)
                t_end = float(pdb.value("SELECT extract(epoch FROM max(pg_xact_commit_timestamp(xmin))) "
                                        "FROM outbox.landed"))
            res.update({"published": distinct_ids, "landed_ids": landed_ids, "landed_distinct_ids": distinct_ids,
                        "landed_rows": int(pdb.value("SELECT count(*) FROM outbox.landed")),
                        "analyzed_during_run": int(pdb.value(analyzed)) - analyzed_before,
                        "seconds": round(t_end - t0, 3), "rate": round(n / (t_end - t0), 1),
                        "seconds_observed": round(seen_drained - t0, 3),
                        "rate_observed": round(n / (seen_drained - t0), 1)})
            if landed_ids != distinct_ids or distinct_ids != n:
                raise RuntimeError(f"{label}: outbox.landed names {landed_ids} ids, {distinct_ids} distinct, "
                                   f"for {n} events")
            # Per batch: the drain's time over the batches the workers recorded (each worker's
            # batches are one after another: with w workers, w batches share the time).
            if res["batches"]:
                res["events_per_batch"] = round(res["batch_events"] / res["batches"], 1)
                res["ms_per_batch"] = round(1000 * res["seconds"] * workers / res["batches"], 2)
                res["ms_per_batch_observed"] = round(1000 * res["seconds_observed"] * workers / res["batches"], 2)
                res["phase_ms_per_batch"] = {k: round(1000 * v["seconds"] / v["count"], 2) if v["count"] else None
                                             for k, v in res["phases"].items()}
            if exactly_once:
                res["prepared_left"] = common.prepared_batches_left(db)
                res["transactional_ids"] = common.transactional_ids(db, workers)
                res["progress_offsets"] = common.progress_offsets(self.mock.bootstrap, res["transactional_ids"],
                                                                  progress_topic)
                if res["prepared_left"]:
                    raise RuntimeError(f"{label}: {res['prepared_left']} prepared batches left after the drain: "
                                       f"{db.sql('SELECT gid, prepared FROM pg_prepared_xacts')}")
            res["verify"] = verify(pdb, self.mock, topic)
        finally:
            db.sql(f'DROP DATABASE IF EXISTS "{common.PREVIEW_DB}" WITH (FORCE)')
            common.relay_paused(db, False)
        self.log_drain(label, res)
        prof = res["statements_profile"][:3]
        log("    preview SQL by total time: " + "; ".join(f"{p['calls']} x {p['mean_ms']} ms: {p['query'][:70]}"
                                                          for p in prof))
        log("    preview worker phases: " + ", ".join(f"{k} {v['count']} x {1000 * v['seconds'] / max(v['count'], 1):.0f} ms"
                                                     for k, v in res["phases"].items())
            + f"; {len(res['record_statements'])} record statements over "
              f"{res['record_statements'][-1][0] if res['record_statements'] else 0:.0f} ms"
            + (f"; {res['batches']} batches of {res['events_per_batch']} events, {res['ms_per_batch']} ms per batch"
               if res.get("batches") else ""))
        if exactly_once:
            log(f"    exactly_once: delivery {res['delivery']}, prepared batches left {res['prepared_left']}, "
                f"progress group offsets on {progress_topic}: {res['progress_offsets']}, "
                f"read back {res['verify']['isolation_level']}")
        return res

    def floor_drain(self, res, mode, dataset, n, topics, label):
        """A design-independent SQL floor (sql_floor.py): the same events loaded into
        bench.floor_events in one transaction (no ANALYZE: the table is new, autovacuum off for
        it), drained by `workers` sessions of bench.floor_claim. Rate = events / (the wall clock
        when the last session returned - the load's commit)."""
        db = self.db
        topics = [topics] if isinstance(topics, str) else topics
        with db.connect() as c:
            c.execute(sql_floor.FLOOR_TABLE_SQL)
        with db.connect(autocommit=False) as c:
            c.execute(sql_floor.floor_load_sql(dataset), {"topics": topics, "n_topics": len(topics), "n": n})
            c.commit()
            t0 = time.time()
        errors = []

        def one():
            try:
                with db.connect() as c:
                    c.execute("SET jit = off")  # as the tuned baseline does
                    c.execute("CALL bench.floor_claim(%s, %s)", (mode, 5000))
            except Exception as e:  # reported below
                errors.append(repr(e))
        threads = [threading.Thread(target=one) for _ in range(res["workers"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_end = time.time()
        if errors:
            raise RuntimeError(errors[0])
        left = db.value("SELECT count(*) FROM bench.floor_events WHERE status IN ('pending', 'in_flight')")
        if left:
            raise RuntimeError(f"{label}: {left} rows left unclaimed")
        res.update({"published": n, "seconds": round(t_end - t0, 3), "rate": round(n / (t_end - t0), 1),
                    "verify": None, "floor_mode": mode, "analyzed_during_run": 0})
        db.sql("DROP TABLE bench.floor_events")
        self.log_drain(label, res)
        return res

    # -- workloads ------------------------------------------------------------------------------
    def w_burst_4topic(self):
        return self.burst_drain("burst_4topic")

    def w_burst_1topic(self):
        return self.burst_drain("burst_1topic")

    def w_burst_4topic_3x6(self):
        return self.burst_drain("burst_4topic_3x6")

    def w_burst_4topic_1broker(self):
        """burst_4topic on a mock cluster of one broker of its own (for the workload only)."""
        main = self.mock
        self.mock = Mock(brokers=BURST_BROKERS["burst_4topic_1broker"])
        try:
            return self.burst_drain("burst_4topic_1broker")
        finally:
            self.results.setdefault("mock_sockets_other", {})["burst_4topic_1broker"] = self.mock.sockets()
            self.mock.close()
            self.mock = main

    def burst_drain(self, name):
        """A burst of burst_drain_events events over burst_drain_keys keys committed in ONE
        transaction with every relay running and idle, drained at once, WITHOUT ANALYZE: the load
        does not analyze, the column statistics earlier workloads left are deleted, and autovacuum
        is off for outbox.events for the whole workload (each run records how often the table was
        analyzed anyway: analyzed_during_run). Each key's events are spread over the workload's
        topics. Every relay and floor at every RTT and worker count, --runs runs of each (the runs
        interleaved, so that a noisy spell does not hit one cell's runs only)."""
        s = self.sizes
        db = self.db
        topics = BURST_TOPICS[name]
        partitions, dataset, _ = BURST_SHAPES.get(name, (common.PARTITIONS, "ds_burst", s["burst_drain_keys"]))
        out = []
        cells = []
        # The other shapes of burst_4topic may run fewer systems (--shape-systems).
        chosen = (self.args.shape_systems if name != "burst_4topic" else None) or self.args.burst_systems
        for r in range(self.runs):
            for rt in s["burst_drain_rtts_ms"]:
                for w in s["burst_drain_workers"]:
                    for system in BURST_SYSTEMS:
                        if chosen and system not in chosen.split(","):
                            continue
                        if system in FLOOR_SYSTEMS and rt != s["burst_drain_rtts_ms"][0]:
                            continue  # the floors send nothing: RTT is moot
                        cells.append((r, system, w, 0 if system in FLOOR_SYSTEMS else rt))
        if any(c[1] in PREVIEW_SYSTEMS for c in cells) and self.preview_reason is None:
            self.preview_reason = common.preview_available(db) or ""
        db.sql("ALTER TABLE outbox.events SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)")
        try:
            for r, system, w, rt in cells:
                if system in self.results["skipped"].get(name, {}):
                    continue
                label = f"{name.replace('_', '-')}-{system.replace('_', '-')}-w{w}-rtt{rt}-r{r}"
                # Statistics an earlier workload's ANALYZE left (TRUNCATE keeps them).
                db.sql("DELETE FROM pg_statistic WHERE starelid = 'outbox.events'::regclass")

                def one():
                    try:
                        return self.drain(system, w, rt, dataset, s["burst_drain_events"], label,
                                          topics=topics, analyze=False, partitions=partitions)
                    except common.Skipped as e:
                        self.skip(name, system, str(e))
                        return None
                res = self.cell(label, one)
                if res is None:
                    continue
                res["run"] = r
                out.append(res)
                self.results["workloads"][name] = out
                self.save()
        finally:
            db.sql("ALTER TABLE outbox.events RESET (autovacuum_enabled, toast.autovacuum_enabled)")
        return out

    def w_drain(self):
        """Backlog drain over many keys: every relay at 1, 2 and 4 workers, RTT 0 and 5 ms. The
        cells behind a target (one worker, RTT 5 ms) get --runs runs, the others one."""
        s = self.sizes
        rtt = s["rtt_ms"]
        out = []
        cells = []
        for r in range(self.runs):
            for system in ("outbox", "batched", "seed", "floor", "outbox_jit_off"):
                cells.append((r, system, 1, rtt))
        for system in ("outbox", "batched", "seed", "floor"):
            for w in s["drain_workers"]:
                for rt in s["drain_rtts_ms"]:
                    if (w, rt) == (1, rtt) or (system == "floor" and rt != rtt):
                        continue  # done above; the floor sends nothing, RTT is moot
                    cells.append((0, system, w, rt))
        if not self.db.relay_floor:
            cells = [c for c in cells if c[1] != "floor"]
        for r, system, w, rt in cells:
            label = f"drain-{system.replace('_', '-')}-w{w}-rtt{rt}-r{r}"
            window = s["baseline_window_s"] if system == "seed" else None
            res = self.cell(label, lambda: self.drain(system, w, rt, "ds_many", s["drain_events"], label,
                                                      window=window, rss=system.startswith("outbox")))
            if res is None:
                continue
            res["run"] = r
            out.append(res)
            self.results["workloads"]["drain"] = out
            self.save()
        return out

    def w_hot_keys(self):
        """The same number of events over 10 keys, one worker, RTT 5 ms. Every relay drains the
        whole backlog (the seed-style relay: baseline_window_s of it), with the topic read while
        it runs: 10 keys put up to a fifth of the events on one partition, near the 5 MiB the
        mock cluster keeps per partition."""
        s = self.sizes
        rtt = s["rtt_ms"]
        out = []
        cells = [(r, "outbox") for r in range(self.runs)]
        cells += [(0, "batched"), (0, "seed"), (0, "floor"), (0, "outbox_jit_off")]
        if not self.db.relay_floor:
            cells = [c for c in cells if c[1] != "floor"]
        for r, system in cells:
            label = f"hot-{system.replace('_', '-')}-w1-rtt{rtt}-r{r}"
            window = s["baseline_window_s"] if system == "seed" else None
            res = self.cell(label, lambda: self.drain(system, 1, rtt, "ds_hot", s["drain_events"], label,
                                                      window=window, tail=not system.startswith("floor")))
            if res is None:
                continue
            res["run"] = r
            out.append(res)
            self.results["workloads"]["hot_keys"] = out
            self.save()
        return out

    def start_system(self, system, workers=1):
        if system == "outbox":
            return None
        relays = ExternalRelays(system, workers, self.db.dsn, self.mock.bootstrap)
        relays.wait_ready()
        return relays

    def published_counter(self, system, relays):
        if system == "outbox":
            base = self.db.published_by_workers()
            return lambda: self.db.published_by_workers() - base
        return relays.published

    def w_burst(self):
        """Monthly renewal burst: events enqueued at a steady rate while the relay runs, two per
        transaction (invoice.created and invoice.paid of one subscription). An event's delay is
        published_at - the wall clock when its transaction's COMMIT returned (as in idle_latency)."""
        s = self.sizes
        rtt = s["rtt_ms"]
        out = []
        for system in ("outbox", "batched", "seed"):
            self.prepare(system, 1, rtt)
            topic = self.mock.new_topic(f"burst-{system}")
            relays = self.start_system(system)
            try:
                published = self.published_counter(system, relays)
                n_tx = s["burst_events"] // 2
                interval = s["burst_seconds"] / n_tx
                backlog = []
                committed = []  # wall clock when transaction j's COMMIT returned
                with self.db.connect(autocommit=False) as c:
                    start = time.monotonic()
                    t_first = time.time()
                    next_sample = 0.0
                    for j in range(n_tx):
                        target = start + j * interval
                        delay = target - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        key = f"sub-{j:06d}"
                        c.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)",
                                  (topic, key, f'{{"event": "invoice.created", "subscription_id": "{key}", '
                                               f'"amount_cents": {1000 + j % 9000}, "currency": "EUR"}}'))
                        c.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)",
                                  (topic, key, f'{{"event": "invoice.paid", "subscription_id": "{key}", '
                                               f'"amount_cents": {1000 + j % 9000}, "currency": "EUR"}}'))
                        c.commit()
                        committed.append(time.time())
                        el = time.monotonic() - start
                        if el >= next_sample:
                            backlog.append((round(el, 2), 2 * (j + 1) - published()))
                            next_sample += 0.5
                    t_last_commit = time.time()
                    enqueue_seconds = time.monotonic() - start
                n = 2 * n_tx
                while published() < n:
                    el = time.monotonic() - start
                    if el >= next_sample:
                        backlog.append((round(el, 2), n - published()))
                        next_sample += 0.5
                    if el > enqueue_seconds + 900:
                        raise TimeoutError(f"burst {system}: {published()} of {n} published")
                    time.sleep(0.05)
                backlog.append((round(time.monotonic() - start, 2), 0))
            finally:
                if relays:
                    relays.stop()
            delays = sorted(float(x) for (x,) in self.db.sql(
                "SELECT extract(epoch FROM e.published_at - to_timestamp(t.returned)) * 1000 FROM outbox.events e "
                "JOIN unnest(%s::text[], %s::float8[]) AS t(key, returned) USING (key)",
                ([f"sub-{j:06d}" for j in range(len(committed))], committed)))
            if len(delays) != 2 * len(committed):
                raise RuntimeError(f"burst {system}: {len(delays)} delays for {2 * len(committed)} events")
            t_end = last_published_epoch(self.db)
            res = {"system": system, "workers": 1, "rtt_ms": rtt, "events": n,
                   "enqueue_seconds": round(enqueue_seconds, 2), "offered_rate": round(n / enqueue_seconds, 1),
                   "time_to_empty_s": round(t_end - t_last_commit, 3),
                   "total_seconds": round(t_end - t_first, 2),
                   "worst_delay_ms": round(delays[-1], 1), "p50_delay_ms": round(percentile(delays, 50), 1),
                   "p99_delay_ms": round(percentile(delays, 99), 1),
                   "peak_backlog": max(b for _, b in backlog), "backlog_timeline": backlog,
                   "verify": verify(self.db, self.mock, topic)}
            v = res["verify"]
            log(f"  burst {system}: {n} events offered at {res['offered_rate']}/s over {res['enqueue_seconds']} s; "
                f"empty {res['time_to_empty_s']} s after the last commit; worst delay {res['worst_delay_ms']} ms, "
                f"peak backlog {res['peak_backlog']}; lost {v['lost']}, dup {v['duplicates']}, "
                f"order-violating keys {v['order_violation_keys']}")
            out.append(res)
            self.results["workloads"]["burst"] = out
            self.save()
        return out

    def w_idle_latency(self):
        """One event every 20 ms on an otherwise idle queue. Latency = published_at - the commit
        time recorded by the test: the wall clock when the enqueue's autocommit statement returned,
        i.e. after its commit record was flushed and the event became visible (the same clock as
        the server's: one machine). published_at is the time the relay had the broker's ack
        (outbox: start of the record transaction that follows the batch's last delivery report;
        baselines: clock_timestamp() in their UPDATE after flush). Diagnostic: the same from the
        commit record's own timestamp (pg_xact_commit_timestamp, track_commit_timestamp on),
        which is taken before the commit's WAL flush and so includes it."""
        s = self.sizes
        rtt = s["rtt_ms"]
        out = []
        cells = [(r, "outbox") for r in range(self.runs)] + [(0, "batched"), (0, "seed")]
        for r, system in cells:
            seconds = s["latency_seconds"] if system == "outbox" else s["latency_baseline_seconds"]
            self.prepare(system, 1, rtt, commit_timestamps=True)
            topic = self.mock.new_topic(f"latency-{system}-r{r}")
            commits = []  # (event_id, xid of the enqueuing transaction, wall clock when it returned)
            relays = self.start_system(system)
            try:
                with self.db.connect() as c:
                    # Warm-up: topic metadata and connections; excluded from the figures.
                    for i in range(5):
                        c.execute("SELECT outbox.enqueue(%s, 'warm-up', '{}'::jsonb)", (topic,))
                    common.wait_until(lambda: self.db.value(
                        "SELECT count(*) FROM outbox.events WHERE status = 'published'") == 5, 30, "warm-up")
                    n = int(seconds * 1000 / s["latency_interval_ms"])
                    interval = s["latency_interval_ms"] / 1000.0
                    stmt_ms = []
                    start = time.monotonic()
                    for i in range(n):
                        delay = start + i * interval - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        t = time.monotonic()
                        row = c.execute(
                            "SELECT outbox.enqueue(%s, %s, %s::jsonb)::text, pg_current_xact_id()::text",
                            (topic, f"acct-{i % 50}", f'{{"event": "payment.failed", "seq": {i}}}')).fetchone()
                        commits.append((row[0], row[1], time.time()))
                        stmt_ms.append((time.monotonic() - t) * 1000)
                common.wait_until(lambda: self.db.value(
                    "SELECT count(*) FROM outbox.events WHERE status <> 'published'") == 0, 120, "latency drained")
            finally:
                if relays:
                    relays.stop()
            self.db.sql("DROP TABLE IF EXISTS bench.commits")
            self.db.sql("CREATE TABLE bench.commits AS SELECT x.event_id::uuid, to_timestamp(x.returned) AS committed_at, "
                        "pg_xact_commit_timestamp(x.xid::xid8::xid) AS commit_record_at "
                        "FROM unnest(%s::text[], %s::text[], %s::float8[]) AS x(event_id, xid, returned)",
                        ([e for e, _, _ in commits], [x for _, x, _ in commits], [t for _, _, t in commits]))
            timed = ("FROM outbox.events e JOIN bench.commits t USING (event_id)")
            lat = sorted(float(x) for (x,) in self.db.sql(
                f"SELECT extract(epoch FROM e.published_at - t.committed_at) * 1000 {timed}"))
            if len(lat) != len(commits):
                raise RuntimeError(f"latency: {len(lat)} of {len(commits)} events have a commit time and a row")
            from_commit_record = sorted(float(x) for (x,) in self.db.sql(
                f"SELECT extract(epoch FROM e.published_at - t.commit_record_at) * 1000 {timed}"))
            # Where the time goes (outbox only: the baselines set no claimed_at): commit -> the
            # claim transaction's start (wake-up), and claim start -> ack (claim, produce, RTT).
            parts = self.db.sql(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - committed_at)), "
                "percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - claimed_at)), "
                f"avg(n) {timed} JOIN (SELECT claimed_at c, count(*) n FROM outbox.events "
                "GROUP BY claimed_at) b ON b.c = e.claimed_at")[0]
            breakdown = None
            if parts[0] is not None:
                breakdown = {"commit_to_claim_p50_ms": round(parts[0] * 1000, 2),
                             "claim_to_ack_p50_ms": round(parts[1] * 1000, 2),
                             "mean_batch_size": round(float(parts[2]), 2)}
            res = {"system": system, "run": r, "workers": 1, "rtt_ms": rtt, "events": len(lat), "breakdown": breakdown,
                   "seconds": seconds,
                   "p50_ms": round(percentile(lat, 50), 2), "p90_ms": round(percentile(lat, 90), 2),
                   "p99_ms": round(percentile(lat, 99), 2), "max_ms": round(lat[-1], 2),
                   "mean_ms": round(sum(lat) / len(lat), 2),
                   "enqueue_statement_p50_ms": round(percentile(sorted(stmt_ms), 50), 3),
                   "from_commit_record_p50_ms": round(percentile(from_commit_record, 50), 2),
                   "from_commit_record_p99_ms": round(percentile(from_commit_record, 99), 2),
                   "latencies_ms": [round(x, 2) for x in lat],
                   "verify": verify(self.db, self.mock, topic)}
            v = res["verify"]
            log(f"  idle latency {system} run {r}: p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms, "
                f"max {res['max_ms']} ms over {len(lat)} events"
                + (f" (p50 commit->claim {breakdown['commit_to_claim_p50_ms']} ms, claim->ack "
                   f"{breakdown['claim_to_ack_p50_ms']} ms)" if breakdown else "")
                + f"; lost {v['lost']}, dup {v['duplicates']}, "
                f"order-violating keys {v['order_violation_keys']}")
            out.append(res)
            self.results["workloads"]["idle_latency"] = out
            self.save()
        return out

    def w_wal_cost(self):
        """WAL, index writes, dead tuples and vacuum per event: outbox against the Debezium outbox
        pattern and a plain INSERT (bench/wal_cost.py)."""
        self.results["workloads"]["wal_cost"] = wal_cost.run(self)
        self.save()

    def w_enqueue_overhead(self):
        """pgbench: a business INSERT plus outbox.enqueue() per transaction, against the same
        business INSERT plus a plain INSERT of the same bytes into an ordinary table. The relay is
        off (workers = 0) so that only the write path is compared.

        The variants run interleaved: one pgbench run per database and client count with every
        variant's script at equal weight, each client picking a script at random per transaction,
        and the overhead is the ratio of the scripts' average latencies in that run. Runs of one
        variant after another (minutes apart) moved a variant's tps by 20-70 points between runs
        on a shared machine; interleaved, every variant meets the same spell of noise, the same
        checkpoint and the same WAL flushes, and the per-run overheads agree within a few points.
        What it cannot show: a variant's cost that depends on the other transactions being of its
        own kind (the commit-order work of keyed enqueues meeting each other); the rows written by
        hand (shape, shape_040) take enqueue's time-ordered ids (common.UUID_V7_SQL)."""
        s = self.sizes
        db = self.db
        self.prepare("floor", 0, s["rtt_ms"])  # relay off
        db.sql("DROP TABLE IF EXISTS bench.invoices, bench.plain_events, bench.events_shape")
        tables_sql = ("CREATE TABLE bench.invoices (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                      "subscription_id bigint NOT NULL, amount_cents int NOT NULL, status text NOT NULL, "
                      "paid_at timestamptz NOT NULL DEFAULT now())",
                      "CREATE TABLE bench.plain_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                      "topic text NOT NULL, key text, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())")
        for q in tables_sql:
            db.sql(q)
        # Diagnostic: a plain INSERT into a table of outbox.events' shape (columns, constraints,
        # all four indexes), to tell the cost of the table from the cost of the function.
        db.sql("CREATE TABLE bench.events_shape (LIKE outbox.events INCLUDING ALL)")
        business = ("INSERT INTO bench.invoices (subscription_id, amount_cents, status) "
                    "VALUES (:sub, :amount, 'paid');")
        payload = ("'{\"event\": \"invoice.paid\", \"invoice_id\": \"inv-' || :sub || '\", "
                   "\"subscription_id\": \"sub-' || :sub || '\", \"amount_cents\": ' || :amount || ', "
                   "\"currency\": \"EUR\", \"period\": \"2026-11\"}'")
        scripts = {
            "outbox": f"SELECT outbox.enqueue('billing', 'sub-' || :sub, ({payload})::jsonb);",
            "plain": f"INSERT INTO bench.plain_events (topic, key, payload) VALUES "
                     f"('billing', 'sub-' || :sub, ({payload})::jsonb);",
            "shape": f"INSERT INTO bench.events_shape (event_id, topic, key, lane, payload) VALUES "
                     f"({common.UUID_V7_SQL}, 'billing', 'sub-' || :sub, outbox.lane_of('sub-' || :sub, NULL), convert_to((({payload})::jsonb)::text, 'UTF8'));",
        }
        tmp = Path(tempfile.mkdtemp(prefix="outbox-pgbench-"))
        files = {}
        for name, second in scripts.items():
            p = tmp / f"{name}.sql"
            p.write_text("\\set sub random(1, 100000)\n\\set amount random(100, 100000)\n"
                         f"BEGIN;\n{business}\n{second}\nEND;\n")
            files[name] = p
        # The 0.4.0 preview (common.PREVIEW): outbox_040 = the same business INSERT + enqueue in a
        # database of its own with CREATE EXTENSION outbox VERSION '0.4.0', beside plain_040, the
        # same plain INSERT in that database; both on a new such database each run (the members'
        # TRUNCATE is the retention's only, so a run cannot empty them), relay off there too.
        for variant in ("outbox_040", "plain_040"):
            files[variant] = files[variant.split("_")[0]]
        # Diagnostic: the same row INSERTed straight into the preview's current ring member
        # (outbox.events_0 in a new database: its stamp trigger with the row rules, and two indexes), to tell
        # the cost of the member from the cost of the function.
        # (An id of enqueue's, caller_event_id false: the row enqueue writes, one index entry.)
        scripts["shape_040"] = (f"INSERT INTO outbox.events_0 (event_id, topic, key, lane, payload, caller_event_id) "
                                f"VALUES ({common.GENERATED_ID_SQL}, 'billing', 'sub-' || :sub, "
                                f"outbox.lane_of('sub-' || :sub, NULL), convert_to((({payload})::jsonb)::text, 'UTF8'), "
                                f"false);")
        files["shape_040"] = tmp / "shape_040.sql"
        files["shape_040"].write_text("\\set sub random(1, 100000)\n\\set amount random(100, 100000)\n"
                                      f"BEGIN;\n{business}\n{scripts['shape_040']}\nEND;\n")
        preview_reason = common.preview_available(db)
        if not preview_reason:
            try:
                self.enqueue_preview_database(tables_sql)
            except common.Skipped as e:
                preview_reason = str(e)
        if preview_reason:
            self.skip("enqueue_overhead", "outbox_040", preview_reason)
        env = dict(os.environ, PGOPTIONS="-c pg_stat_statements.track=none")
        groups = [("postgres", ["plain", "outbox", "shape"])]
        if not preview_reason:
            groups.append((common.PREVIEW_DB, ["plain_040", "outbox_040", "shape_040"]))
        out = []
        try:
            for r in range(self.runs):
                for clients in s["pgbench_clients"]:
                    # Each run starts with the other database, so that neither always runs first.
                    for dbname, variants in groups[r % len(groups):] + groups[:r % len(groups)]:
                        if dbname == common.PREVIEW_DB:
                            self.enqueue_preview_database(tables_sql)
                        else:
                            db.sql("TRUNCATE bench.invoices, bench.plain_events, bench.events_shape, outbox.events")
                        db.sql("CHECKPOINT")
                        cmd = ["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
                               "-T", str(s["pgbench_seconds"]), "-h", db.pg.tmp, "-p", str(db.pg.port),
                               "-U", "postgres"]
                        for variant in variants:
                            cmd += ["-f", f"{files[variant]}@1"]
                        p = subprocess.run(cmd + [dbname], capture_output=True, text=True, env=env)
                        if p.returncode != 0:
                            raise RuntimeError(f"pgbench failed: {p.stderr[-2000:]}")
                        for variant, script in zip(variants, pgbench_scripts(p.stdout, len(variants))):
                            out.append({"run": r, "clients": clients, "variant": variant, **script})
                            log(f"  pgbench {variant} clients={clients} run {r}: {script['transactions']} "
                                f"transactions, latency {script['latency_avg_ms']} ms")
                        self.results["workloads"]["enqueue_overhead"] = {"runs": out}
                        self.save()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            db.sql(f'DROP DATABASE IF EXISTS "{common.PREVIEW_DB}" WITH (FORCE)')
        summary = {}
        for clients in s["pgbench_clients"]:
            def latency(variant, run=None):
                xs = [x["latency_avg_ms"] for x in out if x["clients"] == clients and x["variant"] == variant
                      and (run is None or x["run"] == run)]
                return median(xs) if xs else None

            def overhead(variant, base):
                """Per run (both scripts of one pgbench run), and the median of those."""
                per_run = [round(100 * (latency(variant, r) / latency(base, r) - 1), 1) for r in range(self.runs)
                           if latency(variant, r) and latency(base, r)]
                return (median(per_run) if per_run else None), per_run

            row = {"runs": self.runs, "method": "interleaved"}
            for suffix, (plain, ob, shape) in (("", ("plain", "outbox", "shape")),
                                                ("_040", ("plain_040", "outbox_040", "shape_040"))):
                if suffix and preview_reason:
                    continue
                o, o_runs = overhead(ob, plain)
                sh, sh_runs = overhead(shape, plain)
                row.update({f"plain{suffix}_latency_ms": latency(plain), f"outbox{suffix}_latency_ms": latency(ob),
                            f"shape{suffix}_latency_ms": latency(shape),
                            f"overhead{suffix}_pct": o, f"overhead{suffix}_pct_per_run": o_runs,
                            f"shape{suffix}_overhead_pct": sh, f"shape{suffix}_overhead_pct_per_run": sh_runs})
            summary[str(clients)] = row
            log(f"  enqueue overhead, {clients} client(s): 0.3.0 {row['overhead_pct']}% "
                f"(per run {row['overhead_pct_per_run']})"
                + ("" if preview_reason else f"; {PREVIEW_LABEL} {row['overhead_040_pct']}% "
                   f"(per run {row['overhead_040_pct_per_run']})"))
        res = {"runs": out, "summary": summary}
        if preview_reason:
            res["skipped"] = {"outbox_040": preview_reason}
        res["scripts"] = {k: ("\\set sub random(1, 100000)\n\\set amount random(100, 100000)\n"
                              f"BEGIN;\n{business}\n{v}\nEND;\n") for k, v in scripts.items()}
        self.results["workloads"]["enqueue_overhead"] = res
        self.save()
        return res

    def enqueue_preview_database(self, tables_sql):
        """A new preview database (common.preview_database: relay off there) with the business
        table and the plain INSERT's table."""
        common.preview_database(self.db)
        pdb = common.Database(self.db, common.PREVIEW_DB)
        pdb.sql("CREATE SCHEMA bench")
        for q in tables_sql:
            pdb.sql(q)

    def w_memory(self):
        """Worker memory while draining a large backlog (one worker, RTT 5 ms), sampled every
        0.5 s over (at most) memory_window_s of the drain; --runs runs. The workload's record is
        the run with the median peak VmRSS (its timeline is the chart), plus every run's peaks."""
        s = self.sizes
        n = s["memory_events"]
        db = self.db
        base = db.value("SELECT count(*) FROM bench.ds_many")
        copies = -(-n // base)
        db.sql("DROP TABLE IF EXISTS bench.ds_big")
        db.sql("CREATE TABLE bench.ds_big AS SELECT g * %s + d.n AS n, gen_random_uuid() AS event_id, d.key, "
               "d.payload, d.headers FROM bench.ds_many d, generate_series(0, %s) g WHERE g * %s + d.n <= %s",
               (base, copies - 1, base, n))
        db.sql("CREATE UNIQUE INDEX ON bench.ds_big (n)")
        runs = []
        for r in range(self.runs):
            db.configure(0)  # so that the relay starts afresh below (VmHWM is per process)
            label = f"memory-outbox-w1-r{r}"
            res = self.cell(label, lambda: self.drain("outbox", 1, s["rtt_ms"], "ds_big", n, label,
                                                      window=s["memory_window_s"], rss=True, tail=True))
            if res is not None:
                res["run"] = r
                res["table_size_mb"] = round(db.value("SELECT pg_total_relation_size('outbox.events')") / 1048576, 1)
                runs.append(res)
            db.reset_outbox()
        db.sql("DROP TABLE bench.ds_big")
        if not runs:
            raise RuntimeError("memory: no run completed")
        res = self.median_run(runs, key=lambda x: x["memory"]["peak_vmrss_mb"])
        res["shared_buffers"] = db.value("SHOW shared_buffers")
        res["runs"] = [{"run": x["run"], "rate": x["rate"], "published": x["published"], "verify": x["verify"],
                        "system": x["system"],
                        **{k: x["memory"][k] for k in ("peak_vmrss_mb", "peak_private_mb", "peak_rss_anon_mb",
                                                       "peak_rss_file_mb", "peak_rss_shmem_mb")}}
                       for x in runs]
        self.results["workloads"]["memory"] = res
        self.save()
        m = res["memory"]
        log(f"  memory (the run with the median VmRSS of {len(runs)}): worker peak VmRSS {m['peak_vmrss_mb']} MB = (anon "
            f"{m['peak_rss_anon_mb']} MB + file {m['peak_rss_file_mb']} MB) + shared memory pages "
            f"{m['peak_rss_shmem_mb']} MB")
        return res

    def w_table_health(self):
        """Sustained load with retention on, --runs runs of each of --health-systems (default the
        0.4.0 preview, outbox_040): the workload's record is the first system's run with the
        median growth (its timeline is the chart), plus every run's figures and each system's
        median run (systems)."""
        systems = HEALTH_SYSTEMS_DEFAULT
        if self.args.health_systems:
            systems = [x.strip() for x in self.args.health_systems.split(",") if x.strip()]
        unknown = [x for x in systems if x not in HEALTH_SYSTEMS]
        if unknown or not systems:
            raise ValueError(f"--health-systems: {unknown or systems} (accepted: {', '.join(HEALTH_SYSTEMS)})")
        if "outbox_040" in systems and self.preview_reason is None:
            self.preview_reason = common.preview_available(self.db) or ""
        by_system = {}
        all_runs = []
        for system in systems:
            runs = []
            for r in range(self.runs):
                if system in self.results["skipped"].get("table_health", {}):
                    break

                def one():
                    try:
                        return self.table_health_run(r, system)
                    except common.Skipped as e:
                        self.skip("table_health", system, str(e))
                        return None
                res = self.cell(f"table-health-{system.replace('_', '-')}-r{r}", one)
                if res is not None:
                    runs.append(res)
            if runs:
                med = self.median_run(runs, key=lambda x: x["growth_last_vs_middle_pct"]
                                      if x["growth_last_vs_middle_pct"] is not None else 0)
                med["runs"] = [{k: v for k, v in x.items() if k != "samples"} for x in runs]
                by_system[system] = med
                all_runs += med["runs"]
        if not by_system:
            raise RuntimeError("table health: no run completed")
        res = dict(by_system[next(x for x in systems if x in by_system)])
        res["runs"] = all_runs
        res["systems"] = by_system
        self.results["workloads"]["table_health"] = res
        self.save()
        return res

    def table_health_run(self, r, system="outbox"):
        """Size of the extension's tables and their indexes (every table of schema outbox:
        0.3.0's events; 0.4.0's members, landed, event_state, ...) over time under a steady
        enqueue rate with retention on and autovacuum at its defaults. system outbox: 0.3.0 in
        "postgres"; outbox_040: the 0.4.0 preview (common.preview_database, a database of its
        own, with its relay of one worker; the 0.3.0 relay of "postgres" paused)."""
        s = self.sizes
        db = self.db
        self.prepare("outbox", 1, s["rtt_ms"], retention=s["health_retention"])
        target = db
        preview = system == "outbox_040"
        if preview:
            if self.preview_reason:
                raise common.Skipped(self.preview_reason)
        topic = self.mock.new_topic(f"health-{system.replace('_', '-')}-r{r}")
        rate = s["health_rate"]
        per_tx = max(10, rate // 100)  # at most 100 commits a second (each waits for its WAL flush)
        interval = per_tx / rate
        samples = []
        tables = "FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'r'"
        stats = "FROM pg_stat_user_tables WHERE schemaname = 'outbox'"
        # 0.4.0: how many of the ring's members hold rows (the retention TRUNCATEs sealed ones).
        members = ("(SELECT " + " + ".join(f"(EXISTS (SELECT FROM outbox.events_{m}))::int" for m in range(4))
                   + ")") if preview else "NULL::int"
        sizes_sql = (f"SELECT (SELECT sum(pg_relation_size(c.oid)) {tables}), "
                     f"(SELECT sum(pg_indexes_size(c.oid)) {tables}), "
                     f"(SELECT sum(pg_total_relation_size(c.oid)) {tables}), "
                     "(SELECT count(*) FROM outbox.events), "
                     "(SELECT count(*) FROM outbox.events WHERE status <> 'published'), "
                     f"(SELECT sum(n_dead_tup) {stats}), (SELECT sum(autovacuum_count) {stats}), "
                     f"(SELECT sum(vacuum_count) {stats}), "
                     "(SELECT string_agg(state || coalesce(' (' || last_error || ')', ''), ', ') FROM outbox.workers), "
                     f"{members}")
        per_table_sql = ("SELECT c.relname, pg_total_relation_size(c.oid), coalesce(st.n_live_tup, 0), "
                         "coalesce(st.n_dead_tup, 0), coalesce(st.autovacuum_count, 0) FROM pg_class c "
                         "LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid "
                         "WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'r' ORDER BY 1")
        enqueued = 0
        try:
            if preview:
                common.relay_paused(db, True)  # the 0.3.0 relay of "postgres": nothing to do, but off
                common.preview_database(db)  # autovacuum at its defaults there
                common.preview_relay_ready(db, 1)
                target = common.Database(db, common.PREVIEW_DB)
            with target.connect(autocommit=False) as c, target.connect() as mon:
                start = time.monotonic()
                next_sample = 0.0
                i = 0
                while time.monotonic() - start < s["health_seconds"]:
                    delay = start + i * interval - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    c.execute("SELECT count(outbox.enqueue(%s, 'sub-' || (g %% 1000), "
                              "('{\"event\": \"invoice.paid\", \"seq\": ' || g || '}')::jsonb)) "
                              "FROM generate_series(%s::bigint, %s::bigint) g", (topic, enqueued, enqueued + per_tx - 1))
                    c.commit()
                    enqueued += per_tx
                    i += 1
                    el = time.monotonic() - start
                    if el >= next_sample:
                        row = mon.execute(sizes_sql).fetchone()
                        per_table = {t: {"total_bytes": int(b), "live": int(lv), "dead": int(d), "autovacuums": int(a)}
                                     for t, b, lv, d, a in mon.execute(per_table_sql).fetchall()}
                        samples.append({"t": round(el, 1), "table_bytes": int(row[0]), "index_bytes": int(row[1]),
                                        "total_bytes": int(row[2]), "rows": row[3], "unpublished": row[4],
                                        "dead_tuples": int(row[5] or 0), "autovacuums": int(row[6] or 0),
                                        "vacuums": int(row[7] or 0), "enqueued": enqueued, "worker": row[8],
                                        "members_nonempty": row[9], "per_table": per_table})
                        next_sample += 5.0
            common.wait_until(lambda: target.value(
                "SELECT count(*) FROM outbox.events WHERE status <> 'published'") == 0, 120, "health drained")
            tables_kept = [t for (t,) in target.sql("SELECT relname FROM pg_class WHERE relnamespace = "
                                                    "'outbox'::regnamespace AND relkind = 'r' ORDER BY 1")]
            extversion = target.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'")
        finally:
            if preview:
                db.sql(f'DROP DATABASE IF EXISTS "{common.PREVIEW_DB}" WITH (FORCE)')
                common.relay_paused(db, False)
            db.configure(db.workers, retention="7d")
        third = s["health_seconds"] / 3

        def peak(lo, hi, field="total_bytes"):
            xs = [x[field] for x in samples if lo <= x["t"] < hi]
            return max(xs) if xs else None
        mid, last = peak(third, 2 * third), peak(2 * third, s["health_seconds"] + 1)
        res = {"run": r, "system": system, "extversion": extversion, "events": enqueued, "rate": rate,
               "seconds": s["health_seconds"],
               "achieved_rate": round(enqueued / s["health_seconds"], 1), "per_transaction": per_tx,
               "tables": tables_kept,
               "retention": s["health_retention"], "samples": samples,
               # the relay's retention round: every minute, or a tenth of the retention, at least 1 s
               "retention_interval_s": max(1, min(60, common.seconds(s["health_retention"]) / 10)),
               "peak_total_mb_middle_third": round(mid / 1048576, 2) if mid else None,
               "peak_total_mb_last_third": round(last / 1048576, 2) if last else None,
               "growth_last_vs_middle_pct": round(100 * (last / mid - 1), 1) if mid and last else None,
               "peak_rows_middle_third": peak(third, 2 * third, "rows"),
               "peak_rows_last_third": peak(2 * third, s["health_seconds"] + 1, "rows"),
               "peak_dead_tuples_last_third": peak(2 * third, s["health_seconds"] + 1, "dead_tuples"),
               "final_rows": samples[-1]["rows"] if samples else None,
               "final_dead_tuples": samples[-1]["dead_tuples"] if samples else None,
               "autovacuums": samples[-1]["autovacuums"] if samples else None,
               "max_members_nonempty": max((x["members_nonempty"] or 0 for x in samples), default=None)
               if preview else None}
        if samples:
            # Each table's peak size in the middle and the last third: where any growth is.
            res["per_table_peak_mb"] = {
                t: [round(max((x["per_table"].get(t, {}).get("total_bytes", 0) for x in samples
                               if lo <= x["t"] < hi), default=0) / 1048576, 2)
                    for lo, hi in ((third, 2 * third), (2 * third, s["health_seconds"] + 1))]
                for t in samples[-1]["per_table"]}
            res["per_table_autovacuums"] = {t: v["autovacuums"] for t, v in samples[-1]["per_table"].items()}
        log(f"  table health {system} run {r}: {enqueued} events at {rate}/s (achieved {res['achieved_rate']}/s) with "
            f"retention {s['health_retention']}: peak table+index {res['peak_total_mb_middle_third']} MB in the middle "
            f"third, {res['peak_total_mb_last_third']} MB in the last third; {res['final_rows']} rows kept, "
            f"{res['final_dead_tuples']} dead tuples, {res['autovacuums']} autovacuums at the end")
        return res

    # -- the run ------------------------------------------------------------------------------
    def run(self):
        selected = self.args.only.split(",") if self.args.only else WORKLOADS
        unknown = set(selected) - set(WORKLOADS)
        if unknown:
            raise SystemExit(f"unknown workloads: {', '.join(sorted(unknown))}")
        started = time.time()
        self.results["meta"] = common.machine_info()
        self.results["meta"]["command"] = self.args.command or " ".join(sys.argv)
        self.results["meta"]["quick"] = self.args.quick
        self.results["meta"]["runs"] = self.runs
        self.results["meta"]["started"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self.results["meta"]["loadavg_at_start"] = os.getloadavg()
        log("flushbench (test/mockbroker): one 200-message flush at RTT 0")
        fb = common.flushbench()
        self.results["flushbench"] = fb
        print(fb["output"])
        print(fb["details"])
        # SIGTERM (a stopped run) must still stop the cluster and the mock below.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            self.mock = Mock()
            self.db = Postgres()
            self.results["meta"]["postgres_settings"] = dict(
                self.db.sql("SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', 'fsync', "
                            "'synchronous_commit', 'jit', 'autovacuum_naptime', 'max_wal_size', 'wal_level')"))
            s = self.sizes
            if set(selected) & {"drain", "memory", "burst", "idle_latency"}:
                log(f"data set: {s['drain_events']} events over {s['many_keys']} keys")
                make_dataset(self.db, "ds_many", s["drain_events"], s["many_keys"])
            if set(selected) & (set(BURST_TOPICS) - set(BURST_SHAPES)):
                log(f"data set: {s['burst_drain_events']} events over {s['burst_drain_keys']} keys")
                make_dataset(self.db, "ds_burst", s["burst_drain_events"], s["burst_drain_keys"])
            for name in set(selected) & set(BURST_SHAPES):
                _, dataset, keys = BURST_SHAPES[name]
                log(f"data set: {s['burst_drain_events']} events over {keys} keys")
                make_dataset(self.db, dataset, s["burst_drain_events"], keys)
            if "hot_keys" in selected:
                log(f"data set: {s['drain_events']} events over {s['hot_keys']} keys")
                make_dataset(self.db, "ds_hot", s["drain_events"], s["hot_keys"])
            for w in selected:
                log(f"== {w}")
                self.cell(w, getattr(self, "w_" + w), kind="workload")
        finally:
            self.results["meta"]["duration_s"] = round(time.time() - started, 1)
            self.results["meta"]["loadavg_at_end"] = os.getloadavg()
            if self.db:
                # The whole server log (autovacuum runs, relay messages) goes with the results.
                shutil.copy(self.db.pg.log_path, self.out / "postgres.log")
                self.db.stop()
            if self.mock:
                # Proof that the mock the timings ran against had TCP_NODELAY on every socket.
                try:
                    self.results["mock_sockets"] = self.mock.sockets()
                finally:
                    self.mock.close()
        import report
        self.results["summary"], self.results["targets"] = report.summarize(self.results)
        self.save()
        report.print_tables(self.results)
        (self.out / "tables.md").write_text(report.markdown(self.results))
        try:
            import charts
            charts.draw(self.results, self.out)
        except ImportError as e:
            log(f"charts skipped: {e}")
        log(f"results: {self.out / 'results.json'} ({self.results['meta']['duration_s']} s)")
        return 1 if self.results["errors"] else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke sizes (a couple of minutes, no targets)")
    ap.add_argument("--runs", type=int, default=None, help="runs of each target cell (default 3; --quick 1)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--only", default=None, help="comma-separated workloads: " + ",".join(WORKLOADS))
    ap.add_argument("--health-minutes", type=float, default=None,
                    help="table_health duration per run (default 30 minutes; --quick 20 s)")
    ap.add_argument("--health-rate", type=int, default=None,
                    help="table_health: events per second offered (default 2,000; --quick 200)")
    ap.add_argument("--health-systems", default=None,
                    help="table_health: comma-separated, of " + ",".join(HEALTH_SYSTEMS) + " (default outbox_040, "
                         "the 0.4.0 preview)")
    ap.add_argument("--wal-events", type=int, default=None,
                    help="wal_cost: events per shape and run (default 20,000; --quick 2,000)")
    ap.add_argument("--burst-events", type=int, default=None,
                    help="events per burst_4topic / burst_1topic run (default 100,000)")
    ap.add_argument("--burst-rtts", default=None, help="burst workloads: RTTs in ms, e.g. 5,20 (default 0,5,20)")
    ap.add_argument("--burst-workers", default=None, help="burst workloads: worker counts, e.g. 1,2 (default 1,2,4)")
    ap.add_argument("--burst-systems", default=None, help="burst workloads: relays and floors, e.g. outbox,tuned")
    ap.add_argument("--shape-systems", default=None,
                    help="burst_1topic, burst_4topic_3x6 and burst_4topic_1broker: relays and floors "
                         "(default: --burst-systems)")
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.exit(Bench(args).run())


if __name__ == "__main__":
    main()
