"""Metrics people already scrape: the real postgres_exporter (built from the Go module proxy,
harness/postgres_exporter.py) runs docs/metrics/queries.yaml against a throwaway cluster whose
relay publishes a known workload to the mock cluster; the test scrapes /metrics over HTTP and
checks the outbox series and their values, then that every panel of the Grafana dashboard
(docs/metrics/grafana-dashboard.json) queries series the exporter exported, and what the
dashboard's headline panels and the alerting rules (docs/metrics/alerts.yaml) show on a healthy
and on a broken scrape."""

import signal
import json
import math
import os
import re
import sys

import pytest
import yaml

from harness.pg_cluster import PgCluster
from harness.postgres_exporter import Exporter
from harness.wait import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUERIES = os.path.join(ROOT, "docs", "metrics", "queries.yaml")
DASHBOARD = os.path.join(ROOT, "docs", "metrics", "grafana-dashboard.json")
ALERTS = os.path.join(ROOT, "docs", "metrics", "alerts.yaml")
DATABASE = (("database", "postgres"),)
WORKER = (("database", "postgres"), ("worker", "0"))
BILLING = (("database", "postgres"), ("topic", "billing"))
GOOD_EVENTS = 50


def scrape(exporter):
    """One scrape, without the exporter's own `server` label (the cluster's socket path)."""
    return {(name, tuple(kv for kv in labels if kv[0] != "server")): v
            for (name, labels), v in exporter.scrape().items()}


def value(samples, name, labels=WORKER, **extra):
    key = (name, tuple(sorted(labels + tuple(extra.items()))))
    assert key in samples, f"{name}{dict(key[1])} not exported; outbox series: " + \
        ", ".join(sorted({n for n, _ in samples if n.startswith("outbox_")}))
    return samples[key]


def samples_value(samples, name, labels=WORKER):
    """value() or None when the series is not exported (yet)."""
    return samples.get((name, tuple(sorted(labels))))


def states(samples):
    """{state: value} of worker 0's outbox_worker_status_info series."""
    return {dict(l)["state"]: v for (n, l), v in samples.items()
            if n == "outbox_worker_status_info" and dict(l)["worker"] == "0"}


def bucket(samples, histogram, le):
    return value(samples, f"outbox_worker_{histogram}_bucket", le=le)


def check_histogram(samples, histogram, bounds):
    """Cumulative buckets that never decrease, +Inf equal to the count."""
    counts = [bucket(samples, histogram, le) for le in bounds + ["+Inf"]]
    assert counts == sorted(counts), (histogram, counts)
    assert counts[-1] == value(samples, f"outbox_worker_{histogram}_count")
    return counts


SECONDS_BOUNDS = ["0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1",
                  "2.5", "5", "10", "30"]
BATCH_BOUNDS = ["1", "10", "50", "100", "250", "500", "1000", "2500", "5000", "10000", "20000", "50000"]


