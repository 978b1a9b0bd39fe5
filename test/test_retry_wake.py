"""Issue 17 item 5: outbox.retry() and retry_failed() wake the relay when their transaction
commits (not at the call, not at a rollback), so a retried event is published at once rather
than at the next poll; and outbox.workers tells a stale last_error from a current one
(recovered_at)."""

import pytest

from harness.kafka_reader import read_topic
from harness.wait import Timeout, wait_until

# 0.3.0's table: the failed rows are made by hand with UPDATE.
pytestmark = pytest.mark.schema("0.3.0")

# Far longer than any deadline below: an event published within DEADLINE was woken for, not polled.
LONG_POLL = "10min"
DEADLINE = 20
# How long a sleeping worker is watched for a claim it must not make (six of the half-second
# wake-ups the relay used to have).
QUIET = 3


def claim_count(pg):
    return pg.value("SELECT sum(claim_seconds_count) FROM outbox.worker_metrics")


def failed_events(pg, topic, keys):
    """Events made failed in the transaction that enqueues them (as max_attempts refusals would
    leave them): the relay never sees them pending. Returns their event ids."""
    with pg.connect(autocommit=False) as c:
        ids = [c.execute("SELECT outbox.enqueue(%s, %s, '{}'::jsonb)::text", (topic, key)).fetchone()[0]
               for key in keys]
        c.execute("UPDATE outbox.events SET status = 'failed', attempts = 3, "
                  "last_error = 'INVALID_RECORD (written by the test)' WHERE event_id = ANY(%s::uuid[])", (ids,))
        c.commit()
    return ids


def statuses(pg, ids):
    return [r[0] for r in pg.sql("SELECT status FROM outbox.events WHERE event_id = ANY(%s::uuid[]) ORDER BY id",
                                 (ids,))]


def barrier(pg, topic):
    """A committed enqueue wakes the relay, which publishes it: a relay cycle ran after everything
    before this call."""
    event_id = pg.value("SELECT outbox.enqueue(%s, 'barrier', '{}'::jsonb)::text", (topic,))
    wait_until(lambda: pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (event_id,)) == "published",
               DEADLINE, "the barrier event published")


def wait_asleep(pg, workers):
    """Every worker in its idle sleep (state idle, in a latch wait): only its latch or
    outbox.poll_interval ends it now."""
    asleep = """SELECT count(*) FROM outbox.workers w JOIN pg_stat_activity a ON a.pid = w.pid
                WHERE w.state = 'idle' AND a.wait_event_type = 'Extension'"""
    wait_until(lambda: pg.value(asleep) == workers, DEADLINE, f"{workers} workers asleep")


def test_retry_wakes_the_relay_at_commit_not_before(mock_cluster, make_relay):
    # One worker: it owns every lane, so the barrier's wake-up is a cycle over the retried rows too.
    pg = make_relay(mock_cluster.bootstrap, poll_interval=LONG_POLL)
    pg.wait_workers_running(1)
    retried, rolled_back = failed_events(pg, "billing", ["k1", "k2"])
    barrier(pg, "orders")  # the relay has looked at the table since

    with pg.connect(autocommit=False) as c:
        assert c.execute("SELECT outbox.retry(%s)", (retried,)).fetchone()[0] == 1
        # Open: a relay cycle after the call does not see the retry.
        barrier(pg, "orders")
        wait_asleep(pg, 1)
        assert statuses(pg, [retried]) == ["failed"]
        c.commit()
    wait_until(lambda: statuses(pg, [retried]) == ["published"], DEADLINE,
               f"the retried event published well within outbox.poll_interval = {LONG_POLL}")

    # A rollback retries nothing and wakes nothing: the sleeping worker claims nothing for a
    # while. (It used to claim every half second, whatever outbox.poll_interval, woken by
    # PostgreSQL's own SIGALRM handler setting its latch: with that, no retry needed a wake-up.)
    wait_asleep(pg, 1)
    claims = claim_count(pg)
    with pg.connect(autocommit=False) as c:
        assert c.execute("SELECT outbox.retry(%s)", (rolled_back,)).fetchone()[0] == 1
        c.rollback()
    with pytest.raises(Timeout):
        wait_until(lambda: claim_count(pg) > claims, QUIET, "a claim of the sleeping worker")
    assert statuses(pg, [rolled_back]) == ["failed"]
    ids = {r.event_id for r in read_topic(mock_cluster.bootstrap, "billing", 1, settle=True)}
    assert ids == {retried}


