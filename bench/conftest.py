"""The bench's smoke test runs under the suite's crash watch too: the bench's clusters run in a
child process, which registers them through the inherited $OUTBOX_CRASH_WATCH_DIR."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test"))

from harness.crash_watch_pytest import crash_watch_fixture  # noqa: E402,F401
