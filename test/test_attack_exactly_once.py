"""Attacks on outbox.delivery = exactly_once (issue 18; DESIGN.md "Exactly once",
docs/exactly-once.md), against the real broker (harness KafkaBroker) and the TEST_SEAMS build.
Each test states the property the change promises and fails when the attack breaks it:

- a role with only CONNECT (PREPARE TRANSACTION needs no right) takes every prepared-transaction
  slot: no batch can be prepared, the relay publishes nothing;
- two events that are each small enough for their topic but too large together in one record
  batch: in a transaction the refusal aborts the batch and the solo sends charge nobody, so the
  worker loops on them for ever ("Kafka unavailable") where at least once publishes both;
- two changes of outbox.workers while a slot of the middle count has not yet walked past what a
  slot of the first count published: the third count's floors come from the middle count only and
  a read_committed consumer reads those events twice;
- a change of outbox.progress_topic and back: a batch Kafka committed with its offset on one
  topic is decided by the other topic's offset, and rolled back (a duplicate), not reported;
- a reload of outbox.progress_topic to a topic that does not exist yet: it is never made, every
  Kafka commit is refused, no event goes out;
- outbox.delivery turned back to at_least_once while a batch is in doubt: the prepared batch is
  never decided and its slot claims nothing again.

The crashes use the seam outbox.test_crash_at (set in postgresql.conf at start, so it fires at the
first batch; the marker file outbox_test_crash_fired makes it fire once). A setting written with
ALTER SYSTEM and no reload reaches only a worker process started after it: the one the crash
restart makes (a worker reads the configuration files when it starts)."""

import json
import os
import re
import uuid
from collections import Counter

import psycopg
import pytest

from harness.kafka_broker import KafkaBroker
from harness.wait import Timeout, wait_until
from test_exactly_once import end_offsets, eos_relay, read_all, relay_state

CRASH_LINE = re.compile(r"\[(\d+)\] [^\n]*test_crash_at: crashing at (\S+)")
OUR_PREPARED = "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'outbox:%' ORDER BY gid"


@pytest.fixture(scope="module")
def kafka():
    with KafkaBroker() as kb:  # the broker's defaults (auto.create.topics.enable = true)
        yield kb


def new_topic(kafka, partitions=1, config=None, prefix="atk-"):
    name = prefix + uuid.uuid4().hex[:12]
    kafka.create_topic(name, partitions=partitions, config=config)
    return name


def enqueue(pg, topic, key, payload):
    return pg.value("SELECT outbox.enqueue(%s, %s, %s::jsonb)::text", (topic, key, json.dumps(payload)))


def published(pg, ids):
    return pg.value("SELECT count(*) FROM outbox.events WHERE event_id = ANY(%s::uuid[]) AND status = 'published'",
                    (list(ids),))


def picture(pg):
    """What the relay shows: the queue by status and attempts, the workers, prepared batches."""
    return (f"events {pg.sql('SELECT status, attempts, count(*) FROM outbox.events GROUP BY 1, 2 ORDER BY 1, 2')}, "
            f"workers {pg.workers()}, prepared {pg.sql('SELECT gid, owner FROM pg_prepared_xacts')}")


def read_once(kafka, topic, ids):
    """Each of `ids` read exactly once by a read_committed consumer of `topic`."""
    counts = Counter(r.event_id for r in read_all(kafka, topic, "read_committed"))
    wrong = {i: counts[i] for i in ids if counts[i] != 1}
    assert not wrong, f"read_committed read these events other than once: {wrong}"


def crash_and_restart(pg):
    """Waits for the seam's SIGKILL and for the worker the crash restart makes."""
    line = wait_until(lambda: CRASH_LINE.search(pg.log()), 30, "the worker's test_crash_at")
    pid = int(line.group(1))
    pg.expect_killed(pid)
    wait_until(lambda: f"(PID {pid}) was terminated by signal 9" in pg.log(), 60, "the postmaster saw the SIGKILL")
    wait_until(lambda: pg.worker_pids()[0] not in (None, pid), 60, "a new worker")
    return line.group(2)


# -- (a) a role with only CONNECT --------------------------------------------------------------

