"""Error paths of the relay loop: every step (claim, lock, requeue, record, next-retry, purge,
producer creation) made to fail twice in a row, by the test seam (outbox.test_fail_step,
TEST_SEAMS=1 builds) and by real faults (a lock wait inside a relay statement ended by
lock_timeout, statement_timeout or pg_cancel_backend, a cancel while publishing, an ACCESS
EXCLUSIVE lock, the brokers down), then left to recover; and rows held by a user's session,
which the relay passes over without waiting.

After each fault every case checks the same things (assert_recovered): nothing lost, per-key order
of first deliveries kept, duplicates only for what was in flight at a fault (at-least-once),
nothing failed, the same worker process (recovered in-process, no crash restart), the worker back
to idle, a new connection works, a fast shutdown completes, and no crash in the server log."""

import subprocess

import psycopg
import pytest

from harness.kafka_reader import check_delivery, read_topic
from harness.record_wait import drop_record_wait, make_record_wait
from harness.wait import wait_until

TOPIC = "orders"  # 8 partitions in the conftest mock cluster
BATCH = 5
ROUND = 15        # events per round: three batches over three keys
KEYS = 3
FAST_RECONNECT = "socket.connection.setup.timeout.ms=1000;reconnect.backoff.max.ms=200"
# Settings of every case: small batches, quick timeouts, so that a fault and its recovery take
# seconds.
BASE = dict(batch_size=BATCH, publish_timeout="2s", lock_timeout="300ms", kafka_properties=FAST_RECONNECT)
MISSING_ROLE = "outbox_test_no_such_role"


# --- helpers ---------------------------------------------------------------------------------

def enqueue(conn, n, tag, keys=KEYS):
    """Enqueues n events on `conn` (no commit). Returns {key: [event_id, ...]} in enqueue order."""
    by_key = {}
    for i in range(n):
        key = f"k{i % keys}"
        eid = conn.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)::text",
                           (TOPIC, key, f'{{"tag": "{tag}", "seq": {i}}}')).fetchone()[0]
        by_key.setdefault(key, []).append(eid)
    return by_key


def enqueue_committed(pg, n, tag):
    with pg.connect(autocommit=False) as c:
        by_key = enqueue(c, n, tag)
        c.commit()
    return by_key


def merge(*rounds):
    out = {}
    for r in rounds:
        for key, ids in r.items():
            out.setdefault(key, []).extend(ids)
    return out


def total(by_key):
    return sum(len(ids) for ids in by_key.values())


def worker(pg):
    w = pg.workers()[0]
    return {"pid": w[1], "state": w[2], "last_error": w[5], "broker": w[6]}


def log_since(pg, offset):
    return pg.log()[offset:]


def errors_logged(pg, text, offset=0):
    """Server log ERROR lines carrying `text` (a CONTEXT or STATEMENT line does not count)."""
    return sum(1 for line in log_since(pg, offset).splitlines() if "ERROR:" in line and text in line)


def wait_errors(pg, text, n, offset=0, timeout=30):
    return wait_until(lambda: errors_logged(pg, text, offset) >= n, timeout,
                      f"{n} ERROR lines with {text!r} in the server log")


def brokers(mock_cluster, up):
    for b in (1, 2, 3):
        (mock_cluster.up if up else mock_cluster.down)(b)


def start_relay(make_relay, mock_cluster, **settings):
    pg = make_relay(mock_cluster.bootstrap, **{**BASE, **settings})
    # The cases count ERROR lines: the harness logs at warning, which shows them.
    assert pg.value("SHOW log_min_messages") == "warning"
    pg.wait_workers_running(1)
    return pg, worker(pg)["pid"]


def warm_up(pg):
    """One event through: the producer is connected and the topic's metadata known."""
    expected = enqueue_committed(pg, 1, "warm-up")
    pg.wait_published(1)
    return expected


