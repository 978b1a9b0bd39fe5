"""outbox.batch_linger: a relay worker that took everything its claim could see claims again no
sooner than the linger after that claim began, so that the events of the commits made meanwhile
share one batch (one landed row per partition, one cursor update, one commit). A worker behind
(a claim cut by batch_size) claims again at once; the first commit after an idle spell wakes the
worker at once; SIGTERM ends a linger.

The lingers here are long (tens of seconds) beside any stall of a test machine between two
statements, and every deadline is a condition polled for: a test fails only when the worker
lingered where it must not, or did not where it must."""

import signal

import pytest

from harness.wait import wait_until

LINGER_S = 20


def enqueue_one(pg, key, n):
    """One event in a transaction of its own; returns its id (landed rows name ids)."""
    event_id = pg.value("SELECT outbox.enqueue('billing', %s, %s::jsonb)::text", (key, f'{{"n": {n}}}'))
    return pg.value("SELECT id FROM outbox.events WHERE event_id = %s::uuid", (event_id,))


def landed_ids(pg):
    """The ids of each landed row, in the order the relay wrote them."""
    return [list(ids) for (ids,) in pg.sql("SELECT ids FROM outbox.landed ORDER BY published_at, first_offset")]


def test_events_committed_during_a_linger_share_one_batch(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, batch_linger=f"{LINGER_S}s")
    pg.wait_workers_running(1)
    # The worker is idle: the commit wakes it at once (no linger before a claim that follows
    # an empty one), well within the linger.
    first = enqueue_one(pg, "invoice-7", 0)
    pg.wait_published(1, timeout=LINGER_S / 2)
    # Three commits, one after the other, while the worker lingers after its claim of `first`:
    # each sets its latch, none makes it claim.
    rest = [enqueue_one(pg, "invoice-7", n) for n in (1, 2, 3)]
    pg.wait_published(4, timeout=LINGER_S + 60)
    # One key, one partition, consecutive offsets: one landed row per batch.
    assert landed_ids(pg) == [[first], rest]


@pytest.mark.parametrize("schema, budget, payload", [
    pytest.param("0.4.1", {"batch_size": 2}, "{}", id="ring-batch_size"),
    # 1kB of payload, key and headers a claim: about two of these events each.
    pytest.param("0.4.1", {"batch_max_bytes": "1kB"}, '{"pad": "%s"}' % ("x" * 600), id="ring-batch_max_bytes"),
    pytest.param("0.3.0", {"batch_size": 2}, "{}", id="0.3.0-batch_size", marks=pytest.mark.schema("0.3.0")),
    pytest.param("0.3.0", {"batch_max_bytes": "1kB"}, '{"pad": "%s"}' % ("x" * 600), id="0.3.0-batch_max_bytes",
                 marks=pytest.mark.schema("0.3.0")),
])
def test_a_worker_behind_does_not_linger(mock_cluster, make_relay, schema, budget, payload):
    """Claims cut at a budget follow each other at once: 12 events about two a claim take six
    claims, which a linger of a minute after each would make last at least five minutes."""
    pg = make_relay(mock_cluster.bootstrap, batch_linger="60s", **budget)
    pg.wait_workers_running(1)
    assert pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'") == schema
    with pg.connect(autocommit=False) as c:
        for n in range(12):
            c.execute("SELECT outbox.enqueue('billing', 'invoice-7', %s::jsonb)", (payload,))
        c.commit()
    pg.wait_published(12, timeout=50)


def relay_lingering(mock_cluster, make_relay):
    """A relay with a linger of a minute that has just published one event: it lingers."""
    pg = make_relay(mock_cluster.bootstrap, batch_linger="60s")
    pg.wait_workers_running(1)
    enqueue_one(pg, "invoice-7", 0)
    pg.wait_published(1, timeout=30)
    return pg


def test_a_reload_ends_a_linger(mock_cluster, make_relay):
    """A reload is served at once, also one that shortens the linger itself."""
    pg = relay_lingering(mock_cluster, make_relay)
    enqueue_one(pg, "invoice-7", 1)  # waits for the linger's end
    wait_until(lambda: pg.value("SELECT state FROM outbox.workers WHERE worker = 0") == "lingering", 30,
               "the worker lingering")
    pg.set(batch_linger="0")
    pg.wait_published(2, timeout=30)


def test_sigterm_ends_a_linger(mock_cluster, make_relay):
    pg = relay_lingering(mock_cluster, make_relay)
    pg.kill_worker(0, signal.SIGTERM)
    wait_until(lambda: "outbox relay 0 stopping" in pg.log(), 30, "the worker stopped within the linger")