def test_a_role_with_only_connect_that_fills_max_prepared_transactions_does_not_stop_the_relay(kafka, make_relay):
    # PREPARE TRANSACTION needs no privilege, and a prepared transaction outlives its session and
    # restarts. exactly_once needs a free slot for every batch: outbox.max_workers (4 here) of
    # max_prepared_transactions are kept for the relay, and a PREPARE that would take one of them
    # is refused (53400) with the slots in use named.
    topic = new_topic(kafka)
    pg = eos_relay(make_relay, kafka, prepared=6, poll_interval="200ms")
    pg.wait_workers_running(1)
    first = enqueue(pg, topic, "k0", {"n": 0})
    wait_until(lambda: published(pg, [first]) == 1, 30, "the first event published")
    pg.sql("CREATE ROLE mallory LOGIN")
    assert not pg.value("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = 'mallory'")
    prepared, refused = [], []
    for i in range(6):
        with psycopg.connect(host=pg.tmp, port=pg.port, user="mallory", dbname="postgres", autocommit=True) as c:
            c.execute("BEGIN")
            c.execute("SELECT 1")
            try:
                c.execute(f"PREPARE TRANSACTION 'mallory-{i}'")
                prepared.append(f"mallory-{i}")
            except psycopg.errors.ConfigurationLimitExceeded as e:
                refused.append(e)
    try:
        # The two slots beyond the relay's reserve, no more; the rest refused with a message that
        # says why and what to do.
        assert len(prepared) == 2 and len(refused) == 4, (prepared, refused)
        assert pg.value("SELECT count(*) FROM pg_prepared_xacts WHERE owner = 'mallory'") == 2
        assert refused[0].sqlstate == "53400"
        assert "reserved for the outbox relay" in str(refused[0])
        assert "max_prepared_transactions" in (refused[0].diag.message_hint or "")
        hw_before = end_offsets(kafka, topic, "read_uncommitted")[0]
        ids = [enqueue(pg, topic, k, {"n": 1}) for k in ("k1", "k2", "k3")]
        try:
            wait_until(lambda: published(pg, ids) == 3, 30, "events published with mallory's prepared transactions there")
        except Timeout:
            hw_after = end_offsets(kafka, topic, "read_uncommitted")[0]
            raise AssertionError(
                f"a role with only CONNECT stopped the relay: nothing published while its prepared transactions "
                f"hold slots ({hw_after - hw_before} records appended to {topic} in aborted Kafka transactions "
                f"meanwhile); {picture(pg)}") from None
        read_once(kafka, topic, [first] + ids)
    finally:
        for gid in prepared:
            pg.sql(f"ROLLBACK PREPARED '{gid}'")


def test_prepared_transactions_of_a_role_with_only_connect_under_the_relays_gids_are_never_decided(kafka, make_relay):
    # Holds (a control): mallory reads the relay's identity (pg_control_system() is PUBLIC's) and
    # prepares transactions under gids of the relay's form, of its identity and batch 1, of an
    # old count and of another prefix. The worker is killed after its PREPARE of batch 1; its
    # recovery decides its own batch only (owner outbox.relay_role), claims, and publishes once.
    topic = new_topic(kafka)
    pg = eos_relay(make_relay, kafka, prepared=8, poll_interval="200ms", test_crash_at="after_prepare")
    pg.wait_workers_running(1)
    pg.sql("CREATE ROLE mallory LOGIN")
    with psycopg.connect(host=pg.tmp, port=pg.port, user="mallory", dbname="postgres", autocommit=True) as c:
        sysid = c.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0]
        oid = c.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
    fakes = [f"outbox:outbox-{sysid}-{oid}-1-0:1:{'0' * 16}", f"outbox:outbox-{sysid}-{oid}-1-0:2:{'1' * 16}",
             f"outbox:outbox-{sysid}-{oid}-3-2:7:{'2' * 16}", f"outbox:evil-{sysid}-{oid}-1-0:1:{'3' * 16}"]
    for gid in fakes:
        with psycopg.connect(host=pg.tmp, port=pg.port, user="mallory", dbname="postgres", autocommit=True) as c:
            c.execute("BEGIN")
            c.execute("SELECT 1")
            c.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        ids = [enqueue(pg, topic, k, {"n": 1}) for k in ("a", "b", "c")]
        assert crash_and_restart(pg) == "after_prepare"
        wait_until(lambda: published(pg, ids) == 3, 30, "published after the recovery")
        assert sorted(g for (g,) in pg.sql(OUR_PREPARED)) == sorted(fakes), picture(pg)
        assert "cannot be decided" not in (pg.workers()[0][5] or "")
        read_once(kafka, topic, ids)
    finally:
        for gid in fakes:
            pg.sql(f"ROLLBACK PREPARED '{gid}'")


