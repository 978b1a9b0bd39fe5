"""Exactly once to read_committed consumers (issue 18, point 4), against the real broker (harness
KafkaBroker, Kafka 4.1): outbox.delivery = 'exactly_once' publishes each batch in one Kafka
transaction with the group offset of the worker's transactional id, the batch's Postgres record
prepared before the Kafka commit and decided by that offset after any crash.

What a read_committed consumer (confluent_kafka, and kcat where it is cheap) reads back must be
every committed event exactly once (by the relay's event_id header), per key in commit order, and
nothing else, through:

- a SIGKILL of the relay worker at each point of a batch (outbox.test_crash_at, test builds):
  after the claim, after the produce, after the PREPARE, after the Kafka commit, after the
  Postgres commit. After the produce and after the PREPARE the batch's records are in the log in
  a transaction that is aborted and sent again: a read_uncommitted consumer reads them twice, the
  read_committed one once (so the check can fail); at the other points nothing is produced twice
  at all. The group offset equals the Kafka transactions that committed (the broker's commit
  markers), and no prepared 'outbox:%' transaction is left;
- immediate stops of Postgres while events flow;
- a SIGKILL of the broker and its restart while events flow;
- a lane moving between workers (ALTER DATABASE ... SET outbox.workers from 1 to 2) while events
  flow;
- and exactly_once without max_prepared_transactions is 'misconfigured' and publishes nothing
  (until the restart that gives it prepared transactions).

Events are enqueued in business transactions committed one after another (commit order is the
order they were written), with ids of the test's own: a transaction whose commit a crash cut off
is committed again, and enqueue's dedup on the id makes that a no-op if it had committed. One
broker for the module (the broker SIGKILL test runs last), one cluster per test."""

import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections import Counter, namedtuple

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from harness.kafka_broker import KafkaBroker
from harness.wait import Timeout, wait_until

PROGRESS_TOPIC = "outbox.progress"  # outbox.progress_topic's default
CRASH_POINTS = ("after_claim", "after_produce", "after_prepare", "after_kafka_commit", "after_postgres_commit")
# The batch's records are in the log, in a Kafka transaction the crash leaves open: aborted by the
# next worker's init_transactions, then produced again.
PRODUCED_TWICE = {"after_produce", "after_prepare"}
# The crash leaves the batch's Postgres transaction prepared: recovery restores it.
IN_DOUBT = {"after_prepare", "after_kafka_commit"}
# A prepared batch's gid is outbox:<transactional id>:<batch>:<nonce> (docs/exactly-once.md); the
# nonce (hex so far) is not the test's business.
GID_SUFFIX = ":[^:]+"
PREPARED = "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'outbox:%'"

Record = namedtuple("Record", "partition offset key event_id")
# A record batch of a partition's log: kind 'data', 'COMMIT' or 'ABORT' (a transaction marker).
Batch = namedtuple("Batch", "kind transactional base_offset records producer_id producer_epoch")


# --- the broker -------------------------------------------------------------------------------

class Broker(KafkaBroker):
    """The harness's broker (which kill() and restart() SIGKILL and start again on its own data and
    ports), with its partitions' record batches read from its log segments."""

    def log_batches(self, topic, partition=0):
        """The record batches of a partition's log, in log order, read from the broker's segments:
        Batch(kind 'data', or 'COMMIT' / 'ABORT' for a transaction marker (a control batch; its
        record's key is version int16, type int16), transactional, base offset, records, producer).
        Record batch v2 header: baseOffset int64, batchLength int32, partitionLeaderEpoch int32,
        magic int8, crc int32, attributes int16 (bit 4 transactional, bit 5 control), lastOffsetDelta
        int32, two timestamps int64, producerId int64 at 43, producerEpoch int16, baseSequence int32,
        recordCount int32 at 57, the records from 61 (Kafka's protocol guide, "Record Batch")."""
        self._require_running()
        directory = os.path.join(self.tmpdir, "data", f"{topic}-{partition}")
        out = []
        for name in sorted(os.listdir(directory)):
            if not name.endswith(".log"):
                continue
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
            at = 0
            while at + 61 <= len(data):
                length = int.from_bytes(data[at + 8:at + 12], "big", signed=True)
                if length <= 0 or at + 12 + length > len(data):
                    break
                assert data[at + 16] == 2, f"{name}: a record batch of format {data[at + 16]}"
                attributes = int.from_bytes(data[at + 21:at + 23], "big")
                kind = _control_type(data, at + 61) if attributes & 0x20 else "data"
                out.append(Batch(kind, bool(attributes & 0x10), int.from_bytes(data[at:at + 8], "big"),
                                 int.from_bytes(data[at + 57:at + 61], "big"),
                                 int.from_bytes(data[at + 43:at + 51], "big", signed=True),
                                 int.from_bytes(data[at + 51:at + 53], "big", signed=True)))
                at += 12 + length
        return out


