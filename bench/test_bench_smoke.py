"""Smoke run of the benchmark suite: bench/run --quick (tiny sizes, a few minutes), so that the
bench does not rot. It asserts what the bench must always get right (every workload ran, nothing
lost, the outbox relay kept per-key order, the charts were drawn), never a timing.

test/run runs it after the integration tests; alone:
    /usr/bin/python3 -m pytest bench/test_bench_smoke.py -p no:cacheprovider
It needs what test/run sets up (packages, the extension built and installed)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import common  # noqa: E402  (PREVIEW: the ring version the bench's outbox_040 cells create)
WORKLOADS = {"burst_4topic", "burst_1topic", "burst_4topic_3x6", "burst_4topic_1broker", "drain", "hot_keys", "burst", "idle_latency", "enqueue_overhead",
             "memory", "table_health", "wal_cost"}
BURST_SYSTEMS = {"outbox", "tuned", "batched", "floor_delete", "floor_update", "floor_update2"}
# The 0.4.0 relay with the default outbox.kafka_connections, with 1, and with outbox.delivery =
# exactly_once (run, or skipped with a reason: exactly_once also when the installed relay has no
# outbox.delivery).
PREVIEW_SYSTEMS = {"outbox_040", "outbox_040_1conn", "outbox_040_eos"}
# burst_4topic runs every system; the other three shapes (their own topic and broker layouts)
# only what the headline compares, to keep the smoke short: each system's code is burst_4topic's.
SHAPE_SYSTEMS = {"outbox", "tuned", "floor_delete", "floor_update", "floor_update2"}
SHAPE_PREVIEW_SYSTEMS = {"outbox_040"}


def test_bench_quick_smoke(tmp_path):
    out = tmp_path / "bench-out"
    # The burst workloads at a smoke size (quick runs them at their real size otherwise).
    # table_health at a tiny size too (its real run is 30 minutes at 2,000 events/s).
    p = subprocess.run([str(BENCH / "run"), "--quick", "--no-setup", "--burst-events", "4000", "--health-minutes", "0.2",
                        "--health-rate", "300", "--health-systems", "outbox_040,outbox",
                        "--shape-systems", ",".join(sorted(SHAPE_SYSTEMS | SHAPE_PREVIEW_SYSTEMS)), "--out", str(out)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-8000:]
    results = json.loads((out / "results.json").read_text())
    assert results["errors"] == [], results["errors"]
    workloads = results["workloads"]
    assert set(workloads) == WORKLOADS

    # The flush check ran (its times are reported, not asserted), and the mock cluster every
    # timing ran against had TCP_NODELAY on each broker connection it accepted.
    fb = results["flushbench"]
    assert fb["nodelay_ms"] is not None and fb["stock_ms"] is not None, fb
    sockets = results["mock_sockets"]
    assert sockets["accepted"] > 0 and sockets["nodelay"] == sockets["accepted"], sockets

    # Every relay, every verified run: nothing lost, nothing left unpublished, nothing unexpected.
    runs = [r for name in ("burst_4topic", "burst_1topic", "burst_4topic_3x6", "burst_4topic_1broker", "drain", "hot_keys", "burst", "idle_latency")
            for r in workloads[name]]
    runs += workloads["memory"]["runs"]
    verified = [r for r in runs if r.get("verify")]
    assert len(verified) >= 20
    for r in verified:
        v = r["verify"]
        assert v["lost"] == 0 and v["unpublished_rows"] == 0 and v["unexpected"] == 0, (r["system"], v)
        assert v["unique"] == v["expected"], (r["system"], v)
        if r["system"].startswith("outbox"):
            assert v["duplicates"] == 0 and v["order_violation_keys"] == 0, (r["system"], v)
    assert {r["system"] for r in workloads["drain"]} >= {"outbox", "batched", "seed", "floor"}

    # The burst workloads: every relay and floor ran on burst_4topic, the headline's on the other
    # shapes (SHAPE_SYSTEMS), on 4 topics and on 1, loaded without
    # ANALYZE, and the outbox relay's delivery was read back from every topic of the run. The
    # 0.4.0 preview's relay (outbox_040, outbox_040_1conn, and outbox_040_eos with outbox.delivery =
    # exactly_once) ran too, or was skipped with a reason (the installed extension has no 0.4.0
    # script, or no outbox.delivery), and then in no burst workload.
    skipped = results["skipped"]
    for name, n_topics, partitions in (("burst_4topic", 4, 12), ("burst_1topic", 1, 12), ("burst_4topic_3x6", 4, 6),
                                       ("burst_4topic_1broker", 4, 12)):
        assert set(skipped.get(name, {})) <= PREVIEW_SYSTEMS, skipped
        systems, preview = (BURST_SYSTEMS, PREVIEW_SYSTEMS) if name == "burst_4topic" else (SHAPE_SYSTEMS,
                                                                                           SHAPE_PREVIEW_SYSTEMS)
        assert {r["system"] for r in workloads[name]} == systems | (preview - set(skipped.get(name, {}))), name
        for r in workloads[name]:
            assert r["partitions"] == partitions, r
            assert r["topics"] == n_topics and r["analyze"] is False and r["published"] == r["events"] == 4000, r
            assert r["analyzed_during_run"] == 0, r
            assert (r["verify"] is None) == r["system"].startswith("floor"), r
            if r["system"] == "outbox_040":
                # every event named once by outbox.landed, on the preview schema
                assert r["extversion"] == common.PREVIEW and r["landed_ids"] == r["landed_distinct_ids"] == 4000, r
                assert r["statements_profile"], r
            if r["system"] == "outbox_040_eos":
                # outbox.delivery = exactly_once: every event named once, each batch's prepared
                # record committed (none left), read back read_committed, the batches counted
                assert r["delivery"] == "exactly_once" and r["prepared_left"] == 0, r
                assert r["extversion"] == common.PREVIEW and r["landed_ids"] == r["landed_distinct_ids"] == 4000, r
                assert r["verify"]["isolation_level"] == "read_committed", r
                assert r["batches"] >= 1 and r["ms_per_batch"] > 0 and r["transactional_ids"], r
        for system, why in skipped.get(name, {}).items():
            assert why.strip(), (name, system, skipped)
    headline = results["summary"]["headline"]
    assert {(h["workload"], h["rtt_ms"]) for h in headline} == {
        ("burst_4topic", 5), ("burst_1topic", 5), ("burst_4topic_3x6", 5), ("burst_4topic_1broker", 5)}, headline
    # The one-broker shape ran on a cluster of one broker of its own, TCP_NODELAY on there too.
    one = results["mock_sockets_other"]["burst_4topic_1broker"]
    assert one["accepted"] > 0 and one["nodelay"] == one["accepted"], one
    assert all(h["outbox"] and h["tuned"] for h in headline), headline

    eo = workloads["enqueue_overhead"]
    assert eo["summary"]
    # The 0.4.0 preview's enqueue beside a plain INSERT in its database, or skipped with a reason.
    if "outbox_040" in (eo.get("skipped") or {}):
        assert eo["skipped"]["outbox_040"].strip() and "outbox_040" in skipped["enqueue_overhead"], eo["skipped"]
    else:
        assert all(row["outbox_040_latency_ms"] and row["plain_040_latency_ms"] for row in eo["summary"].values()), eo["summary"]
    # Interleaved: every pgbench run ran each variant's script, so each run gives each variant's
    # latency and an overhead within the run.
    assert all(x["transactions"] > 0 and x["latency_avg_ms"] > 0 for x in eo["runs"]), eo["runs"]
    for row in eo["summary"].values():
        assert len(row["overhead_pct_per_run"]) == row["runs"], row
    assert workloads["memory"]["memory"]["samples"] > 0 and workloads["memory"]["runs"]
    # Table health: its duration and rate are the parameters given, every event enqueued was
    # published (the workload waits for it), the sizes are summed over the extension's tables.
    # It ran on the 0.4.0 preview (the workload's record, first of --health-systems) and on
    # 0.3.0, or the preview was skipped with a reason (the installed extension has no 0.4.0
    # script); each system's run sampled the sizes, and the preview's its ring members too.
    th = workloads["table_health"]
    systems = {"outbox"}
    if "outbox_040" in skipped.get("table_health", {}):
        assert skipped["table_health"]["outbox_040"].strip(), skipped["table_health"]
    else:
        systems.add("outbox_040")
        assert th["system"] == "outbox_040" and th["extversion"] == common.PREVIEW, th["runs"]
    assert set(th["systems"]) == systems, th["systems"].keys()
    for name, x in th["systems"].items():
        assert x["system"] == name and x["seconds"] == 12 and x["rate"] == 300 and x["events"] > 0, x["runs"]
        assert x["samples"] and all(s["total_bytes"] > 0 and s["per_table"] for s in x["samples"]), (name, x["samples"])
        if name == "outbox_040":
            assert {"events_0", "landed", "event_state"} <= set(x["tables"]), x["tables"]
            assert all(1 <= s["members_nonempty"] <= 4 for s in x["samples"]), x["samples"]
        else:
            assert "events" in x["tables"], x["tables"]
    # The WAL cost: every shape under both checkpoint placements, each step's WAL counted, the
    # outbox's events all published and purged (the workload waits for both), the Debezium
    # pattern's table left with one dead tuple per event and the plain INSERT's with none.
    # The 0.4.0 preview cell ran under both placements, or was skipped with a reason (the
    # installed extension has no 0.4.0 script, or its relay did not publish in time).
    wal = workloads["wal_cost"]
    shapes = {"outbox", "debezium", "plain"}
    if "outbox_040" in wal["skipped"]:
        assert wal["skipped"]["outbox_040"].strip(), wal["skipped"]
        assert "outbox_040" not in {r["shape"] for r in wal["runs"]}
    else:
        shapes.add("outbox_040")
    assert set(wal["skipped"]) <= {"outbox_040"}, wal["skipped"]
    assert {(r["shape"], r["checkpoint"]) for r in wal["runs"]} == {
        (s, c) for s in shapes for c in ("shape", "steps")}, wal["runs"]
    for r in wal["runs"]:
        outbox = r["shape"].startswith("outbox")
        steps = {"enqueue", "publish", "purge", "vacuum"} if outbox else {"write", "vacuum"}
        # (0.4.0's purge deletes outbox.landed rows older than its argument only: maybe none)
        assert set(r["steps"]) == steps and all(st["wal_bytes"] > 0 for name, st in r["steps"].items()
                                                if (r["shape"], name) != ("outbox_040", "purge")), r
        assert r["index_inserts_per_event"] >= 1, r
        assert r["autovacuum"]["runs"] >= 0 and r["autovacuums"] >= 0, r
        if outbox:
            assert r["published"] == r["events"], r
        if r["shape"] == "outbox":
            assert r["extversion"] == "0.3.0" and r["deletes"] == r["events"], r
            # the record's old version and the purge's delete (fewer if autovacuum came by)
            assert 0 < r["dead_tuples_per_event"] <= 2.0, r
        elif r["shape"] == "outbox_040":
            assert r["extversion"] == common.PREVIEW, r
        else:
            assert r["dead_tuples_per_event"] == (1.0 if r["shape"] == "debezium" else 0.0), r
    assert results["summary"]["wal_cost"]["shape"]["outbox"]["wal_bytes_per_event_vs_debezium"] > 0
    assert {t["target"] for t in results["targets"]}
    # exactly_once beside at-least-once and the tuned relay (burst_4topic, RTT 5): its cost table and chart.
    if "outbox_040_eos" not in skipped.get("burst_4topic", {}):
        eos = results["summary"]["exactly_once"]
        assert [(h["workload"], h["rtt_ms"]) for h in eos] == [("burst_4topic", 5)], eos
        assert eos[0]["eos"] and eos[0]["tuned"] and eos[0]["ms_per_batch_eos"], eos
        assert (out / "exactly_once.png").stat().st_size > 0
    for chart in ("throughput.png", "latency.png", "memory.png", "table_health.png", "burst.png", "burst_drain.png",
                  "wal_cost.png"):
        assert (out / chart).stat().st_size > 0, chart