# -- (b), (e) events that are fine alone, refused together ----------------------------------------

@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_two_events_that_fit_their_topic_alone_but_not_in_one_record_batch_are_published(kafka, make_relay, delivery):
    # The topic takes records batches of up to 4000 bytes (max.message.bytes, an operator's
    # topic setting); each event is ~2.6 kB, the two in one record batch are over it. Kafka refuses
    # the record batch (MSG_SIZE_TOO_LARGE). At least once sends each again alone (published);
    # exactly_once aborts the transaction, sends each alone in an aborted transaction, charges
    # neither (not their fault) and claims both again: for ever, the worker "backing off".
    topic = new_topic(kafka, config={"max.message.bytes": "4000"})
    pg = make_relay(kafka.bootstrap, delivery=delivery, server={"max_prepared_transactions": "4"},
                    poll_interval="200ms")
    pg.wait_workers_running(1)
    # Any role with EXECUTE on outbox.enqueue (or ordinary traffic) can write these.
    ids = [enqueue(pg, topic, k, {"pad": "x" * 2500}) for k in ("a", "b")]
    try:
        wait_until(lambda: published(pg, ids) == 2, 20, "both events published")
    except Timeout:
        raise AssertionError(f"{delivery}: two events each within the topic's limit never went out and were never "
                             f"charged: {picture(pg)}") from None
    read_once(kafka, topic, ids)


# -- (d), (f) two changes of outbox.workers ------------------------------------------------------

def set_workers(pg, n):
    """ALTER DATABASE ... SET outbox.workers = n, and every slot of count n has made its cursor
    row (its first claim committed: the count is complete, kOldFloorsSql's "old" for the next)."""
    pg.sql(f"ALTER DATABASE postgres SET outbox.workers = {n}", dbname="postgres")
    pg.reload()
    pg.wait_workers_running(n)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.cursors WHERE n_workers = %s", (n,)) == n, 60,
               f"every slot of count {n} with its cursor row")


def cursor_of(pg, n, worker):
    return pg.value("SELECT order_lsn FROM outbox.cursors WHERE n_workers = %s AND worker = %s", (n, worker))


def test_two_changes_of_outbox_workers_while_a_slot_lags_do_not_publish_events_again(kafka, make_relay):
    # Lanes by key: `lag` on lanes = 1 (mod 6): worker 1 of 2, 1 of 3, 1 or 3 of 4; R on lanes =
    # 4 (mod 6): worker 0 of 2, 1 of 3, 0 or 2 of 4. A backlog on `lag` (one event a batch) keeps
    # worker 1 of 2, then 1 of 3, behind; R, enqueued after the backlog, is published by worker 0
    # of 2. Count 3 starts at the lowest cursor of count 2 and leaves R out (count 2's floors). Count
    # 4 starts at count 3's lowest cursor with count 3's floors only: slot 1 of 3 has not walked
    # past R yet, so nothing says R was published, and worker 0/2 of 4 publishes it again.
    healthy, bulk = new_topic(kafka), new_topic(kafka)
    pg = eos_relay(make_relay, kafka, workers=2, prepared=8, poll_interval="200ms", batch_size="1")
    pg.wait_workers_running(2)
    keys = pg.sql("SELECT k, outbox.lane_of(k, NULL) % 6 FROM (SELECT 'k' || i AS k FROM generate_series(1, 500) i) s")
    lag_key = next(k for k, m in keys if m == 1)
    r_keys = [k for k, m in keys if m == 4][:4]
    pg.sql("SELECT count(outbox.enqueue(%s, %s, jsonb_build_object('i', i))) FROM generate_series(1, 1500) i",
           (bulk, lag_key))
    r_ids = [enqueue(pg, healthy, k, {"r": k}) for k in r_keys]
    wait_until(lambda: published(pg, r_ids) == 4, 30, "R published by worker 0 of 2")
    r_lsn = pg.value("SELECT min(order_lsn) FROM outbox.events WHERE topic = %s", (healthy,))
    set_workers(pg, 3)
    set_workers(pg, 4)
    # The precondition (else the test proves nothing): slot 1 of 3 had not passed R.
    lagging = pg.value("SELECT %s::pg_lsn > order_lsn FROM outbox.cursors WHERE n_workers = 3 AND worker = 1",
                       (r_lsn,))
    assert lagging, f"slot 1 of 3 passed R before count 4 started ({cursor_of(pg, 3, 1)} >= {r_lsn})"
    marker = enqueue(pg, healthy, r_keys[0], {"marker": True})  # after R on R's key: R again comes first
    wait_until(lambda: published(pg, [marker]) == 1, 30, "the marker published by count 4")
    read_once(kafka, healthy, r_ids + [marker])


