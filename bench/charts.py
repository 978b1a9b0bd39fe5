"""PNG charts of a results.json: throughput by workers and RTT, latency distribution, worker
memory over the big drain, table size under steady load, backlog during the burst."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"outbox": "tab:blue", "outbox_040": "tab:purple", "outbox_040_1conn": "tab:pink", "outbox_040_eos": "tab:olive", "batched": "tab:orange", "seed": "tab:red", "floor": "tab:gray",
          "outbox_jit_off": "tab:cyan", "tuned": "tab:green", "floor_delete": "black",
          "floor_update": "tab:gray", "floor_update2": "tab:brown"}
NAMES = {"outbox": "outbox 0.3.0 relay", "outbox_040": "outbox 0.4.x relay (0.4.1 the default)",
         "outbox_040_1conn": "outbox 0.4.x relay, kafka_connections = 1",
         "outbox_040_eos": "outbox 0.4.x exactly_once", "batched": "naive batched relay", "seed": "seed-style relay",
         "floor": "SQL floor (no Kafka, jit=off)", "outbox_jit_off": "outbox relay, jit=off",
         "tuned": "tuned batched relay", "floor_delete": "floor: claim + DELETE",
         "floor_update": "floor: claim + 1 UPDATE", "floor_update2": "floor: claim + 2 UPDATEs"}
RTT_STYLES = {0: ":", 5: "-", 20: "--"}
# A marker per RTT too: with one worker a line is a single point, and the line style does not show.
RTT_MARKERS = {0: "s", 5: "o", 20: "^"}



def _save(fig, out, name):
    """Writes one chart as PNG and frees the figure."""
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

def throughput(results, out):
    rows = results.get("summary", {}).get("drain") or []
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for system in ("outbox", "batched", "seed", "floor", "outbox_jit_off"):
        for rtt, style in ((0, "--"), (5, "-")):
            pts = sorted((r["workers"], r["rate_median"]) for r in rows
                         if r["system"] == system and r["rtt_ms"] == rtt)
            if not pts:
                continue
            label = NAMES[system] + ("" if system == "floor" else f", RTT {rtt} ms")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=COLORS[system], label=label)
    ax.set_yscale("log")
    ax.set_xlabel("workers")
    ax.set_ylabel("events/s (log scale)")
    ax.set_xticks(sorted({r["workers"] for r in rows}))
    n = results["config"]["drain_events"]
    ax.set_title(f"Backlog drain, {n:,} events over {results['config']['many_keys']:,} keys")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, "throughput.png")


def latency(results, out):
    runs = results.get("workloads", {}).get("idle_latency") or []
    if not runs:
        return None
    rtt = results["config"]["rtt_ms"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for system in ("outbox", "batched", "seed"):
        lat = sorted(x for r in runs if r["system"] == system for x in r["latencies_ms"])
        if not lat:
            continue
        ys = [(i + 1) / len(lat) for i in range(len(lat))]
        ax.plot(lat, ys, color=COLORS[system], label=f"{NAMES[system]} ({len(lat)} events)")
    ax.axvline(rtt + 3, color="k", ls=":", lw=1, label=f"target p50 <= {rtt + 3} ms")
    ax.axvline(rtt + 15, color="k", ls="--", lw=1, label=f"target p99 <= {rtt + 15} ms")
    ax.set_xscale("log")
    ax.set_xlabel("commit -> broker ack, ms (log scale)")
    ax.set_ylabel("fraction of events")
    ax.set_title(f"Idle-queue latency: one event every {results['config']['latency_interval_ms']} ms, "
                 f"RTT {rtt} ms")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, out, "latency.png")


def memory(results, out):
    mem = results.get("workloads", {}).get("memory")
    if not mem or not mem.get("memory_timeline"):
        return None
    tl = mem["memory_timeline"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ts = [x[0] for x in tl]
    ax.plot(ts, [x[1] / 1024 for x in tl], label="VmRSS", color="tab:blue")
    ax.plot(ts, [x[2] / 1024 for x in tl], label="RssAnon (private heap)", color="tab:green")
    ax.plot(ts, [x[3] / 1024 for x in tl], label="RssShmem (shared buffers touched)", color="tab:gray")
    ax.axhline(64, color="k", ls="--", lw=1, label="target 64 MB")
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("MB")
    ax.set_title(f"Relay worker memory, {mem['events']:,}-event backlog")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, "memory.png")


def table_health(results, out):
    th = results.get("workloads", {}).get("table_health")
    if not th or not th.get("samples"):
        return None
    s = th["samples"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ts = [x["t"] for x in s]
    ax.plot(ts, [x["total_bytes"] / 1048576 for x in s], label="table + indexes", color="tab:blue")
    ax.plot(ts, [x["table_bytes"] / 1048576 for x in s], label="table", color="tab:green")
    ax.plot(ts, [x["index_bytes"] / 1048576 for x in s], label="indexes", color="tab:orange")
    ax2 = ax.twinx()
    ax2.plot(ts, [x["enqueued"] / 1000 for x in s], color="tab:gray", ls=":", label="events enqueued (k)")
    ax2.set_ylabel("events enqueued (thousands)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MB")
    what = f"outbox {th['extversion']} tables" if th.get("extversion") else "outbox.events"
    ax.set_title(f"{what} size (schema outbox), {th['rate']} events/s, retention {th['retention']}")
    ax.grid(True, alpha=0.3)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper left")
    return _save(fig, out, "table_health.png")


def burst(results, out):
    runs = results.get("workloads", {}).get("burst") or []
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        tl = r["backlog_timeline"]
        ax.plot([x[0] for x in tl], [x[1] for x in tl], color=COLORS[r["system"]], label=NAMES[r["system"]])
    ax.set_xlabel("seconds since the burst started")
    ax.set_ylabel("events enqueued but not yet published")
    ax.set_title(f"Renewal burst: {runs[0]['events']:,} events in {runs[0]['enqueue_seconds']:.0f} s, one worker")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, "burst.png")


def burst_drains(results, out):
    """The burst workloads: events/s by workers, a line per relay and RTT, a panel per workload."""
    summary = results.get("summary", {})
    names = [n for n in ("burst_4topic", "burst_1topic", "burst_4topic_3x6", "burst_4topic_1broker") if summary.get(n)]
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(7 * len(names), 5), squeeze=False)
    for ax, name in zip(axes[0], names):
        rows = summary[name]
        for system in NAMES:
            for rtt in sorted({r["rtt_ms"] for r in rows if r["system"] == system}):
                pts = sorted((r["workers"], r["rate_median"]) for r in rows
                             if r["system"] == system and r["rtt_ms"] == rtt)
                label = NAMES[system] + ("" if system.startswith("floor") else f", RTT {rtt} ms")
                ax.plot([p[0] for p in pts], [p[1] for p in pts], RTT_STYLES.get(rtt, "-."),
                        marker=RTT_MARKERS.get(rtt, "D"), markersize=8, color=COLORS[system],
                        markerfacecolor="none" if rtt == 20 else COLORS[system], label=label)
        ax.set_yscale("log")
        ax.set_xlabel("workers")
        ax.set_ylabel("events/s (log scale)")
        ax.set_xticks(sorted({r["workers"] for r in rows}))
        n_topics = 1 if name == "burst_1topic" else 4
        shape = {"burst_4topic_3x6": ", 3 brokers x 6 partitions", "burst_4topic_1broker": ", one broker"}.get(name, "")
        ax.set_title(f"Burst of {rows[0]['events']:,} events in one transaction, {n_topics} topic(s){shape}, no ANALYZE",
                     fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out, "burst_drain.png")


def exactly_once(results, out):
    """outbox.delivery = exactly_once beside at-least-once (the same relay, default connections and
    one), and the tuned relay, one worker: events/s per RTT (bars, a panel per burst workload),
    with exactly_once's extra time per batch over at-least-once written above its bar."""
    rows = results.get("summary", {}).get("exactly_once") or []
    if not rows:
        return None
    names = [n for n in ("burst_4topic", "burst_1topic", "burst_4topic_3x6", "burst_4topic_1broker")
             if any(r["workload"] == n for r in rows)]
    systems = [("at_least_once", "outbox_040"), ("one_connection", "outbox_040_1conn"), ("eos", "outbox_040_eos"),
               ("tuned", "tuned")]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        mine = sorted((r for r in rows if r["workload"] == name), key=lambda r: r["rtt_ms"])
        width = 0.8 / len(systems)
        for j, (key, system) in enumerate(systems):
            xs = [i + (j - (len(systems) - 1) / 2) * width for i in range(len(mine))]
            ys = [r.get(key) or 0 for r in mine]
            if not any(ys):
                continue
            ax.bar(xs, ys, width, color=COLORS[system], label=NAMES[system])
            if key == "eos":
                for x, y, r in zip(xs, ys, mine):
                    if r.get("extra_ms_per_batch") is not None:
                        ax.text(x, y, f"+{r['extra_ms_per_batch']:.0f} ms\n/batch", ha="center", va="bottom", fontsize=7)
        top = max((r.get(key) or 0) for r in mine for key, _ in systems)
        ax.set_ylim(0, top * 1.35)  # room for the legend above the bars
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([f"RTT {r['rtt_ms']} ms" for r in mine])
        ax.set_ylabel("events/s (median of runs)")
        shape = {"burst_4topic_3x6": "4 topics, 3 brokers x 6 partitions", "burst_4topic_1broker": "4 topics, one broker",
                 "burst_1topic": "1 topic"}.get(name, "4 topics, 3 brokers x 12 partitions")
        ax.set_title(f"Burst of {results['config']['burst_drain_events']:,} events, {shape}, one worker", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper right", ncol=2)
    fig.suptitle("outbox.delivery = exactly_once vs at-least-once and the tuned relay\n"
                 "(above its bar: exactly_once's extra time per batch over at-least-once)", fontsize=10)
    return _save(fig, out, "exactly_once.png")


STEP_COLORS = {"enqueue": "tab:blue", "write": "tab:blue", "publish": "tab:orange", "purge": "tab:red",
               "vacuum": "tab:gray"}
WAL_LABELS = {"outbox": "outbox 0.3.0", "outbox_040": "outbox 0.4.1\n(default)", "debezium": "Debezium pattern\n(INSERT + DELETE)", "plain": "plain INSERT"}


def wal_cost(results, out):
    """WAL bytes per event by step, per shape, for both checkpoint placements (stacked bars)."""
    summary = results.get("summary", {}).get("wal_cost") or {}
    if not summary:
        return None
    fig, axes = plt.subplots(1, len(summary), figsize=(5 * len(summary), 4.5), sharey=True, squeeze=False)
    titles = {"shape": "checkpoint before each shape", "steps": "checkpoint before every step"}
    for ax, (checkpoint, by_shape) in zip(axes[0], summary.items()):
        shapes = [s for s in ("outbox", "outbox_040", "debezium", "plain") if s in by_shape]
        labelled = set()
        for i, shape in enumerate(shapes):
            bottom = 0
            for step, value in by_shape[shape]["per_step"].items():
                name = "write (enqueue / INSERT)" if step in ("enqueue", "write") else step
                label = name if name not in labelled else None
                labelled.add(name)
                ax.bar(i, value, bottom=bottom, color=STEP_COLORS.get(step, "tab:purple"), label=label)
                bottom += value
            ax.text(i, bottom, f"{bottom:,.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([WAL_LABELS[s] for s in shapes], fontsize=8)
        ax.set_title(titles.get(checkpoint, checkpoint), fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("WAL bytes per event (median)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("What an event costs the primary in WAL", fontsize=10)
    skipped = (results.get("workloads", {}).get("wal_cost") or {}).get("skipped") or {}
    if skipped:
        # A skipped cell is said on the chart, not left out silently.
        fig.text(0.01, 0.005, "; ".join(f"{WAL_LABELS.get(k, k).replace(chr(10), ' ')}: skipped ({v.split(';')[0][:110]})"
                                        for k, v in skipped.items()), fontsize=7, color="dimgray")
    return _save(fig, out, "wal_cost.png")


def draw(results, out):
    return [p for p in (throughput(results, out), latency(results, out), memory(results, out),
                        table_health(results, out), burst(results, out), burst_drains(results, out),
                        exactly_once(results, out), wal_cost(results, out)) if p]
