#!/usr/bin/python3
"""A picture of the Grafana dashboard (docs/metrics/grafana-dashboard.json) drawn from real
data: a throwaway cluster with 2 relay workers publishes to the librdkafka mock cluster (RTT
5 ms) under a steady load, a burst, poison events and a broker outage, while the real
postgres_exporter (docs/metrics/queries.yaml) is scraped every 2 s. Each panel's own PromQL is
evaluated over the scrapes (bench/promql_lite.py) and drawn where the dashboard puts it.

    bench/dashboard.py [--seconds 100] [--out docs/metrics/dashboard.png]

Run as a user PostgreSQL accepts (not root), with the extension installed (test/run does that).
"""

import argparse
import json
import math
import threading
import time

import common  # noqa: F401  (PATH to the server's binaries, the test harness on sys.path)
import promql_lite
from harness.mock_cluster import MockCluster
from harness.pg_cluster import PgCluster
from harness.postgres_exporter import Exporter

REPO = common.REPO
DASHBOARD = REPO / "docs" / "metrics" / "grafana-dashboard.json"
QUERIES = REPO / "docs" / "metrics" / "queries.yaml"
SCRAPE_S = 2


def run_workload(seconds):
    """Returns [(t, {(name, labels): value})] of the outbox series, t from the start."""
    scrapes = []
    with MockCluster(brokers=3, topics={"billing.invoices": 6, "billing.payments": 6}) as mc:
        mc.rtt("all", 5)
        settings = {"outbox.bootstrap_servers": f"'{mc.bootstrap}'", "outbox.workers": "2",
                    "outbox.max_attempts": "3", "outbox.kafka_properties": "'message.max.bytes=2000'",
                    "outbox.publish_timeout": "'2s'", "outbox.backoff_max": "'4s'"}
        with PgCluster(settings=settings) as pg:
            pg.wait_workers_running(2)
            pg.sql("CREATE ROLE outbox_exporter LOGIN IN ROLE pg_monitor")
            dsn = f"host={pg.tmp} port={pg.port} user=outbox_exporter dbname=postgres sslmode=disable"
            stop = threading.Event()
            start = time.monotonic()

            def writer():
                # About 400 events/s in transactions of 20, over 200 keys of two topics.
                n = 0
                with pg.connect(autocommit=False) as c:
                    while not stop.is_set():
                        for _ in range(20):
                            topic = "billing.invoices" if n % 3 else "billing.payments"
                            c.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)",
                                      (topic, f"sub-{n % 200}", json.dumps({"n": n})))
                            n += 1
                        c.commit()
                        stop.wait(0.05)

            def incidents():
                at = lambda frac: stop.wait(max(0.0, start + seconds * frac - time.monotonic()))  # noqa: E731
                if at(0.25):
                    return
                pg.sql("SELECT outbox.enqueue('billing.invoices', 'bulk-' || (i % 500), '{}'::jsonb) "
                       "FROM generate_series(1, 30000) i")  # a burst: one transaction
                if at(0.45):
                    return
                for i in range(3):  # poison: over the producer's message.max.bytes
                    pg.sql("SELECT outbox.enqueue('billing.payments', %s, %s)", (f"poison-{i}", "x" * 5000))
                if at(0.6):
                    return
                for b in (1, 2, 3):
                    mc.down(b)
                if at(0.75):
                    return
                for b in (1, 2, 3):
                    mc.up(b)

            threads = [threading.Thread(target=writer), threading.Thread(target=incidents)]
            with Exporter(dsn, str(QUERIES)) as exporter:
                for t in threads:
                    t.start()
                try:
                    next_scrape = start
                    while time.monotonic() - start < seconds:
                        samples = exporter.scrape()
                        scrapes.append((time.monotonic() - start, {
                            (n, tuple(kv for kv in l if kv[0] != "server")): v
                            for (n, l), v in samples.items() if n.startswith("outbox_")}))
                        next_scrape += SCRAPE_S
                        time.sleep(max(0.0, next_scrape - time.monotonic()))  # the scrape interval
                finally:
                    stop.set()
                    for t in threads:
                        t.join()
    return scrapes