def test_retry_failed_wakes_every_worker_at_commit(mock_cluster, make_relay):
    workers = 2
    pg = make_relay(mock_cluster.bootstrap, workers=workers, poll_interval=LONG_POLL)
    pg.wait_workers_running(workers)
    keys = [f"k{i}" for i in range(16)]
    ids = failed_events(pg, "billing", keys)
    other_topic = failed_events(pg, "orders", ["k1"])
    # Lane l belongs to worker l % workers: both workers own some of the failed events.
    assert pg.value("SELECT count(DISTINCT lane %% %s) FROM outbox.events WHERE event_id = ANY(%s::uuid[])",
                    (workers, ids)) == workers
    wait_asleep(pg, workers)

    with pg.connect(autocommit=False) as c:
        assert c.execute("SELECT outbox.retry_failed('billing')").fetchone()[0] == len(ids)
        assert set(statuses(pg, ids)) == {"failed"}  # not before the commit
        c.commit()
    wait_until(lambda: set(statuses(pg, ids)) == {"published"}, DEADLINE,
               f"{len(ids)} retried events published well within outbox.poll_interval = {LONG_POLL}")
    assert statuses(pg, other_topic) == ["failed"]  # another topic's: not retried
    # Nothing to retry: nothing changes (and nothing is woken).
    assert pg.value("SELECT outbox.retry_failed('billing')") == 0


def test_commit_prepared_wakes_the_relay_for_the_prepared_events_and_retries(mock_cluster, make_relay):
    # Two-phase commit (an XA coordinator): the enqueuing session's commit callback ran at PREPARE,
    # when nothing was visible yet; COMMIT PREPARED, in the same database, is what must wake.
    pg = make_relay(mock_cluster.bootstrap, poll_interval=LONG_POLL, server={"max_prepared_transactions": "2"})
    pg.wait_workers_running(1)
    retried = failed_events(pg, "billing", ["k1"])[0]
    barrier(pg, "orders")
    wait_asleep(pg, 1)
    claims = claim_count(pg)
    with pg.connect(autocommit=False) as c:
        enqueued = c.execute("SELECT outbox.enqueue('billing', 'k2', '{}'::jsonb)::text").fetchone()[0]
        assert c.execute("SELECT outbox.retry(%s)", (retried,)).fetchone()[0] == 1
        c.execute("PREPARE TRANSACTION 'outbox-2pc'")
    # Prepared: nothing visible, nothing woken.
    with pytest.raises(Timeout):
        wait_until(lambda: claim_count(pg) > claims, QUIET, "a claim of the sleeping worker")
    pg.sql("COMMIT PREPARED 'outbox-2pc'")
    wait_until(lambda: statuses(pg, [retried, enqueued]) == ["published", "published"], DEADLINE,
               f"the prepared events published well within outbox.poll_interval = {LONG_POLL}")
    ids = {r.event_id for r in read_topic(mock_cluster.bootstrap, "billing", 2, settle=True)}
    assert ids == {retried, enqueued}


# --- last_error: stale or current -----------------------------------------------------------

def backoffs(pg):
    return pg.value("SELECT backoffs FROM outbox.worker_metrics")


def error_row(pg):
    return pg.sql("SELECT last_error, last_error_at, recovered_at, state FROM outbox.workers")[0]


def test_workers_tell_a_current_error_from_a_stale_one(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, publish_timeout="1s",
                    kafka_properties="socket.connection.setup.timeout.ms=1000;reconnect.backoff.max.ms=200")
    pg.wait_workers_running(1)
    pg.sql("SELECT outbox.enqueue('billing', 'warmup', 'x')")
    pg.wait_published(1)
    assert error_row(pg)[:3] == (None, None, None)  # no error: nothing to be stale

    for outage in (1, 2):
        previous_error_at = error_row(pg)[1]
        for b in (1, 2, 3):
            mock_cluster.down(b)
        pg.sql("SELECT outbox.enqueue('billing', 'k', 'x')")
        # During the outage: an error newer than the last one, and current, across several rounds.
        wait_until(lambda: error_row(pg)[0] is not None and error_row(pg)[1] != previous_error_at, 60,
                   f"outage {outage}: last_error set")
        rounds = backoffs(pg)
        wait_until(lambda: backoffs(pg) >= rounds + 2, 60, f"outage {outage}: two more failed rounds")
        last_error, last_error_at, recovered_at, _ = error_row(pg)
        assert last_error and recovered_at is None, f"outage {outage}: error not current: {error_row(pg)}"

        for b in (1, 2, 3):
            mock_cluster.up(b)
        pg.wait_published(1 + outage, timeout=120)
        # After recovery: the error is kept, and says it is stale.
        wait_until(lambda: error_row(pg)[2] is not None, 30, f"outage {outage}: recovered_at set")
        last_error, last_error_at, recovered_at, _ = error_row(pg)
        assert last_error and recovered_at > last_error_at
