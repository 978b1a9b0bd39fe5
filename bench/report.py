"""Summary (medians over runs), the issue's targets, and the printed tables."""

from common import median

LABEL = {"outbox": "outbox 0.3.0", "outbox_040": "outbox 0.4.1 (default)",
         "outbox_040_1conn": "outbox 0.4.0, kafka_connections = 1",
         "outbox_040_eos": "outbox 0.4.x exactly_once", "tuned": "tuned batched (ORDER BY id LIMIT 5000)",
         "batched": "naive batched (ORDER BY created_at LIMIT 200)", "seed": "seed-style",
         "floor": "SQL floor: the relay's own claim + record (jit=off)",
         "floor_delete": "SQL floor: claim + DELETE", "floor_update": "SQL floor: claim + 1 UPDATE",
         "floor_update2": "SQL floor: claim + 2 UPDATEs", "outbox_jit_off": "outbox, jit=off (diag.)"}
ORDER = list(LABEL)  # table rows: relays in LABEL's order
# The burst-drain workloads (bench.py BURST_TOPICS) and their titles.
BURSTS = {"burst_4topic": "Burst, 4 topics, no ANALYZE", "burst_1topic": "Burst, 1 topic, no ANALYZE",
          "burst_4topic_3x6": "Burst, 4 topics on 3 brokers x 6 partitions, 1,024 keys, no ANALYZE",
          "burst_4topic_1broker": "Burst, 4 topics, 12 partitions each on ONE broker, no ANALYZE"}
DRAINS = {**BURSTS, "drain": "Backlog drain (ANALYZEd)", "hot_keys": "Hot keys (ANALYZEd)"}


def _per_run(xs):
    """The overhead within each run (diagnostic beside the ratio of the medians)."""
    return ("; within each run: " + ", ".join(f"{x:.1f}%" for x in xs)) if xs else ""


def _sum(xs):
    return sum(x for x in xs if x is not None)


def _group(runs, *fields):
    groups = {}
    for r in runs:
        groups.setdefault(tuple(r[f] for f in fields), []).append(r)
    return groups


def _verify_totals(runs):
    vs = [r.get("verify") for r in runs if r.get("verify")]
    return {"lost": _sum(v["lost"] for v in vs), "duplicates": _sum(v["duplicates"] for v in vs),
            "order_violation_keys": _sum(v["order_violation_keys"] for v in vs),
            "unpublished_rows": _sum(v.get("unpublished_rows", 0) for v in vs),
            "unexpected": _sum(v.get("unexpected", 0) for v in vs), "verified_runs": len(vs)}