def test_postgres_exporter_scrapes_outbox_series_after_a_known_workload(mock_cluster, make_relay):
    # The producer refuses events over 2000 bytes: a poison event fails its 3 attempts.
    pg = make_relay(mock_cluster.bootstrap, max_attempts=3, kafka_properties="message.max.bytes=2000",
                    max_payload_bytes="1MB")
    pg.wait_workers_running(1)
    # What monitoring gets: a login in pg_monitor, no superuser, no table rights.
    pg.sql("CREATE ROLE outbox_scraper LOGIN IN ROLE pg_monitor")
    dsn = f"host={pg.tmp} port={pg.port} user=outbox_scraper dbname=postgres sslmode=disable"

    # 1. GOOD_EVENTS events in one transaction: one claim takes them all, one batch.
    with pg.connect(autocommit=False) as c:
        for i in range(GOOD_EVENTS):
            c.execute("SELECT outbox.enqueue('billing', %s, %s::jsonb)", (f"k{i % 10}", f'{{"n": {i}}}'))
        c.commit()
    pg.wait_published(GOOD_EVENTS)

    with Exporter(dsn, QUERIES) as exporter:
        # Scraped once the worker is idle again, with nothing left to do.
        s = wait_until(lambda: (lambda s: s if value(s, "outbox_worker_events_published_total") == GOOD_EVENTS
                                and states(s) == {"idle": 1} else None)(scrape(exporter)), 30,
                       "published counter scraped, worker idle")
        # The queries file loaded without error.
        assert [v for (n, l), v in s.items() if n == "pg_exporter_user_queries_load_error"
                and dict(l)["filename"] == QUERIES] == [0]
        assert value(s, "outbox_worker_events_failed_total") == 0
        assert value(s, "outbox_worker_events_retried_total") == 0
        assert value(s, "outbox_worker_broker_up") == 1
        assert value(s, "outbox_worker_backing_off") == 0
        assert value(s, "outbox_worker_backoff_remaining_seconds") == 0
        assert value(s, "outbox_worker_start_time_seconds") > 1.7e9
        # One batch of exactly GOOD_EVENTS: in the bucket le=50, not in le=10.
        assert value(s, "outbox_worker_batch_size_count") == 1
        assert value(s, "outbox_worker_batches_total") == 1
        assert value(s, "outbox_worker_batch_size_sum") == GOOD_EVENTS
        assert check_histogram(s, "batch_size", BATCH_BOUNDS) == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
        for timing in ("publish_seconds", "record_seconds"):
            assert check_histogram(s, timing, SECONDS_BOUNDS)[-1] == 1
            assert 0 < value(s, f"outbox_worker_{timing}_sum") < 60
        assert check_histogram(s, "claim_seconds", SECONDS_BOUNDS)[-1] >= 1
        assert [dict(l)["broker_state"] for n, l in s if n == "outbox_worker_status_info"] == ["up"]
        assert ("outbox_topic_pending", BILLING) not in s  # nothing waiting: no per-topic series
        # ... but the database's backlog series say 0, so the headline panels show 0, not "No
        # data" (which is what a broken scrape shows), and no alert fires.
        for name in ("pending", "failed", "oldest_pending_age_seconds"):
            assert value(s, f"outbox_backlog_{name}", DATABASE) == 0
        for title, expr in headline_panels():
            healthy = 1.0 if title == "Brokers reachable" else 0.0
            assert list(evaluate(expr, s).values()) == [[(0.0, healthy)]], (title, evaluate(expr, s))
        assert firing(s) == set()

        # 2. A poison event (refused 3 times: 2 retries, then failed) and two events of its key
        #    behind it, which wait (block_key).
        with pg.connect() as c:
            c.execute("SELECT outbox.enqueue('billing', 'bad-key', %s)", ("x" * 5000,))
            for i in range(2):
                c.execute("SELECT outbox.enqueue('billing', 'bad-key', %s)", (f"after {i}",))
        # (The counter is shared memory, bumped before the record commits: wait for the table too.)
        s = wait_until(lambda: (lambda s: s if value(s, "outbox_worker_events_failed_total") == 1
                                and samples_value(s, "outbox_topic_failed", BILLING) == 1
                                else None)(scrape(exporter)), 60, "failed counter and failed event scraped")
        assert value(s, "outbox_worker_events_published_total") == GOOD_EVENTS
        assert value(s, "outbox_worker_events_retried_total") == 2
        assert value(s, "outbox_worker_events_requeued_total") >= 0
        batches = value(s, "outbox_worker_batches_total")
        assert value(s, "outbox_worker_batch_size_count") == batches
        assert batches >= 4  # the good batch and the poison's three attempts
        assert value(s, "outbox_worker_batch_size_sum") >= GOOD_EVENTS + 3
        for histogram in ("publish_seconds", "record_seconds"):
            assert check_histogram(s, histogram, SECONDS_BOUNDS)[-1] == batches
        check_histogram(s, "batch_size", BATCH_BOUNDS)
        assert value(s, "outbox_topic_pending", BILLING) == 2
        assert value(s, "outbox_topic_failed", BILLING) == 1
        assert value(s, "outbox_backlog_pending", DATABASE) == 2
        assert value(s, "outbox_backlog_failed", DATABASE) == 1
        assert "OutboxFailedEvents" in firing(s) and "OutboxMetricsAbsent" not in firing(s)
        age = value(s, "outbox_topic_oldest_pending_age_seconds", BILLING)
        assert 0 < age < 600
        # The gauge follows the oldest waiting event's age.
        wait_until(lambda: value(scrape(exporter), "outbox_topic_oldest_pending_age_seconds", BILLING) > age + 0.5,
                   30, "oldest pending age growing")

        # Every series a dashboard panel queries is one the exporter exported.
        exported = {name for name, _ in s}
        for panel, expr in dashboard_queries():
            for name in re.findall(r"\b(outbox_[a-z_]+)\b", expr):
                assert name in exported, f"panel {panel!r} queries {name}, which the exporter does not export"
        assert "outbox.events" not in exporter.log_text()  # no permission errors on the table


