"""The short chaos run (test/chaos/chaos.py): writers in business transactions while relay
workers are SIGKILLed, Postgres is stopped -m immediate and restarted, every broker goes down and
up and produce requests fail with retriable errors. Nothing committed is lost, nothing
uncommitted is published, per (topic, key) first deliveries keep commit order, nothing fails.

The seed is drawn and printed (CHAOS REPORT line); OUTBOX_CHAOS_SEED=N replays one. The long run
is a command of its own: test/chaos/run --minutes 30 --cycles 100 --seed N (docs/chaos.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

CHAOS = Path(__file__).resolve().parent / "chaos" / "chaos.py"


def test_short_chaos_run_loses_nothing_and_keeps_order():
    args = [sys.executable, str(CHAOS), "--seconds", "60", "--cycles", "5"]
    if os.environ.get("OUTBOX_CHAOS_SEED"):
        args += ["--seed", os.environ["OUTBOX_CHAOS_SEED"]]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    print(p.stdout[-6000:])
    lines = [line for line in p.stdout.splitlines() if line.startswith("CHAOS REPORT ")]
    assert lines, "no report: the chaos run did not finish\n" + p.stdout[-6000:]
    report = json.loads(lines[-1][len("CHAOS REPORT "):])
    summary = {k: report[k] for k in ("seed", "lost", "phantom", "acked_sync_lost", "rolled_back_in_kafka",
                                      "order_violations", "failed")}
    assert report["lost"] == 0 and report["phantom"] == 0 and report["acked_sync_lost"] == 0, summary
    assert report["rolled_back_in_kafka"] == 0 and report["order_violations"] == 0, summary
    assert report["failed"] == 0, summary
    assert report["committed"] > 0 and sum(report["faults"].values()) == 5, report
    assert p.returncode == 0, p.stdout[-3000:]


def test_chaos_judge_sees_loss_phantoms_disorder_and_lost_acks():
    sys.path.insert(0, str(CHAOS.parent))
    from chaos import judge

    def value(key, seq):
        return json.dumps({"key": key, "seq": seq})

    rows = [("e1", "t", 1, "published"), ("e2", "t", 2, "published"), ("e3", "t", 3, "published"),
            ("e4", "t", 1, "failed")]
    records = {"t": [(0, 0, "e1", value("k", 1)), (0, 1, "e3", value("k", 3)), (0, 2, "e2", value("k", 2)),
                     (0, 3, "e1", value("k", 1)), (1, 0, "x9", value("j", 1))]}
    r = judge(rows, records, acked_sync={"e1", "gone"}, acked_async={"e2"}, rolled_back={"x9"})
    assert (r["lost"], r["phantom"], r["duplicates"], r["order_violations"], r["failed"]) == (1, 1, 1, 1, 1)
    assert r["acked_sync_lost"] == 1 and r["rolled_back_in_kafka"] == 1 and not r["ok"]
    in_order = {"t": [(0, 0, "e1", value("k", 1)), (0, 1, "e2", value("k", 2)), (0, 2, "e3", value("k", 3)),
                      (0, 3, "e2", value("k", 2))]}  # a resend after a crash: counted, allowed
    clean = judge(rows[:3], in_order, acked_sync={"e1"}, acked_async=set(), rolled_back=set())
    assert clean["ok"] and clean["duplicates"] == 1 and clean["order_violations"] == 0