def summarize(results):
    w = results.get("workloads", {})
    rtt = results["config"]["rtt_ms"]
    summary = {}
    for name in DRAINS:
        rows = []
        for (system, workers, rt), runs in sorted(_group(w.get(name, []), "system", "workers", "rtt_ms").items(),
                                                  key=lambda kv: (ORDER.index(kv[0][0]) if kv[0][0] in ORDER else 99,
                                                                  kv[0][1], kv[0][2])):
            row = {"system": system, "workers": workers, "rtt_ms": rt, "runs": len(runs),
                   "rate_median": median([r["rate"] for r in runs]),
                   "rates": [r["rate"] for r in runs],
                   "events": runs[0]["events"], "published": [r["published"] for r in runs]}
            row.update(_verify_totals(runs))
            row["analyzed_during_run"] = _sum(r.get("analyzed_during_run") for r in runs)
            row["rate_observed_median"] = median([r.get("rate_observed") for r in runs])
            claims = [r["statements"]["claim"]["mean_ms"] for r in runs if r.get("statements")]
            records = [r["statements"]["record"]["mean_ms"] for r in runs if r.get("statements")]
            if claims:
                row["claim_ms_median"] = median(claims)
                row["record_ms_median"] = median(records)
            mems = [r["memory"]["peak_vmrss_mb"] for r in runs if r.get("memory")]
            if mems:
                row["peak_vmrss_mb"] = max(mems)
                row["peak_rss_anon_mb"] = max(r["memory"]["peak_rss_anon_mb"] for r in runs if r.get("memory"))
            # The preview's relays (outbox_040*): batches the workers recorded and time per batch,
            # over the drain and in each phase of the worker (outbox.worker_metrics).
            if any(r.get("batches") for r in runs):
                row["batches_median"] = median([r.get("batches") for r in runs])
                row["events_per_batch_median"] = median([r.get("events_per_batch") for r in runs])
                row["ms_per_batch_median"] = median([r.get("ms_per_batch") for r in runs])
                row["ms_per_batch_observed_median"] = median([r.get("ms_per_batch_observed") for r in runs])
                row["phase_ms_per_batch_median"] = {
                    phase: median([(r.get("phase_ms_per_batch") or {}).get(phase) for r in runs])
                    for phase in ("claim", "publish", "record")}
            rows.append(row)
        summary[name] = rows
    lat = []
    for system, runs in _group(w.get("idle_latency", []), "system").items():
        row = {"system": system[0], "runs": len(runs)}
        for f in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"):
            row[f] = median([r[f] for r in runs])
        row["max_ms_worst"] = max(r["max_ms"] for r in runs)
        row.update(_verify_totals(runs))
        lat.append(row)
    summary["idle_latency"] = lat
    summary["burst"] = [{k: v for k, v in r.items() if k != "backlog_timeline"} for r in w.get("burst", [])]
    eo = w.get("enqueue_overhead") or {}
    summary["enqueue_overhead"] = eo.get("summary")
    mem = w.get("memory")
    if mem:
        summary["memory"] = {"events": mem["events"], "rate": mem["rate"], **mem.get("memory", {}),
                             "table_size_mb": mem.get("table_size_mb"), "verify": mem.get("verify")}
    th = w.get("table_health")
    if th:
        summary["table_health"] = {k: v for k, v in th.items() if k not in ("samples", "systems")}
        summary["table_health"]["systems"] = {name: {k: v for k, v in x.items() if k not in ("samples", "runs")}
                                              for name, x in (th.get("systems") or {}).items()}
    summary["wal_cost"] = (w.get("wal_cost") or {}).get("summary")

    def drain_rate(system, workers=1, rt=rtt, name="drain"):
        for row in summary.get(name, []):
            if row["system"] == system and row["workers"] == workers and (row["rtt_ms"] == rt):
                return row["rate_median"], row["runs"]
        return None, 0

    targets = []

    quick = bool(results.get("meta", {}).get("quick"))

    def target(name, goal, measured, met, note="", runs=None, how=None):
        """runs: how many runs the measured number is the median of. The issue's targets are
        medians of at least 3 runs: with fewer (or in a --quick run) the verdict is "not judged"
        (met None). Correctness targets (nothing lost, order) pass runs=None: always judged."""
        if runs is not None and (quick or runs < 3):
            met = None
            note = (note + "; " if note else "") + f"not judged: {runs} run(s), targets need 3"
        elif runs is not None:
            note = (note + "; " if note else "") + (how or f"median of {runs} runs")
        targets.append({"target": name, "goal": goal, "measured": measured, "met": met, "note": note})

    headline = []
    for name, title in BURSTS.items():
        for rt in sorted({r["rtt_ms"] for r in summary.get(name, []) if r["system"] == "outbox"}):
            o, n_o = drain_rate("outbox", 1, rt, name)
            t, n_t = drain_rate("tuned", 1, rt, name)
            if o is None:
                continue
            seen = {x["system"]: x.get("rate_observed_median") for x in summary[name]
                    if x["workers"] == 1 and x["rtt_ms"] == rt}
            p, n_p = drain_rate("outbox_040", 1, rt, name)
            headline.append({"workload": name, "title": title, "rtt_ms": rt, "outbox": o, "tuned": t,
                             "ratio": round(o / t, 2) if o and t else None, "runs": min(n_o, n_t),
                             "rtt_vs_5ms": (lambda o5: round(o / o5, 2) if o5 else None)(drain_rate("outbox", 1, 5, name)[0]),
                             "outbox_observed": seen.get("outbox"), "tuned_observed": seen.get("tuned"),
                             # The 0.4.0 relay (the default version) on the same data set in the same run.
                             "outbox_040": p, "runs_040": n_p,
                             "ratio_040": round(p / t, 2) if p and t else None,
                             "rtt_vs_5ms_040": (lambda p5: round(p / p5, 2) if p and p5 else None)(
                                 drain_rate("outbox_040", 1, 5, name)[0]),
                             "outbox_040_observed": seen.get("outbox_040")})
            if rt == rtt and t:
                target(f"{title}: outbox 0.3.0 vs tuned batched relay, one worker (RTT {rt} ms)", ">= 3x",
                       f"{o / t:.2f}x ({o:.0f} vs {t:.0f} events/s)", o / t >= 3, runs=min(n_o, n_t))
            if rt == rtt and t and p:
                target(f"{title}: outbox 0.4.1 (default) vs tuned batched relay, one worker (RTT {rt} ms)", ">= 3x",
                       f"{p / t:.2f}x ({p:.0f} vs {t:.0f} events/s)", p / t >= 3, runs=min(n_p, n_t))
        for system, version in (("outbox", " 0.3.0"), ("outbox_040", " 0.4.1 (default)")):
            o5, n5 = drain_rate(system, 1, 5, name)
            o20, n20 = drain_rate(system, 1, 20, name)
            if o5 and o20:
                target(f"{title}: outbox{version} RTT 20 ms vs RTT 5 ms, one worker", ">= 80%",
                       f"{100 * o20 / o5:.0f}% ({o20:.0f} vs {o5:.0f} events/s)", o20 / o5 >= 0.8, runs=min(n5, n20))
        o2, n2 = drain_rate("outbox", 2, rtt, name)
        o1, n1 = drain_rate("outbox", 1, rtt, name)
        if o1 and o2:
            target(f"{title}: outbox 2 workers vs 1 (RTT {rtt} ms)", ">= 1.4x",
                   f"{o2 / o1:.2f}x ({o2:.0f} vs {o1:.0f} events/s)", o2 / o1 >= 1.4, runs=min(n1, n2))
    summary["headline"] = headline

    # outbox.delivery = exactly_once (issue 18 point 5): its rate against at-least-once (the same
    # relay, same run) and the tuned relay, and what it adds per batch: the drain's time per batch
    # (medians of runs) and the worker's publish and record phases per batch (exactly_once's record
    # phase holds the PREPARE, the Kafka commit and the COMMIT PREPARED; its publish phase the
    # transaction's AddPartitionsToTxn). kafka_connections = 1 (one producer, as exactly_once
    # has) separates the transaction's cost from the connections'.
    eos_rows = []

    def drain_row(system, rt, name):
        return next((x for x in summary.get(name, []) if x["system"] == system and x["workers"] == 1
                     and x["rtt_ms"] == rt), None)
    for name, title in BURSTS.items():
        for rt in sorted({r["rtt_ms"] for r in summary.get(name, []) if r["system"] == "outbox_040_eos"}):
            e, a, c, t = (drain_row(x, rt, name) for x in ("outbox_040_eos", "outbox_040", "outbox_040_1conn", "tuned"))
            if not e:
                continue

            def rate(x):
                return x["rate_median"] if x else None

            def per_batch(x, key="ms_per_batch_median"):
                return x.get(key) if x else None

            def phase(x, p):
                return (x.get("phase_ms_per_batch_median") or {}).get(p) if x else None

            def diff(x, y):
                return round(x - y, 2) if x is not None and y is not None else None

            def ratio(x, y):
                return round(x / y, 2) if x and y else None
            row = {"workload": name, "title": title, "rtt_ms": rt, "runs": e["runs"],
                   "eos": rate(e), "at_least_once": rate(a), "one_connection": rate(c), "tuned": rate(t),
                   "eos_observed": e.get("rate_observed_median"), "at_least_once_observed": a and a.get("rate_observed_median"),
                   "eos_vs_tuned": ratio(rate(e), rate(t)), "eos_vs_at_least_once": ratio(rate(e), rate(a)),
                   "eos_vs_one_connection": ratio(rate(e), rate(c)),
                   "batches_eos": e.get("batches_median"), "batches_at_least_once": a and a.get("batches_median"),
                   "events_per_batch_eos": e.get("events_per_batch_median"),
                   "ms_per_batch_eos": per_batch(e), "ms_per_batch_at_least_once": per_batch(a),
                   "ms_per_batch_one_connection": per_batch(c),
                   "extra_ms_per_batch": diff(per_batch(e), per_batch(a)),
                   "extra_ms_per_batch_vs_one_connection": diff(per_batch(e), per_batch(c)),
                   "extra_ms_per_batch_observed": diff(per_batch(e, "ms_per_batch_observed_median"),
                                                       per_batch(a, "ms_per_batch_observed_median")),
                   "phases_eos": e.get("phase_ms_per_batch_median"),
                   "phases_at_least_once": a and a.get("phase_ms_per_batch_median"),
                   "phases_one_connection": c and c.get("phase_ms_per_batch_median"),
                   "extra_record_ms_per_batch": diff(phase(e, "record"), phase(a, "record")),
                   "extra_publish_ms_per_batch": diff(phase(e, "publish"), phase(a, "publish")),
                   "extra_publish_ms_per_batch_vs_one_connection": diff(phase(e, "publish"), phase(c, "publish")),
                   "lost": e["lost"] + e["unpublished_rows"], "duplicates": e["duplicates"],
                   "order_violation_keys": e["order_violation_keys"], "verified_runs": e["verified_runs"]}
            eos_rows.append(row)
            if row["eos_vs_tuned"]:
                target(f"{title}: outbox 0.4.x exactly_once vs tuned batched relay, one worker (RTT {rt} ms)", ">= 2x",
                       f"{row['eos_vs_tuned']:.2f}x ({row['eos']:.0f} vs {row['tuned']:.0f} events/s)",
                       row["eos_vs_tuned"] >= 2, runs=min(e["runs"], t["runs"]))
    summary["exactly_once"] = eos_rows

    ours, n_ours = drain_rate("outbox")
    seed, n_seed = drain_rate("seed")
    batched, n_batched = drain_rate("batched")
    floor, n_floor = drain_rate("floor")
    if ours and seed:
        x = ours / seed
        target("one worker vs seed-style relay (RTT 5 ms)", ">= 300x", f"{x:.1f}x ({ours:.0f} vs {seed:.0f} events/s)",
               x >= 300, runs=min(n_ours, n_seed))
    if ours and batched:
        x = ours / batched
        target("one worker vs naive batched relay (ORDER BY created_at LIMIT 200), one worker (RTT 5 ms)", ">= 2x",
               f"{x:.2f}x ({ours:.0f} vs {batched:.0f} events/s)", x >= 2, runs=min(n_ours, n_batched))
    if ours and floor:
        x = ours / floor
        target("one worker vs SQL floor", ">= 70%", f"{100 * x:.0f}% ({ours:.0f} vs {floor:.0f} events/s)",
               x >= 0.7, runs=min(n_ours, n_floor))
    hot, n_hot = drain_rate("outbox", name="hot_keys")
    if ours and hot:
        x = hot / ours
        target("hot keys (10 keys) vs many keys (1,000), one worker", ">= 50%",
               f"{100 * x:.0f}% ({hot:.0f} vs {ours:.0f} events/s)", x >= 0.5, runs=min(n_ours, n_hot))
    ours_runs = [r for name in (*BURSTS, "drain", "hot_keys", "burst", "idle_latency") for r in w.get(name, [])
                 if r["system"].startswith("outbox")]
    if mem:
        ours_runs += mem.get("runs") or [mem]
    if ours_runs:
        t = _verify_totals(ours_runs)
        target("outbox relay: lost events (every verified run)", "0", str(t["lost"] + t["unpublished_rows"]),
               t["lost"] + t["unpublished_rows"] == 0, f"{t['verified_runs']} runs verified; duplicates {t['duplicates']}")
        target("outbox relay: per-key order violations (every verified run)", "0", str(t["order_violation_keys"]),
               t["order_violation_keys"] == 0)
    for row in lat:
        if row["system"] == "outbox":
            target(f"idle latency p50 (RTT {rtt} ms)", f"<= {rtt + 3} ms", f"{row['p50_ms']:.1f} ms",
                   row["p50_ms"] <= rtt + 3, runs=row["runs"])
            target(f"idle latency p99 (RTT {rtt} ms)", f"<= {rtt + 15} ms", f"{row['p99_ms']:.1f} ms",
                   row["p99_ms"] <= rtt + 15, f"max {row['max_ms_worst']:.1f} ms", runs=row["runs"])
    for clients, row in (summary.get("enqueue_overhead") or {}).items():
        if row.get("overhead_pct") is not None:
            target(f"enqueue overhead, {clients} client(s), 0.3.0", "<= 10%", f"{row['overhead_pct']:.1f}%",
                   row["overhead_pct"] <= 10, _enqueue_note(row, "") + _per_run(row.get("overhead_pct_per_run")),
                   runs=row.get("runs"))
        if row.get("overhead_040_pct") is not None:
            target(f"enqueue overhead, {clients} client(s), 0.4.1 (default)", "<= 10%",
                   f"{row['overhead_040_pct']:.1f}%", row["overhead_040_pct"] <= 10,
                   _enqueue_note(row, "_040") + _per_run(row.get("overhead_040_pct_per_run")), runs=row.get("runs"))
    if mem and mem.get("memory"):
        m = mem["memory"]
        n_mem = len(mem.get("runs") or [mem])
        worst = max(r["peak_vmrss_mb"] for r in mem["runs"]) if mem.get("runs") else m["peak_vmrss_mb"]
        how = f"the run with the median VmRSS of {n_mem} runs (run {mem.get('run', 0)})"
        target(f"worker RSS (VmRSS) on the {mem['events']:,}-event backlog", "< 64 MB",
               f"{m['peak_vmrss_mb']} MB", m["peak_vmrss_mb"] < 64,
               f"of which {m['peak_rss_shmem_mb']} MB PostgreSQL shared memory (RssShmem: shared_buffers and "
               f"the other shared structures); worst run {worst} MB", runs=n_mem, how=how)
        target(f"worker memory outside shared memory (RssAnon + RssFile) on the {mem['events']:,}-event backlog",
               "< 64 MB", f"{m['peak_private_mb']} MB", m["peak_private_mb"] < 64,
               f"anon (private) {m['peak_rss_anon_mb']} MB + file-backed (binaries, libraries) "
               f"{m['peak_rss_file_mb']} MB", runs=n_mem, how=how)
    for name, x in ((th.get("systems") or {"": th}).items() if th else ()):
        if x.get("growth_last_vs_middle_pct") is None:
            continue
        growths = [r["growth_last_vs_middle_pct"] for r in x.get("runs") or [x]
                   if r.get("growth_last_vs_middle_pct") is not None]
        version = {"outbox_040": ", 0.4.1 (default)", "outbox": ", 0.3.0"}.get(name, "")
        # Stopped growing = in every run, the last third's peak size is within 5% of the middle
        # third's (the bench's threshold; a median could hide a run that is still growing).
        target(f"table + index size under steady load with retention{version}", "stops growing",
               "growth of the peak size, middle -> last third, per run: " + ", ".join(f"{g:+.1f}%" for g in growths),
               all(g <= 5 for g in growths),
               "met = within 5% in every run (the bench's threshold); the chart's run: "
               f"{x['peak_total_mb_middle_third']} -> {x['peak_total_mb_last_third']} MB",
               runs=len(growths), how=f"{len(growths)} runs")
    for checkpoint, row in (summary.get("wal_cost") or {}).items():
        for shape, version in (("outbox", ", 0.3.0"), ("outbox_040", ", 0.4.1 (default)")):
            o, d = row.get(shape), row.get("debezium")
            if o and d:
                x = o["wal_bytes_per_event"] / d["wal_bytes_per_event"]
                target(f"WAL bytes per event, end to end, vs the Debezium outbox pattern ({WAL_CHECKPOINTS[checkpoint]}"
                       f"{version})",
                       "<= 1.25x", f"{x:.2f}x ({o['wal_bytes_per_event']:.0f} vs {d['wal_bytes_per_event']:.0f} B/event)",
                       x <= 1.25, f"with the VACUUM of the dead tuples: {o['wal_bytes_per_event_with_vacuum']:.0f} vs "
                       f"{d['wal_bytes_per_event_with_vacuum']:.0f} B/event", runs=min(o["runs"], d["runs"]))
    summary["wal_cost_skipped"] = (w.get("wal_cost") or {}).get("skipped") or {}
    summary["skipped"] = results.get("skipped") or {}
    # Diagnostics, not targets: the same comparisons with JIT off (see RESULTS.md).
    diag = []
    ours_nojit, _ = drain_rate("outbox_jit_off")
    hot_nojit, _ = drain_rate("outbox_jit_off", name="hot_keys")
    if ours_nojit:
        if seed:
            diag.append(f"jit=off: one worker {ours_nojit:.0f} events/s = {ours_nojit / seed:.1f}x the seed-style relay")
        if batched:
            diag.append(f"jit=off: one worker = {ours_nojit / batched:.2f}x the batched relay")
        if floor:
            diag.append(f"jit=off: one worker = {100 * ours_nojit / floor:.0f}% of the SQL floor")
        if hot_nojit:
            diag.append(f"jit=off: hot keys {hot_nojit:.0f} events/s = {100 * hot_nojit / ours_nojit:.0f}% of many keys")
    if floor and seed:
        diag.append(f"SQL floor = {floor / seed:.0f}x the seed-style relay (the most any relay running these "
                    f"statements one batch at a time could reach)")
    for name, title in BURSTS.items():
        o, _ = drain_rate("outbox", 1, rtt, name)
        for f in ("floor_delete", "floor_update", "floor_update2"):
            fl, _ = drain_rate(f, 1, 0, name)
            if o and fl:
                diag.append(f"{title}: outbox one worker (RTT {rtt} ms) = {100 * o / fl:.0f}% of {LABEL[f]} "
                            f"({fl:.0f} events/s)")
    summary["diagnostics"] = diag
    return summary, targets