def fast_stop(pg):
    """pg_ctl stop -m fast must finish within pg_ctl's own deadline (it fails otherwise)."""
    res = subprocess.run(["pg_ctl", "-D", pg.datadir, "-m", "fast", "-w", "-t", "30", "stop"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert res.returncode == 0, f"fast shutdown did not complete within 30 s: {res.stdout}"
    pg.started = False


def assert_delivered(mock_cluster, expected, max_duplicates, max_duplicated_events=None):
    """Kafka holds every event of expected ({key: [event_id, ...]}, all committed), first
    deliveries in per-key order, and at most max_duplicates deliveries beyond the first (what was
    in flight at the faults) spread over at most max_duplicated_events events (the batch out)."""
    n = total(expected)
    records = read_topic(mock_cluster.bootstrap, TOPIC, n, timeout=60, settle=True)
    check = check_delivery(records, expected)
    print(f"delivered {check.delivered}, unique {check.unique}, duplicates {check.duplicates}")
    assert check.lost == [], "committed events never reached Kafka"
    assert check.order_violations == [], "per-key order of first deliveries broken"
    assert check.unique == n
    assert check.duplicates <= max_duplicates, \
        f"{check.duplicates} duplicates, at most {max_duplicates} were in flight at the faults"
    if max_duplicated_events is not None:
        counts = {}
        for r in records:
            counts[r.event_id] = counts.get(r.event_id, 0) + 1
        duplicated = [e for e, c in counts.items() if c > 1]
        assert len(duplicated) <= max_duplicated_events, f"duplicated events {duplicated}"
    return check


def assert_worker_recovered(pg, pid):
    """Recovered in-process (no crash, no restart), idle, the server usable and stoppable."""
    assert worker(pg)["pid"] == pid, "the worker process changed: it was restarted, not recovered"
    wait_until(lambda: worker(pg)["state"] == "idle", 30, "worker back to idle")
    with psycopg.connect(host=pg.tmp, port=pg.port, user="postgres", dbname=pg.database) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    fast_stop(pg)
    log = pg.log()
    for bad in ("terminated by signal", "PANIC", "TRAP"):
        assert bad not in log, f"{bad!r} in the server log"


def assert_recovered(pg, mock_cluster, expected, pid, max_duplicates, max_duplicated_events=None):
    """The checks after every fault: all published, nothing failed or left behind, Kafka as
    assert_delivered says, the worker as assert_worker_recovered says."""
    n = total(expected)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'") == n, 60,
               f"all {n} events published")
    assert dict(pg.sql("SELECT status, count(*) FROM outbox.events GROUP BY status")) == {"published": n}
    check = assert_delivered(mock_cluster, expected, max_duplicates, max_duplicated_events)
    assert_worker_recovered(pg, pid)
    return check


# --- the seam: each step fails twice in a row, then works --------------------------------------

# step -> (deliveries beyond the first allowed, distinct events allowed a duplicate).
# Only a failed record step leaves acked events to be sent again: the batch out, once per failure.
SEAM_STEPS = {
    "claim": (0, 0),
    "lock": (0, 0),
    "requeue": (0, 0),
    "record": (2 * BATCH, BATCH),
    "next_retry": (0, 0),
}


@pytest.mark.schema("0.3.0")  # 0.3.0's steps and table locks
@pytest.mark.parametrize("step", list(SEAM_STEPS))
def test_step_fails_twice_then_recovers(mock_cluster, make_relay, step):
    # The worker is refused first (its role missing), so the seam and the working role arrive in
    # one reload: the first step the worker runs after it is the armed one, with the rows below.
    # (Not from the start: CREATE EXTENSION creates the role outbox.relay_role names.)
    pg, pid = start_relay(make_relay, mock_cluster)
    pg.set(relay_role=MISSING_ROLE)
    wait_until(lambda: worker(pg)["state"] == "misconfigured", 30, "worker refused (role missing)")
    with pg.connect(autocommit=False) as c:
        first = enqueue(c, ROUND, "at the fault")
        # Orphans (as after a crash) for the requeue to put back: the first batch, by hand.
        c.execute("UPDATE outbox.events SET status = 'in_flight', claimed_at = now() "
                  "WHERE id IN (SELECT id FROM outbox.events ORDER BY id LIMIT %s)", (BATCH,))
        c.commit()
    offset = len(pg.log())
    injected = f"outbox test: injected failure of step {step}"
    pg.set(relay_role="outbox_relay", test_fail_step=f"{step}:2")
    wait_errors(pg, injected, 2, offset)
    second = enqueue_committed(pg, ROUND, "after the faults")
    max_duplicates, max_duplicated_events = SEAM_STEPS[step]
    assert_recovered(pg, mock_cluster, merge(first, second), pid, max_duplicates, max_duplicated_events)
    assert errors_logged(pg, injected, offset) == 2, "the seam fired more often than armed"


PURGE_FAILURES = 2


def test_purge_fails_then_recovers(mock_cluster, make_relay):
    # Purge runs on worker 0 every tenth of outbox.retention (at most once a second, at least
    # once a minute): with a 1 s retention, two failed rounds and a good one take a few seconds.
    pg, pid = start_relay(make_relay, mock_cluster, retention="0")
    old = enqueue_committed(pg, ROUND, "old enough to purge")
    pg.wait_published(ROUND)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events "
                                "WHERE published_at < now() - interval '1 second'") == ROUND, 10,
               "published rows past a 1 s retention")
    offset = len(pg.log())
    injected = "outbox test: injected failure of step purge"
    pg.set(retention="1s", test_fail_step=f"purge:{PURGE_FAILURES}")
    wait_errors(pg, injected, 1, offset)
    # The failed DELETE was rolled back, and the loop carries on publishing.
    assert pg.value("SELECT count(*) FROM outbox.events") == ROUND
    after = enqueue_committed(pg, ROUND, "after the purge failure")
    records_after = merge(old, after)
    # (Published rows may already be purged again: a 1 s retention purges every second.)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status <> 'published'") == 0, 60,
               "events after the failure published")
    wait_errors(pg, injected, PURGE_FAILURES, offset, timeout=90)
    # The next round works: the old rows go.
    old_ids = [e for ids in old.values() for e in ids]
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE event_id::text = ANY(%s)", (old_ids,)) == 0,
               90, "the next purge round deleted the old rows")
    assert errors_logged(pg, injected, offset) == PURGE_FAILURES
    # Purged rows are gone from the table: Kafka must hold all of them, the table nothing else.
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status <> 'published'") == 0
    assert_delivered(mock_cluster, records_after, 0)
    assert_worker_recovered(pg, pid)