# -- (c) settings ------------------------------------------------------------------------------

def test_a_batch_committed_with_one_progress_topic_is_not_rolled_back_by_another(kafka, make_relay):
    # Batch 1 commits offset 1 on topic B. The operator moves to A (reload; no new producer, the
    # batch count goes on: batch 2's offset goes to A), and back to B, written before a crash
    # after batch 2's Kafka commit. Recovery reads B: 1 = batch 2 - 1, "not committed", ROLLBACK
    # PREPARED: batch 2 is sent again. DESIGN.md: a batch the offset cannot tell (another
    # progress topic) is never guessed, the worker waits for an operator.
    topic = new_topic(kafka)
    a, b = new_topic(kafka, prefix="progress-a-"), new_topic(kafka, prefix="progress-b-")  # made by the operator
    pg = eos_relay(make_relay, kafka, poll_interval="200ms", progress_topic=b)
    pg.wait_workers_running(1)
    ids = [enqueue(pg, topic, "w", {"n": 0})]
    wait_until(lambda: published(pg, ids) == 1, 30, "batch 1 (offset 1 on B)")
    pg.set(progress_topic=a, test_crash_at="after_kafka_commit")
    wait_until(lambda: pg.value("SHOW outbox.test_crash_at") == "after_kafka_commit", 10, "the reload")
    pg.sql(f"ALTER SYSTEM SET outbox.progress_topic = '{b}'")  # read by the next worker process
    ids += [enqueue(pg, topic, "x", {"n": 1})]
    assert crash_and_restart(pg) == "after_kafka_commit"
    wait_until(lambda: relay_state(pg)[1:] == (0, 0) or "cannot be decided" in (pg.workers()[0][5] or ""), 60,
               "batch 2 decided, or reported")
    read_once(kafka, topic, ids)


def test_a_reload_of_outbox_progress_topic_to_a_new_topic_keeps_events_flowing(kafka, make_relay):
    # The relay makes the progress topic when missing (docs/exactly-once.md) - at a producer's
    # recovery only. A reload of outbox.progress_topic remakes no producer: the new topic is never
    # made, and every Kafka commit's offset is refused (UNKNOWN_TOPIC_OR_PART).
    topic = new_topic(kafka)
    pg = eos_relay(make_relay, kafka, poll_interval="200ms")
    pg.wait_workers_running(1)
    first = enqueue(pg, topic, "w", {"n": 0})
    wait_until(lambda: published(pg, [first]) == 1, 30, "the first event published")
    moved_to = "progress-new-" + uuid.uuid4().hex[:8]
    pg.set(progress_topic=moved_to)
    wait_until(lambda: pg.value("SHOW outbox.progress_topic") == moved_to, 10, "the reload")
    ids = [enqueue(pg, topic, k, {"n": 1}) for k in ("a", "b", "c")]
    try:
        wait_until(lambda: published(pg, ids) == 3, 15, "events published after the reload")
    except Timeout:
        raise AssertionError(f"nothing published after outbox.progress_topic moved to {moved_to}: {picture(pg)}") \
            from None