WAL_CHECKPOINTS = {"shape": "a checkpoint before each shape", "steps": "a checkpoint before every step and mid-write"}
WAL_SHAPES = {"outbox": "outbox 0.3.0 (enqueue, relay, purge)", "outbox_040": "outbox 0.4.1, the default (enqueue, relay, purge)", "debezium": "Debezium outbox pattern (INSERT + DELETE)",
              "plain": "plain INSERT, bigint primary key"}
WAL_HEADERS = ["checkpoint", "shape", "runs", "WAL B/event", "per step", "+ VACUUM", "vs Debezium",
               "FPI/event", "index inserts/event", "heap updates/event", "dead tuples/event", "autovacuums",
               "autovacuum pages scanned / 1,000 events", "VACUUM step pages scanned / 1,000 events"]


def wal_rows(s):
    rows = []
    for checkpoint, by_shape in (s.get("wal_cost") or {}).items():
        for shape, r in by_shape.items():
            rows.append([checkpoint, WAL_SHAPES.get(shape, shape), r["runs"], _fmt(r["wal_bytes_per_event"]),
                         ", ".join(f"{k} {_fmt(v)}" for k, v in r["per_step"].items()),
                         _fmt(r["wal_bytes_per_event_with_vacuum"]),
                         f"{r['wal_bytes_per_event_vs_debezium']:.2f}x" if "wal_bytes_per_event_vs_debezium" in r else "",
                         _fmt(r["fpi_per_event"], 3), _fmt(r["index_inserts_per_event"], 2),
                         _fmt(r["heap_updates_per_event"], 2), _fmt(r["dead_tuples_per_event"], 2),
                         _fmt(r["autovacuums"]), _fmt(r.get("autovacuum_pages_scanned_per_1000_events"), 1),
                         _fmt(r.get("vacuum_pages_scanned_per_1000_events"), 1)])
    return rows


