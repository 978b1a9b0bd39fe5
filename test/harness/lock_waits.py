"""Sessions that wait for a lock, for tests of lock waits: a statement run in a thread, and
whether a connection's backend is waiting for a heavyweight lock."""

import threading


def waiting_on_lock(pg, c):
    pid = c.info.backend_pid
    return pg.value("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,))


class InThread:
    """Runs statements on a connection in a thread (they are expected to wait for a lock)."""

    def __init__(self, c, *statements):
        self.error = None
        self.thread = threading.Thread(target=self.run, args=(c, statements), daemon=True)
        self.thread.start()

    def run(self, c, statements):
        try:
            for s in statements:
                c.execute(s)
        except Exception as e:  # reported by join(), or read by the test
            self.error = e

    def join(self):
        self.thread.join(60)
        assert not self.thread.is_alive(), "statement still running after 60 s"
        assert self.error is None, f"statement failed: {self.error!r}"
