"""Polling with a deadline: the tests never sleep in place of a condition."""

import time


class Timeout(AssertionError):
    pass


def wait_until(condition, timeout=30.0, what="condition", interval=0.05):
    """Calls condition() until it returns a truthy value, which is returned; fails after timeout s."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # a transient error (server restarting) counts as "not yet"
            last_error = e
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout}s waiting for {what}" +
                          (f" (last error: {last_error!r})" if last_error else ""))
        time.sleep(interval)