EOS_HEADERS = ["workload", "RTT ms", "runs", "exactly_once events/s", "at-least-once events/s",
               "kafka_connections = 1 events/s", "tuned events/s", "eos vs tuned (target >= 2x)",
               "eos vs at-least-once", "eos vs 1 connection", "seen drained from outside: eos / at-least-once",
               "batches (eos / at-least-once)", "ms per batch: eos / at-least-once / 1 conn.",
               "extra ms per batch vs at-least-once (vs 1 conn.)",
               "publish ms per batch: eos / at-least-once / 1 conn.", "record ms per batch: eos / at-least-once",
               "lost / dup / order-viol. keys (eos)"]


def _x(v):
    return f"{v:.2f}x" if v else "-"


def _ms(v):
    return f"{v:.1f}" if v is not None else "-"


def eos_rows(s):
    out = []
    for h in s.get("exactly_once") or []:
        pe, pa, pc = (h.get(k) or {} for k in ("phases_eos", "phases_at_least_once", "phases_one_connection"))
        out.append([h["title"], h["rtt_ms"], h["runs"], _fmt(h["eos"]), _fmt(h["at_least_once"]),
                    _fmt(h["one_connection"]), _fmt(h["tuned"]), _x(h["eos_vs_tuned"]), _x(h["eos_vs_at_least_once"]),
                    _x(h["eos_vs_one_connection"]),
                    f"{_fmt(h.get('eos_observed'))} / {_fmt(h.get('at_least_once_observed'))}",
                    f"{_fmt(h['batches_eos'])} / {_fmt(h['batches_at_least_once'])}",
                    f"{_ms(h['ms_per_batch_eos'])} / {_ms(h['ms_per_batch_at_least_once'])} / "
                    f"{_ms(h['ms_per_batch_one_connection'])}",
                    f"{_ms(h['extra_ms_per_batch'])} ({_ms(h['extra_ms_per_batch_vs_one_connection'])})",
                    f"{_ms(pe.get('publish'))} / {_ms(pa.get('publish'))} / {_ms(pc.get('publish'))}",
                    f"{_ms(pe.get('record'))} / {_ms(pa.get('record'))}",
                    f"{h['lost']} / {h['duplicates']} / {h['order_violation_keys']}" if h["verified_runs"] else "-"])
    return out