def _varint(data, at):
    """A zigzag varint at `at`: (value, position after it)."""
    shift = result = 0
    while True:
        b = data[at]
        at += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7


def _control_type(data, at):
    _, at = _varint(data, at)  # record length
    at += 1  # attributes int8
    _, at = _varint(data, at)  # timestampDelta
    _, at = _varint(data, at)  # offsetDelta
    key_length, at = _varint(data, at)
    assert key_length >= 4, "a control record without its key"
    kind = int.from_bytes(data[at + 2:at + 4], "big")
    return {0: "ABORT", 1: "COMMIT"}.get(kind, f"control type {kind}")


@pytest.fixture(scope="module")
def kafka():
    with Broker() as kb:
        yield kb


def new_topic(kafka, partitions=1):
    name = "eos-" + uuid.uuid4().hex[:12]
    kafka.create_topic(name, partitions=partitions)
    return name


# --- reading back ------------------------------------------------------------------------------

def consumer(kafka, isolation, **more):
    return Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "eos-test-reader", "enable.auto.commit": False,
                     "isolation.level": isolation, "socket.connection.setup.timeout.ms": 5000, **more})


def end_offsets(kafka, topic, isolation):
    """{partition: end offset}: the high watermark for read_uncommitted, the last stable offset
    (no record of an open transaction at or after it) for read_committed."""
    c = consumer(kafka, isolation)
    try:
        partitions = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in partitions}
    finally:
        c.close()


