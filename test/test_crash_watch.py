"""The suite-wide crash watch (harness/crash_watch.py) itself: it must see a crash, allow the
SIGKILLs a test declared, and take an immediate stop for a stop."""

import os
import signal

from harness import crash_watch
from harness.pg_cluster import PgCluster
from harness.wait import wait_until

LOG = """\
2026-12-01 08:00:00.000 UTC [100] postmaster LOG:  background worker "outbox relay 0" (PID 4242) was terminated by signal 9: Killed
2026-12-01 08:00:00.000 UTC [100] postmaster LOG:  background worker "outbox relay 1" (PID 4243) was terminated by signal 11: Segmentation fault
2026-12-01 08:00:00.000 UTC [100] postmaster LOG:  server process (PID 4244) exited with exit code 2
2026-12-01 08:00:00.000 UTC [100] postmaster LOG:  background worker "outbox relay 2" (PID 4245) exited with exit code 1
2026-12-01 08:00:00.000 UTC [4246] outbox relay PANIC:  could not write to file
TRAP: FailedAssertion("false", File: "worker.cpp", Line: 1, PID: 4247)
2026-12-01 08:00:00.000 UTC [4248] client backend ERROR:  invalid input syntax for type uuid: "x1"
2026-12-01 08:00:00.000 UTC [4249] client backend ERROR:  invalid input syntax for type uuid: "x2"
"""


def test_crash_lines_are_found_and_declared_kills_allowed():
    found = crash_watch.crashes(LOG)
    assert [line.split("] ")[-1] if "] " in line else line for line in found] == [
        'postmaster LOG:  background worker "outbox relay 0" (PID 4242) was terminated by signal 9: Killed',
        'postmaster LOG:  background worker "outbox relay 1" (PID 4243) was terminated by signal 11: Segmentation fault',
        "postmaster LOG:  server process (PID 4244) exited with exit code 2",
        "outbox relay PANIC:  could not write to file",
        'TRAP: FailedAssertion("false", File: "worker.cpp", Line: 1, PID: 4247)',
    ]
    # A declared SIGKILL is allowed; a declared pid does not excuse another signal.
    assert len(crash_watch.crashes(LOG, expected_kills=[4242, 4243])) == 4
    assert crash_watch.error_counts(LOG) == {'invalid input syntax for type uuid: "xN"': 2}


def test_real_undeclared_kill_is_seen_and_immediate_stop_is_not(tmp_path):
    with PgCluster(create_extension=False) as pg:
        pg.sql("SELECT 1")
        pg.stop("immediate")
        pg.start()
        assert crash_watch.crashes(pg.log()) == []
        with pg.connect() as victim:
            pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: f"(PID {pid}) was terminated by signal 9" in pg.log(), 30, "kill logged")
        assert len(crash_watch.crashes(pg.log())) == 1
        pg.expect_killed(pid)  # declared: the suite's watch lets this test pass
        wait_until(lambda: pg.value("SELECT 1") == 1, 60, "recovered")
        assert crash_watch.crashes(pg.log(), pg.watch.data["expected_kills"]) == []