EOS_TITLE = ("outbox.delivery = exactly_once: throughput and cost per batch, one worker (events/s and ms, medians "
             "of runs; ms per batch = drain time / batches; phases from outbox.worker_metrics)")

HEADLINE_HEADERS = ["workload", "RTT ms", "runs", "outbox 0.3.0 events/s", "tuned batched events/s", "0.3.0 vs tuned (target >= 3x)",
                    "seen drained from outside: 0.3.0 / tuned", "0.3.0 vs its RTT 5 ms (target at 20 ms >= 80%)",
                    "0.4.1 (default) events/s", "0.4.1 vs tuned (target >= 3x)", "0.4.1 vs its RTT 5 ms"]


def _pct(x):
    return f"{100 * x:.0f}%" if x else "-"


def headline_rows(s):
    return [[h["title"], h["rtt_ms"], h["runs"], _fmt(h["outbox"]), _fmt(h["tuned"]),
             f"{h['ratio']:.2f}x" if h["ratio"] else "-",
             f"{_fmt(h.get('outbox_observed'))} / {_fmt(h.get('tuned_observed'))}", _pct(h.get("rtt_vs_5ms")),
             _fmt(h.get("outbox_040")), f"{h['ratio_040']:.2f}x" if h.get("ratio_040") else "-",
             _pct(h.get("rtt_vs_5ms_040"))] for h in s["headline"]]