def test_turning_exactly_once_off_with_a_batch_in_doubt_does_not_wedge_its_slot(kafka, make_relay):
    # A batch prepared and committed in Kafka, then the worker dies (the seam); the worker that
    # starts next runs at least once (the operator turned exactly_once off: what one does when
    # the relay shows 'recovering' or 'misconfigured'). Before the fix nothing decided the prepared
    # batch: it kept its rows' and the slot's locks, the claim failed on them (lock timeout) round
    # after round. Now worker 0 rolls it back first: its events are sent again, at least once (a
    # duplicate, as Kafka had the batch), none lost.
    topic = new_topic(kafka)
    pg = eos_relay(make_relay, kafka, poll_interval="200ms", test_crash_at="after_kafka_commit")
    pg.wait_workers_running(1)
    # The seam disarmed (its marker file present) until the worker has published in exactly_once:
    # a worker reads the configuration files once more when its loop starts, and would otherwise
    # read the ALTER SYSTEM below before its first batch.
    marker = os.path.join(pg.datadir, "outbox_test_crash_fired")
    open(marker, "w").close()
    warm = [enqueue(pg, topic, "w", {"n": 0})]
    wait_until(lambda: published(pg, warm) == 1, 30, "a batch published in exactly_once")
    pg.sql("ALTER SYSTEM SET outbox.delivery = 'at_least_once'")  # read by the next worker process
    os.unlink(marker)
    ids = [enqueue(pg, topic, k, {"n": 1}) for k in ("a", "b", "c")]
    assert crash_and_restart(pg) == "after_kafka_commit"
    # The crash left the batch prepared; the new worker (at least once) rolls it back at its start,
    # maybe before this line runs: the log says which batch.
    in_doubt = wait_until(lambda: re.search(r'ROLLBACK PREPARED "(outbox:[^"]+)"', pg.log()), 30,
                          "the batch in doubt rolled back").group(1)
    ids += [enqueue(pg, topic, k, {"n": 2}) for k in ("a", "b", "c")]
    try:
        wait_until(lambda: published(pg, ids) == 6 and not pg.sql(OUR_PREPARED), 15,
                   "the batch in doubt decided and every event published")
    except Timeout:
        raise AssertionError(f"batch {in_doubt} left prepared for good, its slot publishing nothing: "
                             f"{picture(pg)}") from None
    counts = Counter(r.event_id for r in read_all(kafka, topic, "read_committed"))
    assert all(counts[i] >= 1 for i in ids), f"lost: {[i for i in ids if counts[i] == 0]}"
    assert "outbox.delivery is at_least_once: ROLLBACK PREPARED" in pg.log()


# -- (c) the settings --------------------------------------------------------------------------

@pytest.mark.parametrize("setting, value", [("delivery", "at_least_once"), ("transactional_id_prefix", "mallory"),
                                            ("progress_topic", "mallory.progress")])
def test_a_role_without_the_right_cannot_change_how_the_relay_delivers(kafka, make_relay, setting, value):
    # Holds: the exactly_once settings are the operator's (SIGHUP: configuration files, ALTER SYSTEM):
    # a session's SET, a role's or a database owner's ALTER ... SET and ALTER SYSTEM are refused.
    pg = eos_relay(make_relay, kafka)
    pg.sql("CREATE ROLE mallory LOGIN")
    pg.sql("CREATE DATABASE mallorys OWNER mallory")
    before = pg.value(f"SELECT setting FROM pg_settings WHERE name = 'outbox.{setting}'")
    attempts = [("postgres", f"SET outbox.{setting} = '{value}'", "55P02"),
                ("postgres", f"ALTER ROLE mallory SET outbox.{setting} = '{value}'", "55P02"),
                ("mallorys", f"ALTER DATABASE mallorys SET outbox.{setting} = '{value}'", "55P02"),
                ("postgres", f"ALTER SYSTEM SET outbox.{setting} = '{value}'", "42501")]
    for dbname, statement, sqlstate in attempts:
        with psycopg.connect(host=pg.tmp, port=pg.port, user="mallory", dbname=dbname, autocommit=True) as c:
            with pytest.raises(psycopg.Error) as refused:
                c.execute(statement)
            assert refused.value.sqlstate == sqlstate, (statement, refused.value)
    pg.reload()
    assert pg.value(f"SELECT setting FROM pg_settings WHERE name = 'outbox.{setting}'") == before