def promql():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import promql_lite
    return promql_lite


def evaluate(expr, samples):
    """An expression over one scrape, as Prometheus would show it ({labels: value}; empty is
    Grafana's "No data" and an alert that does not fire)."""
    return promql().series(expr, [(0.0, samples)], {"database": ".*"}, rate_interval=60)


def headline_panels():
    """(title, expr) of the dashboard's stat panels, the ones an operator looks at first."""
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    return [(p["title"], t["expr"]) for p in dashboard["panels"] if p["type"] == "stat" for t in p["targets"]]


def firing(samples):
    """Names of the alerting rules whose expression returns something on this scrape (their
    `for:` aside)."""
    with open(ALERTS) as f:
        rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    return {r["alert"] for r in rules if evaluate(r["expr"], samples)}


def dashboard_queries():
    """(panel title, expr) of every query of the dashboard."""
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


EXPECTED_PANELS = {
    "Oldest pending event": ["outbox_backlog_oldest_pending_age_seconds"],
    "Failed events": ["outbox_backlog_failed"],
    "Events per second": ["outbox_worker_events_published_total", "outbox_worker_events_failed_total",
                          "outbox_worker_events_retried_total"],
    "Batches per second and batch size": ["outbox_worker_batches_total", "outbox_worker_batch_size_bucket"],
    "Publish round trip": ["outbox_worker_publish_seconds_bucket"],
    "Claim and record time": ["outbox_worker_claim_seconds_bucket", "outbox_worker_record_seconds_bucket"],
    "Brokers reachable": ["outbox_worker_broker_up"],
    "Broker backoff": ["outbox_worker_backoff_remaining_seconds"],
    "Worker state": ["outbox_worker_status_info"],
}


def test_a_broken_scrape_shows_no_data_and_fires_the_absent_alert():
    # The exporter runs, logs in, but its role may not read the outbox (not in pg_monitor): the
    # outbox queries fail on every scrape. The headline panels must then show "No data" (never
    # a healthy 0), and OutboxMetricsAbsent must fire; with the right role, the same cluster's
    # scrape is healthy.
    with PgCluster(settings={"outbox.workers": "0"}) as pg:
        pg.sql("CREATE ROLE outbox_scraper_without_rights LOGIN")
        pg.sql("CREATE ROLE outbox_scraper LOGIN IN ROLE pg_monitor")
        dsn = f"host={pg.tmp} port={pg.port} dbname=postgres sslmode=disable user="
        with Exporter(dsn + "outbox_scraper_without_rights", QUERIES) as exporter:
            s = wait_until(lambda: (lambda s: s if s.get(("pg_up", ())) == 1 else None)(scrape(exporter)), 30,
                           "the exporter connected")
            assert not [n for n, _ in s if n.startswith("outbox_")], sorted(n for n, _ in s if n.startswith("outbox_"))
            assert "permission denied" in exporter.log_text()
            for title, expr in headline_panels():
                assert evaluate(expr, s) == {}, title
            assert firing(s) == {"OutboxMetricsAbsent"}
        with Exporter(dsn + "outbox_scraper", QUERIES) as exporter:
            s = wait_until(lambda: (lambda s: s if ("outbox_backlog_pending", DATABASE) in s else None)(
                scrape(exporter)), 30, "the backlog series scraped")
            assert value(s, "outbox_backlog_oldest_pending_age_seconds", DATABASE) == 0
            assert firing(s) == set()