ENQUEUE_HEADERS = ["clients", "INSERT + plain INSERT", "INSERT + outbox.enqueue()", "overhead",
                   "diag.: INSERT + INSERT into a copy of outbox.events", "its overhead",
                   "0.4.1 db: INSERT + plain INSERT", "INSERT + outbox.enqueue() (0.4.1)", "0.4.1 overhead",
                   "diag.: INSERT + INSERT into the 0.4.1 ring member", "its overhead"]


def _enqueue_note(row, suffix):
    """What the overhead was taken from: the scripts' latencies in interleaved pgbench runs (the
    method since 2026-12-07), or, in older saved runs, the variants' tps in runs of their own."""
    if row.get(f"plain{suffix}_latency_ms") is not None:
        return (f"{row[f'outbox{suffix}_latency_ms']:.3f} vs {row[f'plain{suffix}_latency_ms']:.3f} ms per "
                f"transaction, interleaved")
    return f"{row[f'outbox{suffix}_tps']:.0f} vs {row[f'plain{suffix}_tps']:.0f} tps"


def _enqueue_cell(row, variant, suffix):
    """A variant's latency (ms per transaction, interleaved runs) or, in older saved runs, its tps."""
    if row.get(f"{variant}{suffix}_latency_ms") is not None:
        return f"{row[f'{variant}{suffix}_latency_ms']:.3f} ms"
    return _fmt(row.get(f"{variant}{suffix}_tps"))


def _pct(value):
    return f"{value:.1f}%" if value is not None else "-"


def enqueue_heading(s):
    """The table's heading: how its saved run measured (interleaved since 2026-12-07, tps before)."""
    if any(r.get("method") == "interleaved" for r in s["enqueue_overhead"].values()):
        return "Enqueue overhead (pgbench, interleaved scripts: latency per transaction, median of runs)"
    return "Enqueue overhead (pgbench tps, variants run one after another, median of runs)"


def enqueue_rows(s):
    return [[c, _enqueue_cell(r, "plain", ""), _enqueue_cell(r, "outbox", ""), _pct(r.get("overhead_pct")),
             _enqueue_cell(r, "shape", ""), _pct(r.get("shape_overhead_pct")),
             _enqueue_cell(r, "plain", "_040"), _enqueue_cell(r, "outbox", "_040"), _pct(r.get("overhead_040_pct")),
             _enqueue_cell(r, "shape", "_040"), _pct(r.get("shape_040_overhead_pct"))]
            for c, r in s["enqueue_overhead"].items()]


