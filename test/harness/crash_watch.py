"""Suite-wide crash watch: every PostgreSQL cluster a test starts (in the test process or in a
child process such as the bench or the chaos driver) is registered in a per-test directory named
by $OUTBOX_CRASH_WATCH_DIR. After the test, test/conftest.py reads every registration and fails
the test if a cluster's server log shows a crash that the test did not cause itself.

A crash is a log line with "terminated by signal", "was terminated by exception", "exited with
exit code N" for N >= 2 (the postmaster's own words for a child that died), "PANIC:" or "TRAP:".
Allowed: "terminated by signal 9" of a pid the test declared (PgCluster.kill_worker records the
pid it SIGKILLs; PgCluster.expect_killed declares one killed by someone else, e.g. the relay's
own test_crash_after_ack). An immediate stop is not a crash: the postmaster logs no child exit
for it. ERROR lines never fail a test (the relay logs expected ERRORs); they are counted and
shown in pytest's terminal summary."""

import json
import os
import re
import uuid

ENV = "OUTBOX_CRASH_WATCH_DIR"

# A child exit the postmaster reports (LogChildExit): the process name, its pid, what ended it.
CHILD_EXIT = re.compile(r"\(PID (\d+)\) (was terminated by signal (\d+)|was terminated by exception"
                        r"|exited with exit code (\d+))")
CRASH_WORDS = re.compile(r"terminated by signal|was terminated by exception|\bPANIC:|\bTRAP:")
# The message of an ERROR line, without the prefix (time, pid, backend type) that varies.
ERROR_LINE = re.compile(r"\bERROR:\s+(.*)")


def crashes(log_text, expected_kills=()):
    """The log lines that show a crash the test did not declare."""
    expected = {int(p) for p in expected_kills}
    found = []
    for line in log_text.splitlines():
        exit_ = CHILD_EXIT.search(line)
        if exit_:
            pid, signal_no, exit_code = int(exit_.group(1)), exit_.group(3), exit_.group(4)
            if signal_no == "9" and pid in expected:
                continue
            if exit_code is not None and int(exit_code) < 2:
                continue  # 0: clean exit; 1: FATAL or a worker asking to be restarted
            found.append(line)
        elif CRASH_WORDS.search(line):
            found.append(line)
    return found


def error_counts(log_text):
    """{ERROR message: how many times}, digits masked so repeats of one error count together."""
    counts = {}
    for line in log_text.splitlines():
        m = ERROR_LINE.search(line)
        if m:
            message = re.sub(r"\d+", "N", m.group(1))
            counts[message] = counts.get(message, 0) + 1
    return counts


class Registration:
    """One cluster's entry in the watch directory: its log, the kills the test declared and,
    once the cluster is cleaned up (its log deleted), the verdict taken from the log just before."""

    def __init__(self, log_path):
        directory = os.environ.get(ENV)
        self.path = os.path.join(directory, uuid.uuid4().hex + ".json") if directory else None
        self.data = {"log_path": log_path, "expected_kills": [], "verdict": None}
        self._write()

    def expect_killed(self, pid):
        self.data["expected_kills"].append(int(pid))
        self._write()

    def close(self, log_text):
        """Called before the log is deleted: keeps what the watch needs from it."""
        self.data["verdict"] = verdict(log_text, self.data["expected_kills"])
        self._write()

    def _write(self):
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.data, f)
            os.replace(tmp, self.path)


def verdict(log_text, expected_kills):
    return {"crashes": crashes(log_text, expected_kills), "errors": error_counts(log_text)}


def collect(directory):
    """Verdicts of every cluster registered in `directory`: [(log_path, verdict)]. A cluster not
    cleaned up yet is judged from its log as it is now."""
    out = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(directory, name)) as f:
            data = json.load(f)
        v = data["verdict"]
        if v is None:
            try:
                with open(data["log_path"], errors="replace") as f:
                    v = verdict(f.read(), data["expected_kills"])
            except FileNotFoundError:
                v = {"crashes": [], "errors": {}}  # never started
        out.append((data["log_path"], v))
    return out