# --- real faults -----------------------------------------------------------------------------

# fault -> (settings of the relay, ERROR text). The record statement waits inside a trigger
# for an advisory lock the test holds (no relay statement waits for a row lock: they skip what
# others hold); the fault must end the wait, twice, and the batch is sent again each time.
LOCK_WAIT_FAULTS = {
    "lock_timeout": (dict(lock_timeout="300ms"), "canceling statement due to lock timeout"),
    # outbox.statement_timeout tiny for a moment, lock_timeout far longer: the statement timeout
    # must end the wait.
    "statement_timeout": (dict(lock_timeout="60s"), "canceling statement due to statement timeout"),
    "cancel": (dict(lock_timeout="60s"), "canceling statement due to user request"),
}


@pytest.mark.schema("0.3.0")  # 0.3.0's steps and table locks
@pytest.mark.parametrize("fault", list(LOCK_WAIT_FAULTS))
def test_lock_wait_inside_the_record_ended_twice_by(mock_cluster, make_relay, fault):
    settings, error = LOCK_WAIT_FAULTS[fault]
    pg, pid = start_relay(make_relay, mock_cluster, **settings)
    expected = warm_up(pg)
    if fault == "statement_timeout":
        # Set while the worker is idle: a reload is read between steps, never inside a lock wait.
        pg.set(statement_timeout="200ms")
    holder = make_record_wait(pg)
    offset = len(pg.log())
    expected = merge(expected, enqueue_committed(pg, ROUND, "at the fault"))
    try:
        for n in (1, 2):
            if fault == "cancel":
                wait_until(lambda: pg.value("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
                           == "Lock", 30, f"worker waiting on the lock (cancel {n})")
                assert pg.value("SELECT pg_cancel_backend(%s)", (pid,))
            # Long before a 60 s lock_timeout.
            wait_errors(pg, error, n, offset, timeout=20)
        assert "STATEMENT:  outbox relay: record" in log_since(pg, offset)
    finally:
        if fault == "statement_timeout":
            pg.set(statement_timeout="60s")
        drop_record_wait(pg, holder)
    expected = merge(expected, enqueue_committed(pg, ROUND, "after the faults"))
    # Each ended record left its batch, already in Kafka, pending: sent again.
    assert_recovered(pg, mock_cluster, expected, pid, 2 * BATCH, BATCH)


@pytest.mark.schema("0.3.0")  # 0.3.0's steps and table locks
def test_rows_held_by_a_user_are_passed_over_without_waiting(mock_cluster, make_relay):
    # A session holds FOR UPDATE: the first pending event of k0, an in_flight row of k1 (as a
    # 0.1.0 relay could leave it) and published rows past retention. The relay waits for none of
    # them: k2 is published and purged, the held keys' later events wait behind the held rows
    # (per-key order), and no ERROR is logged. Then the session ends and everything goes.
    pg, pid = start_relay(make_relay, mock_cluster, retention="0")
    expected = warm_up(pg)
    expected = merge(expected, enqueue_committed(pg, BATCH, "published, then held"))
    pg.wait_published(BATCH + 1)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE published_at < now() - interval '1 second'")
               == BATCH + 1, 10, "published rows past a 1 s retention")
    # The worker refused (its role missing) while the rows are written and taken.
    pg.set(relay_role=MISSING_ROLE)
    wait_until(lambda: worker(pg)["state"] == "misconfigured", 30, "worker refused (role missing)")
    held_published = [e for ids in expected.values() for e in ids][1:]
    round_ = enqueue_committed(pg, ROUND, "behind held rows")
    expected = merge(expected, round_)
    pg.sql("UPDATE outbox.events SET status = 'in_flight' WHERE event_id = %s::uuid", (round_["k1"][0],))
    holder = pg.connect(autocommit=False)
    held = holder.execute("SELECT id FROM outbox.events WHERE event_id::text = ANY(%s) FOR UPDATE",
                          ([round_["k0"][0], round_["k1"][0]] + held_published,)).fetchall()
    assert len(held) == 2 + len(held_published)
    offset = len(pg.log())
    pg.set(relay_role="outbox_relay", retention="1s")
    try:
        def state_of(ids):
            return dict(pg.sql("SELECT event_id::text, status FROM outbox.events WHERE event_id::text = ANY(%s)",
                               (ids,)))
        # k2 published, then purged with the rest of the unheld history.
        wait_until(lambda: not state_of(round_["k2"]), 60, "k2 published and purged")
        assert len(state_of(held_published)) == len(held_published), "a held row was deleted"
        assert set(state_of(round_["k0"]).values()) == {"pending"}, "k0 overtook its held first event"
        assert set(state_of(round_["k1"][1:]).values()) == {"pending"}, "k1 overtook its held in_flight row"
        assert pg.value("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)) != "Lock"
        assert "ERROR:" not in log_since(pg, offset)
    finally:
        holder.rollback()
        holder.close()
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events") == 0, 60, "everything published and purged")
    assert_delivered(mock_cluster, expected, 0)
    assert_worker_recovered(pg, pid)
    assert "ERROR:" not in log_since(pg, offset)


def test_cancel_while_publishing_twice_then_recovers(mock_cluster, make_relay):
    # pg_cancel_backend(worker) while it waits for delivery reports (a slow broker): an ERROR in
    # the publish wait, the producer with messages out is dropped, the abort leaves the batch
    # pending and unlocked, and the next claim sends it again. (Each round first lets a new
    # producer hear from the broker at RTT 0: a claim waits for a broker's answer.)
    pg, pid = start_relay(make_relay, mock_cluster, publish_timeout="60s")
    expected = {}
    offset = len(pg.log())
    try:
        for n in (1, 2):
            mock_cluster.rtt("all", 0)
            expected = merge(expected, warm_up(pg))
            pg.wait_published(total(expected))
            mock_cluster.rtt("all", 20000)
            expected = merge(expected, enqueue_committed(pg, ROUND, f"at fault {n}"))
            wait_until(lambda: worker(pg)["state"] == "publishing", 30, f"worker publishing (cancel {n})")
            assert pg.value("SELECT pg_cancel_backend(%s)", (pid,))
            wait_errors(pg, "canceling statement due to user request", n, offset)
    finally:
        mock_cluster.rtt("all", 0)
    expected = merge(expected, enqueue_committed(pg, ROUND, "after the faults"))
    # A cancelled batch may have been appended (the broker was only slow): sent again.
    assert_recovered(pg, mock_cluster, expected, pid, 2 * ROUND, 2 * ROUND)


@pytest.mark.schema("0.3.0")  # 0.3.0's steps and table locks
def test_access_exclusive_lock_makes_the_relay_wait_without_error(mock_cluster, make_relay):
    # LOCK TABLE outbox.events IN ACCESS EXCLUSIVE MODE asked for while a batch is out: it waits
    # for the batch's transaction (the relay holds the table's lock until the record commits),
    # then the claims after it find the table busy and wait (state idle, no ERROR), then carry on.
    pg, pid = start_relay(make_relay, mock_cluster)
    expected = warm_up(pg)
    mock_cluster.rtt("all", 1000)  # below publish_timeout: the batch is acked, just slowly
    offset = len(pg.log())
    expected = merge(expected, enqueue_committed(pg, ROUND, "at the lock"))
    wait_until(lambda: worker(pg)["state"] == "publishing", 30, "batch out")
    with pg.connect(autocommit=False) as locker:
        locker.execute("SET lock_timeout = '60s'")
        locker.execute("LOCK TABLE outbox.events IN ACCESS EXCLUSIVE MODE")
        mock_cluster.rtt("all", 0)
        # The batch out was recorded before the lock was granted: the rest waits, idle.
        published = locker.execute("SELECT count(*) FROM outbox.events WHERE status = 'published'").fetchone()[0]
        assert published >= 1 + BATCH
        wait_until(lambda: worker(pg)["state"] == "idle", 30, "worker waiting (idle) behind the lock")
        assert "ERROR:" not in log_since(pg, offset)
        locker.rollback()
    expected = merge(expected, enqueue_committed(pg, ROUND, "after the lock"))
    assert_recovered(pg, mock_cluster, expected, pid, 0)
    assert "ERROR:" not in log_since(pg, offset)


@pytest.mark.parametrize("when", ["before_claim", "during_publish"])
def test_brokers_down_twice_then_recover(mock_cluster, make_relay, when):
    pg, pid = start_relay(make_relay, mock_cluster)
    if when == "during_publish":
        mock_cluster.rtt("all", 300)  # slow enough to catch the batch out (set before any outage)
    expected = warm_up(pg)
    offset = len(pg.log())
    if when == "before_claim":
        brokers(mock_cluster, up=False)
    expected = merge(expected, enqueue_committed(pg, ROUND, "at the outage"))
    if when == "during_publish":
        wait_until(lambda: worker(pg)["state"] == "publishing", 30, "batch out")
        brokers(mock_cluster, up=False)
    wait_until(lambda: log_since(pg, offset).count("Kafka unavailable") >= 2, 60, "two failed publish rounds")
    assert pg.value("SELECT max(attempts) FROM outbox.events") == 0, "an outage used up attempts"
    brokers(mock_cluster, up=True)
    expected = merge(expected, enqueue_committed(pg, ROUND, "after the outage"))
    # during_publish: the batch out when the brokers went down may have been appended.
    allowed = BATCH if when == "during_publish" else 0
    assert_recovered(pg, mock_cluster, expected, pid, allowed, allowed)


def test_producer_creation_fails_twice_then_recovers(mock_cluster, make_relay):
    # Two bad outbox.kafka_properties reloads in a row (producer creation fails: misconfigured),
    # events wait pending; a good one publishes them, in the same process.
    pg, pid = start_relay(make_relay, mock_cluster)
    expected = warm_up(pg)
    # (An unknown name is reported by its position only: it may be a fragment of a secret.)
    for bad, name in (("no.such.property=1", "entry 1 names no librdkafka property"),
                      ("compression.codec=bogus", "compression.codec")):
        pg.set(kafka_properties=bad)
        wait_until(lambda: worker(pg)["state"] == "misconfigured" and name in (worker(pg)["last_error"] or ""),
                   30, f"misconfigured by {name}")
        expected = merge(expected, enqueue_committed(pg, ROUND, f"while {name} is set"))
        assert pg.value("SELECT count(*) FROM outbox.events WHERE status <> 'published'") == total(expected) - 1
    pg.set(kafka_properties=FAST_RECONNECT)
    expected = merge(expected, enqueue_committed(pg, ROUND, "after the fix"))
    assert_recovered(pg, mock_cluster, expected, pid, 0)