def read_all(kafka, topic, isolation, timeout=60):
    """Every record of the topic a consumer of `isolation` reads, once no transaction is open on
    any partition (last stable offset = high watermark: nothing left to decide), read up to that
    end. Exact, where read_topic(settle=True) would have to wait for quiet."""
    ends = wait_until(lambda: (lambda lso, hw: lso == hw and hw)(end_offsets(kafka, topic, "read_committed"),
                                                                end_offsets(kafka, topic, "read_uncommitted")),
                      timeout, f"no open Kafka transaction on {topic}")
    c = consumer(kafka, isolation, **{"enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        records, reached = [], {p: end == 0 for p, end in ends.items()}
        deadline = time.monotonic() + timeout
        while not all(reached.values()):
            assert time.monotonic() < deadline, f"{isolation} read of {topic} did not reach {ends}"
            for m in c.consume(1000, 0.2):
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    if m.offset() >= ends[m.partition()]:
                        reached[m.partition()] = True
                    continue
                headers = {k: v.decode() for k, v in (m.headers() or []) if v is not None}
                records.append(Record(m.partition(), m.offset(), m.key().decode(), headers.get("event_id")))
        return records
    finally:
        c.close()


def kcat_event_ids(kafka, topic, isolation):
    """The event_id headers kcat reads (run after read_all: nothing open), in its order."""
    out = subprocess.run(["kcat", "-b", kafka.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
                          "-X", f"isolation.level={isolation}", "-f", "%p %o %h\\n"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    found = []
    for line in out.splitlines():
        partition, offset, headers = line.split(" ", 2)
        m = re.search(r"(?:^|,)event_id=([0-9a-f-]{36})", headers)
        found.append((int(partition), int(offset), m.group(1) if m else None))
    return [eid for _, _, eid in sorted(found)]


def ids_in_log_order(records):
    return [r.event_id for r in sorted(records, key=lambda r: (r.partition, r.offset))]


def assert_exactly_once(records, flow, what="read_committed"):
    """Every event the flow committed, once, per key in commit order, and nothing else."""
    counts = Counter(r.event_id for r in records)
    twice = {eid: n for eid, n in counts.items() if n > 1}
    expected = {eid for _, eid in flow.events}
    missing = expected - counts.keys()
    phantoms = counts.keys() - expected
    assert not twice and not missing and not phantoms, \
        f"{what}: {len(twice)} read more than once {list(twice.items())[:5]}, {len(missing)} missing " \
        f"{sorted(missing)[:5]}, {len(phantoms)} never enqueued {sorted(phantoms)[:5]} " \
        f"(of {len(expected)} committed, {len(records)} read)"
    key_of = dict((eid, key) for key, eid in flow.events)
    assert all(r.key == key_of[r.event_id] for r in records), f"{what}: a record under another key"
    for key, ids in flow.by_key().items():
        got = [r.event_id for r in sorted(records, key=lambda r: (r.partition, r.offset)) if r.key == key]
        assert got == ids, f"{what}: key {key} out of commit order"


def kcat_agrees(kafka, topic, records, isolation):
    if shutil.which("kcat"):
        assert kcat_event_ids(kafka, topic, isolation) == ids_in_log_order(records), f"kcat {isolation} read otherwise"


# --- the relay's identity in Kafka ---------------------------------------------------------------

def transactional_id(pg, workers, worker, prefix="outbox"):
    sysid = int(pg.value("SELECT system_identifier FROM pg_control_system()")) % 2 ** 64
    oid = pg.value("SELECT oid FROM pg_database WHERE datname = current_database()")
    return f"{prefix}-{sysid}-{oid}-{workers}-{worker}"


def group_offset(kafka, group):
    """The group's committed offset on partition 0 of the progress topic, read read_committed
    (require_stable: no answer while a transaction holding it is open); 0 when it has none."""
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        offset = c.committed([TopicPartition(PROGRESS_TOPIC, 0)], timeout=30)[0].offset
        return max(offset, 0)
    finally:
        c.close()


def markers(kafka, topic):
    batches = kafka.log_batches(topic)
    return Counter(b.kind for b in batches), batches


# --- the business side ---------------------------------------------------------------------------

class Flow:
    """Business transactions on `topic`, committed one after another (commit order = the order of
    self.events), each of `per_txn` events over keys taken in turn, with the test's own event ids.
    A transaction whose connection a crash or a stop cut is written again whole on a new
    connection: if it had committed, enqueue finds every id taken (NULL) and adds nothing."""

    def __init__(self, pg, topic, keys=4, per_txn=3):
        self.pg, self.topic, self.keys, self.per_txn = pg, topic, keys, per_txn
        self.events = []  # (key, event_id), commit order
        self.transactions = 0
        self.redone = 0  # transactions written again after a cut connection
        self.conn = None
        self._n = 0

    def commit_one(self, timeout=120):
        rows = []
        for _ in range(self.per_txn):
            rows.append((f"k{self._n % self.keys}", str(uuid.uuid4()), self._n))
            self._n += 1
        attempts = []

        def attempt():
            attempts.append(1)
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = self.pg.connect(autocommit=False)
                added = [self.conn.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb, NULL, %s::uuid)::text",
                                           (self.topic, key, f'{{"key": "{key}", "n": {n}}}', eid)).fetchone()[0]
                         for key, eid, n in rows]
                self.conn.commit()
                return [added]
            except BaseException:
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                raise
        [added] = wait_until(attempt, timeout, "a business transaction committed")
        # All or nothing: a transaction written again finds all its ids taken (NULL) or none.
        assert added == [eid for _, eid, _ in rows] or (len(attempts) > 1 and added == [None] * len(rows)), added
        self.redone += len(attempts) > 1
        self.events.extend((key, eid) for key, eid, _ in rows)
        self.transactions += 1

    def commit(self, n):
        for _ in range(n):
            self.commit_one()

    def by_key(self):
        out = {}
        for key, eid in self.events:
            out.setdefault(key, []).append(eid)
        return out

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Writer(threading.Thread):
    """Commits transactions of a Flow one after another, as fast as it can, in the background
    until the with block ends (or `limit` transactions): the events that flow while a test stops
    Postgres, kills the broker or moves a lane."""

    def __init__(self, flow, limit=5000):
        super().__init__(daemon=True)
        self.flow, self.limit, self.error = flow, limit, None
        self.halt = threading.Event()

    @property
    def committed(self):
        return self.flow.transactions

    def run(self):
        try:
            while not self.halt.is_set() and self.flow.transactions < self.limit:
                self.flow.commit_one()
        except BaseException as e:  # noqa: B036 -- re-raised in the test's thread
            self.error = e

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.halt.set()
        self.join(300)
        assert not self.is_alive(), "the writer did not finish"
        if self.error is not None and exc[0] is None:
            raise self.error


def eos_relay(make_relay, kafka, workers=1, prepared=4, **outbox):
    return make_relay(kafka.bootstrap, workers=workers, delivery="exactly_once",
                      server={"max_prepared_transactions": str(prepared)}, **outbox)


def relay_state(pg):
    return pg.sql("SELECT (SELECT count(*) FROM outbox.events WHERE status = 'published'), "
                  f"(SELECT count(*) FROM outbox.events WHERE status <> 'published'), ({PREPARED})")[0]


def wait_relayed(pg, flow, timeout=90):
    """Every event of the flow published, nothing else in the table, no batch in doubt."""
    want = (len(flow.events), 0, 0)
    try:
        wait_until(lambda: relay_state(pg) == want, timeout, f"{want[0]} events published, none prepared")
    except Timeout:
        raise AssertionError(f"published, other, prepared = {relay_state(pg)}, not {want}; "
                             f"workers {pg.workers()}")


def warm_up(pg, flow):
    """One transaction through: the producer initialised, the progress topic made, the group's
    first offset committed."""
    flow.commit(1)
    wait_relayed(pg, flow)


# --- a worker killed at each point of a batch ------------------------------------------------------

CRASH_LINE = re.compile(r"\[(\d+)\] [^\n]*test_crash_at: crashing at (\S+)")


@pytest.mark.parametrize("point,first_batch", [(point, False) for point in CRASH_POINTS] +
                         [("after_prepare", True), ("after_kafka_commit", True)],
                         ids=[*CRASH_POINTS, "after_prepare-first_batch", "after_kafka_commit-first_batch"])
def test_worker_killed_at_each_point_of_a_batch_publishes_every_event_once(kafka, make_relay, point, first_batch):
    """first_batch: the crash hits the slot's very first batch, when its group has no committed
    offset yet (recovery must take "none" for 0, not for a lost one); else a batch after one that
    committed."""
    topic = new_topic(kafka)  # one partition: each committed batch leaves one COMMIT marker there
    pg = eos_relay(make_relay, kafka, **({"test_crash_at": point} if first_batch else {}))
    pg.wait_workers_running(1)
    tid = transactional_id(pg, 1, 0)
    flow = Flow(pg, topic, keys=4, per_txn=3)
    victim = pg.worker_pids()[0]
    log_from = len(pg.log())
    if not first_batch:
        warm_up(pg, flow)
        assert group_offset(kafka, tid) >= 1, f"no committed offset for group {tid} on {PROGRESS_TOPIC}"
        pg.set(test_crash_at=point)
        # A new session sees the value once the postmaster took the reload and signalled its children.
        wait_until(lambda: pg.value("SHOW outbox.test_crash_at") == point, 10, "the reload")

    # Transactions one after another until the worker kills itself in a batch of them, and more
    # while it is down (written again where the crash restart cut their connection).
    def crashed():
        return CRASH_LINE.search(pg.log(), log_from)
    for _ in range(300):
        flow.commit_one()
        if crashed():
            break
    line = crashed()
    assert line, f"no 'test_crash_at: crashing at {point}' after {flow.transactions} transactions"
    pid = int(line.group(1))
    pg.expect_killed(pid)  # the relay's own SIGKILL (outbox.test_crash_at)
    assert (pid, line.group(2)) == (victim, point), line.group(0)
    flow.commit(5)
    wait_until(lambda: f"(PID {pid}) was terminated by signal 9" in pg.log(), 60, "the postmaster saw the SIGKILL")

    # The launcher starts the worker again; it decides what the crash left and relays the rest.
    seen_gids = set()

    def restarted_and_decided():
        seen_gids.update(g for (g,) in pg.sql("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'outbox:%'"))
        return pg.worker_pids()[0] not in (None, victim) and relay_state(pg)[2] == 0
    wait_until(restarted_and_decided, 90, "a new worker and no batch in doubt", interval=0.01)
    flow.commit(5)  # and the new worker relays new ones
    wait_relayed(pg, flow)
    flow.close()
    log = pg.log()[log_from:]
    assert len(CRASH_LINE.findall(pg.log())) == 1, "test_crash_at fired more than once"
    assert os.path.exists(os.path.join(pg.datadir, "outbox_test_crash_fired"))
    # Recovery restored the batch's prepared transaction exactly when the crash left one.
    assert ("recovering prepared transaction" in log) == (point in IN_DOUBT), log[-3000:]
    final = group_offset(kafka, tid)
    for gid in seen_gids:  # caught between the restart and the decision
        m = re.fullmatch(rf"outbox:{re.escape(tid)}:(\d+){GID_SUFFIX}", gid)
        assert m and 1 <= int(m.group(1)) <= final, (gid, tid, final)

    committed = read_all(kafka, topic, "read_committed")
    assert_exactly_once(committed, flow)
    kcat_agrees(kafka, topic, committed, "read_committed")
    uncommitted = read_all(kafka, topic, "read_uncommitted")
    kcat_agrees(kafka, topic, uncommitted, "read_uncommitted")
    kinds, batches = markers(kafka, topic)
    assert all(b.transactional for b in batches), "a record batch outside a transaction"
    # Kafka's ledger: the group's offset counts the batches that committed, one marker each.
    assert final == kinds["COMMIT"], (final, kinds)
    read_twice = {eid for eid, n in Counter(r.event_id for r in uncommitted).items() if n > 1}
    print(f"{point}{' (first batch)' if first_batch else ''}: {len(flow.events)} events in {flow.transactions} transactions ({flow.redone} written again), "
          f"group offset {final}, markers {dict(kinds)}, prepared seen {sorted(seen_gids)}, "
          f"read_uncommitted {len(uncommitted)} ({len(read_twice)} twice)")
    if point in PRODUCED_TWICE:
        # The aborted transaction's records are in the log: a read_uncommitted consumer reads
        # them and their resend; a read_committed one (above) each once.
        assert kinds["ABORT"] >= 1, kinds
        assert read_twice, "read_uncommitted saw no record twice: the crash aborted nothing"
        assert set(r.event_id for r in uncommitted) == set(r.event_id for r in committed)
        assert len(uncommitted) > len(committed)
        with pytest.raises(AssertionError, match="read more than once"):  # the check sees them
            assert_exactly_once(uncommitted, flow, "read_uncommitted")
    else:
        # Nothing was produced twice, not even into an aborted transaction.
        assert kinds["ABORT"] == 0 and not read_twice, (kinds, sorted(read_twice)[:5])
        assert ids_in_log_order(uncommitted) == ids_in_log_order(committed)


# --- Postgres stopped -m immediate while events flow -------------------------------------------------

def in_doubt_now(pg, timeout=5):
    """The gids of the relay's prepared batches, caught within `timeout` s (polled without pause:
    a batch is in doubt for the few milliseconds of its Kafka commit), or [] if none showed."""
    with pg.connect() as probe:
        try:
            return wait_until(lambda: probe.execute("SELECT array_agg(gid) FROM pg_prepared_xacts "
                                                    "WHERE gid LIKE 'outbox:%'").fetchone()[0],
                              timeout, "a batch in doubt", interval=0)
        except Timeout:
            return []


def wait_progress(pg, since, what):
    """The relay has published more than `since` events (so it decided what a fault left first)."""
    wait_until(lambda: relay_state(pg)[0] > since, 120, f"the relay publishing again {what}")


def test_postgres_immediate_stops_while_events_flow_publish_every_event_once(kafka, make_relay):
    topic = new_topic(kafka, partitions=3)
    pg = eos_relay(make_relay, kafka, workers=2)
    pg.wait_workers_running(2)
    flow = Flow(pg, topic, keys=8, per_txn=3)
    warm_up(pg, flow)
    tids = [transactional_id(pg, 2, i) for i in range(2)]
    in_doubt = []  # the relay's prepared batches just before each stop
    with Writer(flow) as writer:
        for stop in range(2):
            mark = writer.committed
            wait_until(lambda: writer.committed >= mark + 50, 60, "50 more transactions committed")
            # Stop with a batch in doubt (its PREPARE done, its Kafka commit maybe not) if one
            # shows within a few seconds; the stop comes in any case.
            in_doubt.append(in_doubt_now(pg))
            published = relay_state(pg)[0]
            pg.stop("immediate")
            pg.start()
            wait_progress(pg, published, f"after stop {stop + 1}")
    wait_relayed(pg, flow)
    print(f"{len(flow.events)} events, {flow.redone} transactions written again, in doubt at the stops: {in_doubt}")
    for gid in sum(in_doubt, []):
        assert re.fullmatch(rf"outbox:({'|'.join(map(re.escape, tids))}):\d+{GID_SUFFIX}", gid), (gid, tids)
    committed = read_all(kafka, topic, "read_committed")
    assert_exactly_once(committed, flow)
    kcat_agrees(kafka, topic, committed, "read_committed")
    assert sum(group_offset(kafka, t) for t in tids) >= 2


# --- a lane moving between workers -------------------------------------------------------------------

def test_a_lane_moving_between_workers_while_events_flow_publishes_every_event_once(kafka, make_relay):
    topic = new_topic(kafka)  # one partition: the markers count every worker's committed batches
    pg = eos_relay(make_relay, kafka, workers=1)
    pg.wait_workers_running(1)
    flow = Flow(pg, topic, keys=8, per_txn=3)
    warm_up(pg, flow)
    with Writer(flow) as writer:
        wait_until(lambda: writer.committed >= 80, 60, "80 transactions committed")
        in_doubt = in_doubt_now(pg)  # move while worker 0 of 1 has a batch in doubt, if one shows
        pending = relay_state(pg)[1]
        pg.sql("ALTER DATABASE postgres SET outbox.workers = 2", dbname="postgres")
        pg.reload()
        # Both workers of 2 publish while events go on flowing.
        wait_until(lambda: (lambda w: len(w) == 2 and all(r[1] and r[3] > 0 for r in w))(pg.workers()), 90,
                   "both workers of 2 publishing")
    wait_relayed(pg, flow)
    committed = read_all(kafka, topic, "read_committed")
    assert_exactly_once(committed, flow)
    kcat_agrees(kafka, topic, committed, "read_committed")
    before, after = group_offset(kafka, transactional_id(pg, 1, 0)), \
        [group_offset(kafka, transactional_id(pg, 2, i)) for i in range(2)]
    kinds, batches = markers(kafka, topic)
    print(f"{len(flow.events)} events, offsets {before} then {after}, markers {dict(kinds)}, "
          f"pending at the move {pending}, in doubt {in_doubt}")
    assert all(b.transactional for b in batches)
    assert before >= 1 and all(after), (before, after)
    # Every committed batch of the three identities is one COMMIT marker in the partition.
    assert before + sum(after) == kinds["COMMIT"], (before, after, kinds)


# --- exactly_once needs prepared transactions ---------------------------------------------------------

def test_exactly_once_without_prepared_transactions_is_misconfigured_and_publishes_nothing(kafka, make_relay):
    topic = new_topic(kafka)
    pg = eos_relay(make_relay, kafka, prepared=0, poll_interval="100ms")
    wait_until(lambda: pg.workers()[0][2] == "misconfigured", 30, "the worker misconfigured")
    assert "max_prepared_transactions" in (pg.workers()[0][5] or ""), pg.workers()
    flow = Flow(pg, topic)
    flow.commit(1)
    # Pending, and it stays so (the commit woke the worker; twenty poll intervals pass).
    with pytest.raises(Timeout):
        wait_until(lambda: relay_state(pg)[0] or end_offsets(kafka, topic, "read_uncommitted")[0], 2,
                   "anything published")
    assert pg.value("SELECT status FROM outbox.events") == "pending"
    assert pg.workers()[0][2] == "misconfigured"
    assert read_all(kafka, topic, "read_uncommitted") == []
    assert group_offset(kafka, transactional_id(pg, 1, 0)) == 0
    # The fix is a restart with prepared transactions: then it goes out, once.
    pg.sql("ALTER SYSTEM SET max_prepared_transactions = 4")
    flow.close()
    pg.restart()
    wait_relayed(pg, flow)
    committed = read_all(kafka, topic, "read_committed")
    assert_exactly_once(committed, flow)
    assert group_offset(kafka, transactional_id(pg, 1, 0)) == 1


# --- the broker SIGKILLed and restarted while events flow (last: it restarts the module's broker) -----

def test_broker_sigkill_and_restart_while_events_flow_publish_every_event_once(kafka, make_relay):
    topic = new_topic(kafka, partitions=3)
    pg = eos_relay(make_relay, kafka, workers=2)
    pg.wait_workers_running(2)
    flow = Flow(pg, topic, keys=8, per_txn=3)
    warm_up(pg, flow)
    tids = [transactional_id(pg, 2, i) for i in range(2)]
    with Writer(flow) as writer:
        wait_until(lambda: writer.committed >= 100, 60, "100 transactions committed")
        in_doubt = in_doubt_now(pg)  # kill while a batch is in doubt, if one shows
        kafka.kill()
        at_kill, pending_at_kill = writer.committed, relay_state(pg)
        wait_until(lambda: writer.committed >= at_kill + 100, 60, "100 more committed with the broker down")
    published = relay_state(pg)[0]
    kafka.restart()
    flow.commit(20)  # and more once it is back
    wait_progress(pg, published, "after the broker's restart")
    wait_relayed(pg, flow, timeout=180)
    committed = read_all(kafka, topic, "read_committed", timeout=120)
    uncommitted = read_all(kafka, topic, "read_uncommitted")
    # (The markers are not counted here: after its restart the broker may write a transaction's
    # markers again, as it finishes what its transaction log says it had not finished.)
    print(f"{len(flow.events)} events, {flow.redone} written again, offsets {[group_offset(kafka, t) for t in tids]}, "
          f"markers {[dict(Counter(b.kind for b in kafka.log_batches(topic, p))) for p in range(3)]}, "
          f"read_uncommitted {len(uncommitted)}, published/other/prepared at the kill {pending_at_kill}, "
          f"in doubt {in_doubt}")
    assert_exactly_once(committed, flow)
    kcat_agrees(kafka, topic, committed, "read_committed")
    assert sum(group_offset(kafka, t) for t in tids) >= 2
