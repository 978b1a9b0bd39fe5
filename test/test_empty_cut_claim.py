"""A claim that a budget cut short but that took no event (every row it read was held behind an
earlier failed event of its key, or a hole's window held nothing) has still moved the relay on:
its cursor, or the hole's walk. The worker claims again at once instead of taking the idle sleep
(outbox.poll_interval), which no commit would end: the commit that woke it was served by that
claim. The poll interval here is ten minutes, so every deadline below is far inside it: a test
fails only when the worker slept where it must not."""

from harness.wait import wait_until


def status_of(pg, event_id):
    return pg.value("SELECT status FROM outbox.events WHERE event_id = %s::uuid", (event_id,))


def test_an_event_behind_rows_held_by_a_failed_key_is_published_without_the_idle_sleep(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, batch_size=5, max_attempts=1, on_failed_event="block_key",
                    kafka_properties="message.max.bytes=2000", max_payload_bytes="1MB", poll_interval="10min")
    pg.wait_workers_running(1)
    # A poison event (larger than the broker takes) fails at once and blocks its key.
    poison = pg.value("SELECT outbox.enqueue('billing', 'bad-key', %s)::text", ("x" * 5000,))
    wait_until(lambda: status_of(pg, poison) == "failed", 60, "the poison event failed")
    # One commit: 20 events of the blocked key, then one of another key. Each claim of 5 reads
    # only held rows (cut at batch_size, nothing taken) until the cursor reaches the last one.
    with pg.connect() as c:
        with c.transaction():
            held = [c.execute("SELECT outbox.enqueue('billing', 'bad-key', %s)::text", (f"held {i}",)).fetchone()[0]
                    for i in range(20)]
            good = c.execute("SELECT outbox.enqueue('billing', 'good-key', 'fine')::text").fetchone()[0]
    wait_until(lambda: status_of(pg, good) == "published", 120, "the event behind the held rows published")
    assert [status_of(pg, event_id) for event_id in held] == ["pending"] * 20
    # And it goes idle then, as before: a worker that claimed in a loop would never say so (an
    # empty claim that moved on does not set the state idle).
    wait_until(lambda: pg.value("SELECT state FROM outbox.workers") == "idle", 60, "the worker idle")
    later = pg.value("SELECT outbox.enqueue('billing', 'good-key', 'later')::text")
    wait_until(lambda: status_of(pg, later) == "published", 120, "a later event published")