def test_grafana_dashboard_is_valid_and_has_the_expected_panels():
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "database" in variables
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        # Every query follows the dashboard's database selector.
        assert all('database=~"$database"' in t["expr"] for t in p["targets"]), p["title"]
    queries = dashboard_queries()
    for title, series in EXPECTED_PANELS.items():
        exprs = " ".join(e for t, e in queries if t == title)
        assert exprs, f"no panel {title!r}"
        for name in series:
            assert re.search(rf"\b{name}\b", exprs), f"panel {title!r} does not query {name}"
    # bench/dashboard.py draws the picture with these very queries: each parses there.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import promql_lite
    for title, expr in queries:
        promql_lite.Parser(expr, rate_interval=8).parse()
    assert promql_lite.quantile(0.5, [(1, 0), (10, 10), (math.inf, 10)]) == 5.5
    # Rates over counters and histograms, never over gauges; quantiles over buckets.
    for title, expr in queries:
        for m in re.finditer(r"histogram_quantile\([^,]+,\s*sum by \(le\) \(rate\((outbox_[a-z_]+)", expr):
            assert m.group(1).endswith("_bucket"), (title, expr)
        for m in re.finditer(r"rate\((outbox_[a-z_]+)", expr):
            assert m.group(1).endswith(("_total", "_bucket", "_sum", "_count")), (title, expr)


@pytest.mark.parametrize("analyzed", [False, True], ids=["no statistics", "analyzed"])
def test_topic_metrics_reads_the_backlog_not_the_published_history(analyzed):
    # 200,000 published events (a week of retained history) and a backlog of 20: the per-topic
    # query walks the partial indexes of the unfinished rows, never the table, with statistics
    # and without (a burst into a table autovacuum has not analyzed yet).
    # 0.3.0's table, its published history written by hand (0.4.0's view takes pending rows only).
    with PgCluster(settings={"outbox.workers": "0", "autovacuum": "off"}, create_extension="0.3.0") as pg:
        pg.sql("INSERT INTO outbox.events (event_id, topic, key, lane, payload, status, published_at) "
               "SELECT id, 'billing', 'k' || (i % 1000), outbox.lane_of('k' || (i % 1000), id), '\\x00', "
               "       'published', now() "
               "FROM (SELECT gen_random_uuid() AS id, i FROM generate_series(1, 200000) i) s")
        for i in range(20):
            pg.sql("SELECT outbox.enqueue(%s, 'k', 'waiting')", ("billing" if i % 2 else "orders",))
        pg.sql("UPDATE outbox.events SET status = 'failed' WHERE id IN "
               "(SELECT id FROM outbox.events WHERE status = 'pending' ORDER BY id LIMIT 2)")
        if analyzed:
            pg.sql("ANALYZE outbox.events")
        body = pg.value("SELECT prosrc FROM pg_proc WHERE oid = 'outbox.topic_metrics()'::regprocedure")
        # As the function runs it: with the function's search_path.
        with pg.connect() as c:
            c.execute("SET search_path = pg_catalog, pg_temp")
            plan = c.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + body.strip().rstrip(";")).fetchone()[0]
            table_pages = c.execute("SELECT pg_relation_size('outbox.events') / current_setting('block_size')::int").fetchone()[0]

        def nodes(n):
            yield n
            for child in n.get("Plans", []):
                yield from nodes(child)
        scans = [n for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") == "events"]
        assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), [n["Node Type"] for n in scans]
        buffers = plan[0]["Plan"]["Shared Hit Blocks"] + plan[0]["Plan"]["Shared Read Blocks"]
        assert buffers < table_pages / 20, (buffers, table_pages)
        assert sorted(pg.sql("SELECT topic, pending, failed FROM outbox.topic_metrics")) == \
            [("billing", 9, 1), ("orders", 9, 1)]