def draw(scrapes, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {"database": ".*"}
    rate_interval = 4 * SCRAPE_S
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    unit_h = 0.42
    fig = plt.figure(figsize=(20, rows * unit_h), facecolor="#111217")
    state_colors = {"idle": "#73bf69", "claiming": "#5794f2", "publishing": "#b877d9", "recording": "#8ab8ff",
                    "backing off": "#f2495c", "starting": "#fade2a", "misconfigured": "#ff9830",
                    "extension not installed": "#ff9830", "stopped": "#808080"}
    palette = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0"]
    for p in dashboard["panels"]:
        g = p["gridPos"]
        left, width = 0.035, 0.955  # room for the tick labels of the left column
        ax = fig.add_axes([left + width * g["x"] / 24, 1 - (g["y"] + g["h"]) / rows + 0.012,
                           width * g["w"] / 24 - 0.035, g["h"] / rows - 0.03], facecolor="#181b1f")
        for side in ax.spines.values():
            side.set_color("#2c3235")
        ax.tick_params(colors="#9fa7b3", labelsize=7)
        ax.set_title(p["title"], color="#d8d9da", fontsize=9, loc="left")
        unit = p["fieldConfig"]["defaults"].get("unit", "short")
        results = []
        for t in p["targets"]:
            for labels, pts in promql_lite.series(t["expr"], scrapes, variables, rate_interval).items():
                legend = t.get("legendFormat") or t["expr"]
                for k, v in labels:
                    legend = legend.replace("{{" + k + "}}", v)
                results.append((legend.replace("{{database}}", "").strip(), labels, pts))
        if p["type"] == "stat":
            ax.set_xticks([]); ax.set_yticks([])
            last = [pts[-1][1] for _, _, pts in results if pts and not math.isnan(pts[-1][1])]
            value = last[0] if last else math.nan
            text, color = stat_text(p, value, unit)
            ax.set_facecolor(color)
            ax.text(0.5, 0.45, text, ha="center", va="center", fontsize=26, color="white", transform=ax.transAxes)
        elif p["type"] == "state-timeline":
            workers = sorted({dict(l).get("worker", "") for _, l, _ in results})
            times = [t for t, _ in scrapes]
            until = dict(zip(times, times[1:] + [times[-1] + SCRAPE_S]))
            for _, labels, pts in results:
                d = dict(labels)
                y = workers.index(d.get("worker", ""))
                for t0, _ in pts:  # a state holds from its scrape to the next one
                    ax.barh(y, until[t0] - t0, left=t0, color=state_colors.get(d.get("state"), "#808080"), height=0.8)
            ax.set_yticks(range(len(workers)), [f"worker {w}" for w in workers])
            ax.set_xlim(0, scrapes[-1][0])
            handles = [plt.Rectangle((0, 0), 1, 1, color=c) for s, c in state_colors.items()
                       if any(dict(l).get("state") == s for _, l, _ in results)]
            names = [s for s in state_colors if any(dict(l).get("state") == s for _, l, _ in results)]
            ax.legend(handles, names, fontsize=7, loc="upper right", ncol=len(names), facecolor="#181b1f",
                      labelcolor="#d8d9da", edgecolor="#2c3235")
        else:
            for n, (legend, _, pts) in enumerate(results):
                ax.plot([t for t, _ in pts], [v for _, v in pts], color=palette[n % len(palette)], lw=1.3, label=legend)
            ax.grid(color="#2c3235", lw=0.5)
            ax.set_xlim(0, scrapes[-1][0])
            if results:
                ax.legend(fontsize=6.5, loc="upper left", facecolor="#181b1f", labelcolor="#d8d9da",
                          edgecolor="#2c3235")
            if unit == "s":
                ax.set_ylabel("seconds", color="#9fa7b3", fontsize=7)
            elif unit == "ops":
                ax.set_ylabel("per second", color="#9fa7b3", fontsize=7)
        ax.set_xlabel("seconds into the run" if p["type"] != "stat" else "", color="#9fa7b3", fontsize=7)
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())


def stat_text(panel, value, unit):
    defaults = panel["fieldConfig"]["defaults"]
    color = "#1f60c4"
    for step in defaults.get("thresholds", {}).get("steps", []):
        if step["value"] is None or (not math.isnan(value) and value >= step["value"]):
            color = {"green": "#37872d", "orange": "#c4621f", "red": "#c4162a"}.get(step["color"], step["color"])
    for mapping in defaults.get("mappings", []):
        m = mapping["options"].get(str(int(value))) if not math.isnan(value) else None
        if m:
            return m["text"], {"green": "#37872d", "red": "#c4162a"}.get(m["color"], m["color"])
    if math.isnan(value):
        return "no data", "#2c3235"
    return (f"{value:.1f} s" if unit == "s" else f"{value:g}"), color


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=100)
    ap.add_argument("--out", default=str(REPO / "docs" / "metrics" / "dashboard.png"))
    ap.add_argument("--save", help="also write the scrapes (JSON) here")
    args = ap.parse_args()
    scrapes = run_workload(args.seconds)
    if args.save:
        with open(args.save, "w") as f:
            json.dump([[t, [[n, list(map(list, l)), v] for (n, l), v in s.items()]] for t, s in scrapes], f)
    draw(scrapes, args.out)
    print(f"{len(scrapes)} scrapes -> {args.out}")


if __name__ == "__main__":
    main()
