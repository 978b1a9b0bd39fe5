"""The pytest side of the crash watch (harness/crash_watch.py): one autouse fixture for every
test (test/conftest.py and bench/conftest.py import it) and a terminal summary of ERROR lines."""

import os
import shutil
import tempfile

import pytest

from harness import crash_watch

ERRORS_SEEN = []  # (test id, {ERROR message: count}) for the terminal summary


@pytest.fixture(autouse=True)
def crash_watch_fixture(request):
    """Every cluster made during the test (here or in a child process: the variable is
    inherited) registers in this directory; afterwards, an undeclared crash fails the test."""
    directory = tempfile.mkdtemp(prefix="outbox-crash-watch-")
    os.chmod(directory, 0o777)
    previous = os.environ.get(crash_watch.ENV)
    os.environ[crash_watch.ENV] = directory
    try:
        yield
        verdicts = crash_watch.collect(directory)
    finally:
        if previous is None:
            os.environ.pop(crash_watch.ENV, None)
        else:
            os.environ[crash_watch.ENV] = previous
        shutil.rmtree(directory, ignore_errors=True)
    errors = {}
    for _, v in verdicts:
        for message, n in v["errors"].items():
            errors[message] = errors.get(message, 0) + n
    if errors:
        ERRORS_SEEN.append((request.node.nodeid, errors))
    crashed = [(log, v["crashes"]) for log, v in verdicts if v["crashes"]]
    if crashed:
        pytest.fail("server log shows a crash the test did not cause:\n" +
                    "\n".join(f"{log}:\n  " + "\n  ".join(lines[:20]) for log, lines in crashed),
                    pytrace=False)


def pytest_terminal_summary(terminalreporter):
    """ERROR lines do not fail a test (the relay logs expected ones), but are shown."""
    if not ERRORS_SEEN:
        return
    terminalreporter.section("server ERROR lines per test (not failures)")
    for nodeid, errors in ERRORS_SEEN:
        terminalreporter.write_line(nodeid)
        for message, n in sorted(errors.items(), key=lambda kv: -kv[1])[:8]:
            terminalreporter.write_line(f"  {n:5d} x {message[:150]}")