def test_backoff_and_broker_state_follow_an_outage(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, backoff_base="2s", backoff_max="4s", publish_timeout="1s",
                    kafka_properties="socket.connection.setup.timeout.ms=1000;reconnect.backoff.max.ms=200")
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'warmup', 'x')")
    pg.wait_published(1)
    metrics = "SELECT broker_up, backing_off, backoff_remaining_seconds, backoffs, events_published " \
              "FROM outbox.worker_metrics WHERE worker = 0"
    # The counters follow the record's commit by a moment. (A first broker probe at start may
    # have found no broker yet: backoffs counts from here.)
    _, _, _, backoffs_before, _ = wait_until(
        lambda: (lambda r: r if r[:3] == (1, 0, 0.0) and r[4] == 1 else None)(pg.sql(metrics)[0]), 10,
        "one published, broker up, no backoff")
    for b in (1, 2, 3):
        mock_cluster.down(b)
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'waits for the brokers')")
    up, backing_off, remaining, backoffs, _ = wait_until(
        lambda: (lambda r: r if r[1] == 1 and r[0] == 0 else None)(pg.sql(metrics)[0]), 60, "backing off, broker down")
    assert backoffs > backoffs_before and 0 < remaining <= 4
    assert pg.value("SELECT state FROM outbox.workers WHERE worker = 0") == "backing off"
    for b in (1, 2, 3):
        mock_cluster.up(b)
    pg.wait_published(2, timeout=60)
    wait_until(lambda: pg.sql(metrics)[0][:2] == (1, 0) and pg.sql(metrics)[0][4] == 2, 30, "broker up again")


def test_worker_series_name_the_database_the_worker_serves(mock_cluster, make_relay):
    # The label comes from the worker's own connection (its slot), not from the database the
    # scrape runs in: with workers serving several databases it stays right.
    pg = make_relay(mock_cluster.bootstrap, workers=2, database="billing")
    pg.wait_workers_running(2)
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'x')")
    pg.wait_published(1)
    wait_until(lambda: pg.sql("SELECT database, sum(events_published) FROM outbox.worker_metrics GROUP BY 1") ==
               [("billing", 1)], 10, "both workers labelled billing, one event published")
    pg.sql("CREATE EXTENSION outbox", dbname="postgres")  # the launcher starts postgres's own worker
    wait_until(lambda: pg.sql("SELECT database, worker FROM outbox.worker_metrics ORDER BY 1, 2", dbname="postgres") ==
               [("billing", 0), ("billing", 1), ("postgres", 0), ("postgres", 1)], 30,
               "each database's two workers, labelled with their own database")


def test_a_restarted_worker_shows_no_metrics_of_its_previous_run(mock_cluster, make_relay):
    # A restarted worker's row is the new run's throughout: published 0 with the old run's
    # batches, histograms and backoffs beside it is a row no run ever had.
    pg = make_relay(mock_cluster.bootstrap, database="billing")
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'x')", dbname="billing")
    pg.wait_published(1)
    old_pid = pg.worker_pids()[0]
    wait_until(lambda: pg.sql("SELECT events_published, batches FROM outbox.worker_metrics", dbname="billing") ==
               [(1, 1)], 10, "the first run's batch counted")

    # A worker that exits is started again by the launcher: its row is the new run's at once.
    pg.kill_worker(0, signal.SIGTERM)
    row = wait_until(lambda: (lambda r: r if r and r[0][0] not in (None, old_pid) else None)(
        pg.sql("SELECT pid, database, events_published, batches, batch_size_count, backoffs "
               "FROM outbox.worker_metrics", dbname="billing")), 60, "a new run")
    assert row[0][1:] == ("billing", 0, 0, 0, 0), row