def skipped_lines(s):
    return [f"{workload} {LABEL.get(system, system)}: skipped: {reason}"
            for workload, systems in (s.get("skipped") or {}).items() for system, reason in systems.items()]


def wal_skipped(s):
    return [f"{WAL_SHAPES.get(shape, shape)}: skipped: {reason}" for shape, reason in
            (s.get("wal_cost_skipped") or {}).items()]


def _verdict(met, no):
    return "not judged" if met is None else ("yes" if met else no)


def _fmt(x, nd=0):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def table(headers, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    lines = ["  ".join(str(h).ljust(wd) for h, wd in zip(headers, widths)),
             "  ".join("-" * wd for wd in widths)]
    for r in rows:
        lines.append("  ".join(str(c).rjust(wd) if i else str(c).ljust(wd)
                               for i, (c, wd) in enumerate(zip(r, widths))))
    return "\n".join(lines)


def print_tables(results):
    s = results.get("summary", {})
    fb = results.get("flushbench") or {}
    print()
    print("== Mock cluster check (test/mockbroker/flushbench)")
    print(fb.get("output", "-"))
    if s.get("headline"):
        print()
        print("== Headline: outbox vs the tuned batched relay, one worker (events/s, median of runs)")
        print(table(HEADLINE_HEADERS, headline_rows(s)))
    if s.get("exactly_once"):
        print()
        print(f"== {EOS_TITLE}")
        print(table(EOS_HEADERS, eos_rows(s)))
    for name, title in DRAINS.items():
        rows = s.get(name) or []
        if not rows:
            continue
        print()
        print(f"== {title} (events/s; median of runs)")
        print(table(["relay", "workers", "RTT ms", "runs", "events/s", "claim ms", "record ms", "lost", "dup",
                     "order-viol. keys", "peak RSS MB"],
                    [[LABEL[r["system"]], r["workers"], r["rtt_ms"], r["runs"], _fmt(r["rate_median"]),
                      _fmt(r.get("claim_ms_median"), 1), _fmt(r.get("record_ms_median"), 1),
                      r["lost"] + r["unpublished_rows"] if r["verified_runs"] else "-",
                      r["duplicates"] if r["verified_runs"] else "-",
                      r["order_violation_keys"] if r["verified_runs"] else "-", _fmt(r.get("peak_vmrss_mb"), 1)]
                     for r in rows]))
    if s.get("burst"):
        print()
        print("== Renewal burst (one worker)")
        print(table(["relay", "events", "offered/s", "time to empty s", "worst delay ms", "p99 delay ms",
                     "peak backlog", "lost", "dup", "order-viol. keys"],
                    [[LABEL[r["system"]], r["events"], _fmt(r["offered_rate"]), _fmt(r["time_to_empty_s"], 2),
                      _fmt(r["worst_delay_ms"], 0), _fmt(r["p99_delay_ms"], 0), r["peak_backlog"],
                      r["verify"]["lost"] + r["verify"]["unpublished_rows"], r["verify"]["duplicates"],
                      r["verify"]["order_violation_keys"]] for r in s["burst"]]))
    if s.get("idle_latency"):
        print()
        print("== Idle-queue latency, commit -> broker ack (ms; median of runs)")
        print(table(["relay", "runs", "p50", "p90", "p99", "max", "lost", "dup", "order-viol. keys"],
                    [[LABEL[r["system"]], r["runs"], _fmt(r["p50_ms"], 1), _fmt(r["p90_ms"], 1),
                      _fmt(r["p99_ms"], 1), _fmt(r["max_ms_worst"], 1), r["lost"] + r["unpublished_rows"],
                      r["duplicates"], r["order_violation_keys"]] for r in s["idle_latency"]]))
    if s.get("wal_cost"):
        print()
        print("== What an event costs the primary: WAL, index writes, dead tuples (median of runs)")
        print(table(WAL_HEADERS, wal_rows(s)))
        for line in wal_skipped(s):
            print(line)
    if s.get("enqueue_overhead"):
        print()
        print(f"== {enqueue_heading(s)}")
        print(table(ENQUEUE_HEADERS, enqueue_rows(s)))
    if s.get("memory"):
        m = s["memory"]
        print()
        print(f"== Memory: {m['events']:,}-event backlog drained at {_fmt(m['rate'])} events/s; worker peak VmRSS "
              f"{m.get('peak_vmrss_mb')} MB = outside shared memory {m.get('peak_private_mb')} MB + shared memory "
              f"{m.get('peak_rss_shmem_mb')} MB (the run with the median VmRSS)")
    if s.get("table_health"):
        t = s["table_health"]
        for name, x in (t.get("systems") or {"": t}).items():
            print(f"== Table health{' ' + name if name else ''}: {x['events']:,} events at {x['rate']}/s (achieved "
                  f"{x.get('achieved_rate')}/s), retention {x['retention']}: peak table+index "
                  f"{x['peak_total_mb_middle_third']} MB (middle third) -> {x['peak_total_mb_last_third']} MB "
                  f"(last third), growth {x.get('growth_last_vs_middle_pct')} %")
    if skipped_lines(s):
        print()
        print("== Skipped cells")
        for line in skipped_lines(s):
            print(line)
    if results.get("targets"):
        print()
        print("== Targets")
        print(table(["target", "goal", "measured", "met", "note"],
                    [[t["target"], t["goal"], t["measured"], _verdict(t["met"], "NO"), t["note"]]
                     for t in results["targets"]]))
    if s.get("diagnostics"):
        print()
        print("== Diagnostics (not targets)")
        for d in s["diagnostics"]:
            print("  " + d)
    if results.get("errors"):
        print()
        print("== ERRORS")
        for e in results["errors"]:
            print(f"{e.get('workload') or e.get('cell')}: {e['error']}")


def _md(headers, rows):
    out = ["| " + " | ".join(str(h) for h in headers) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def markdown(results):
    """The same tables as print_tables, in Markdown (written to tables.md for RESULTS.md)."""
    s = results.get("summary", {})
    parts = []
    if s.get("headline"):
        parts.append("### Headline: outbox vs the tuned batched relay, one worker\n\n" + _md(
            HEADLINE_HEADERS, headline_rows(s)))
    if s.get("exactly_once"):
        parts.append(f"### {EOS_TITLE}\n\n" + _md(EOS_HEADERS, eos_rows(s)))
    for name, title in DRAINS.items():
        rows = s.get(name) or []
        if rows:
            parts.append(f"### {title}\n\n" + _md(
                ["relay", "workers", "RTT ms", "runs", "events/s (median)", "all runs", "claim ms", "record ms",
                 "lost", "dup", "order-violating keys"],
                [[LABEL[r["system"]], r["workers"], r["rtt_ms"], r["runs"], _fmt(r["rate_median"]),
                  " / ".join(_fmt(x) for x in r["rates"]),
                  _fmt(r.get("claim_ms_median"), 1), _fmt(r.get("record_ms_median"), 1),
                  r["lost"] + r["unpublished_rows"] if r["verified_runs"] else "-",
                  r["duplicates"] if r["verified_runs"] else "-",
                  r["order_violation_keys"] if r["verified_runs"] else "-"] for r in rows]))
    if s.get("burst"):
        parts.append("### Renewal burst\n\n" + _md(
            ["relay", "events", "offered/s", "time to empty s", "worst delay ms", "p50 delay ms", "p99 delay ms",
             "peak backlog", "lost", "dup", "order-violating keys"],
            [[LABEL[r["system"]], _fmt(r["events"]), _fmt(r["offered_rate"]), _fmt(r["time_to_empty_s"], 2),
              _fmt(r["worst_delay_ms"], 0), _fmt(r["p50_delay_ms"], 0), _fmt(r["p99_delay_ms"], 0),
              _fmt(r["peak_backlog"]), r["verify"]["lost"] + r["verify"]["unpublished_rows"],
              r["verify"]["duplicates"], r["verify"]["order_violation_keys"]] for r in s["burst"]]))
    if s.get("idle_latency"):
        parts.append("### Idle-queue latency (commit -> broker ack, ms)\n\n" + _md(
            ["relay", "runs", "p50", "p90", "p99", "max (worst run)", "lost", "dup", "order-violating keys"],
            [[LABEL[r["system"]], r["runs"], _fmt(r["p50_ms"], 1), _fmt(r["p90_ms"], 1), _fmt(r["p99_ms"], 1),
              _fmt(r["max_ms_worst"], 1), r["lost"] + r["unpublished_rows"], r["duplicates"],
              r["order_violation_keys"]] for r in s["idle_latency"]]))
    if s.get("wal_cost"):
        parts.append("### What an event costs the primary (WAL, index writes, dead tuples; median)\n\n" +
                     _md(WAL_HEADERS, wal_rows(s)) + "".join(f"\n\n{line}" for line in wal_skipped(s)))
    if s.get("enqueue_overhead"):
        parts.append(f"### {enqueue_heading(s)}\n\n" + _md(ENQUEUE_HEADERS, enqueue_rows(s)))
    if skipped_lines(s):
        parts.append("### Skipped cells\n\n" + "\n".join(f"- {line}" for line in skipped_lines(s)))
    if results.get("targets"):
        parts.append("### Targets\n\n" + _md(
            ["target", "goal", "measured", "met", "note"],
            [[t["target"], t["goal"], t["measured"], _verdict(t["met"], "**no**"), t["note"]]
             for t in results["targets"]]))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    # Re-derives the summary, targets and tables.md of a saved run (e.g. after a change of how a
    # target is judged): python3 bench/report.py bench/results
    import json
    import sys
    from pathlib import Path
    out = Path(sys.argv[1])
    results = json.loads((out / "results.json").read_text())
    results["summary"], results["targets"] = summarize(results)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "tables.md").write_text(markdown(results))
    print_tables(results)
