"""Upgrading the schema under a running relay (issue 9 item 7, issue 17 item 5): a library newer
than the installed schema publishes nothing and says why; `ALTER EXTENSION outbox UPDATE` from
each released version, with events pending, failed and published and an application still
enqueueing, ends with every event in Kafka exactly once and in per-(topic, key) order; and the
updated schema is a fresh install's."""

import os
import re
import threading

import psycopg
import pytest

from harness.kafka_reader import read_topic
from harness.lock_waits import InThread, waiting_on_lock
from harness.wait import wait_until

# Every released version an update starts from (0.1.0 goes through 0.2.0, 0.3.0 and 0.4.0).
OLD_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0")
# The versions this library does not publish from: its relay waits for the update. (It still
# publishes from 0.3.0's table and 0.4.0's ring: a package upgrade stops no 0.3.0 or 0.4.0 relay.)
WAITED_FOR_VERSIONS = ("0.1.0", "0.2.0")
# The version an update ends at: the control file's default_version.
with open(os.path.join(os.path.dirname(__file__), "..", "outbox.control")) as control:
    NEW_VERSION = re.search(r"^default_version = '(.*)'", control.read(), re.M).group(1)
TOPICS = ("billing", "orders")  # made by the mock_cluster fixture
KEYS = 6
# What a worker says while the schema is older than its library (the relay waits, publishing
# nothing): its outbox.workers row and one server log line name both, so the operator knows
# exactly what to run.
WAITING_STATE = "misconfigured"
WAITING_HINT = "ALTER EXTENSION outbox UPDATE"


def event_shape(seq):
    """(topic, key) of the seq-th event: every key in both topics, every 11th event unkeyed."""
    topic = "orders" if seq % 5 == 0 else "billing"
    key = None if seq % 11 == 10 else f"k{seq % KEYS}"
    return topic, key


class Enqueued:
    """Event ids per (topic, key) in enqueue order, and every id's (topic, key). Only events
    enqueued one after the other (each committed before the next began) are appended, so the
    list order is the commit order the relay must keep."""

    def __init__(self):
        self.by_stream = {}
        self.stream_of = {}

    def add(self, topic, key, event_id):
        self.by_stream.setdefault((topic, key), []).append(event_id)
        self.stream_of[event_id] = (topic, key)

    def __len__(self):
        return len(self.stream_of)


def enqueue_one(conn, seq, enqueued):
    topic, key = event_shape(seq)
    event_id = conn.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)::text",
                            (topic, key, f'{{"seq": {seq}}}')).fetchone()[0]
    enqueued.add(topic, key, event_id)


class Enqueuer(threading.Thread):
    """The application, enqueueing on its own connection (autocommit: one event per
    transaction) from `first_seq` on until stopped; its errors fail the test."""

    def __init__(self, pg, first_seq, enqueued):
        super().__init__(daemon=True)
        self.conn = pg.connect()
        self.pid = self.conn.info.backend_pid
        self.seq = first_seq
        self.enqueued = enqueued
        self.count = 0
        self.stop = threading.Event()
        self.error = None

    def run(self):
        try:
            with self.conn:
                while not self.stop.is_set():
                    enqueue_one(self.conn, self.seq, self.enqueued)
                    self.seq += 1
                    self.count += 1
        except BaseException as e:  # noqa: B902 - reported by finish()
            self.error = e

    def finish(self):
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), "enqueuer did not stop"
        if self.error:
            raise self.error


def extension_version(pg, dbname=None):
    return pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname=dbname)


def wait_for_update_notice(pg, workers, old_version):
    """Every worker waiting for the update: its state, and both versions and the command in its
    last_error."""
    seen = []

    def waiting():
        seen[:] = pg.workers()
        return len(seen) == workers and all(
            r[2] == WAITING_STATE and r[5] and WAITING_HINT in r[5] and old_version in r[5] and NEW_VERSION in r[5]
            for r in seen)
    try:
        wait_until(waiting, 30, "workers waiting for the update")
    except AssertionError:
        raise AssertionError(f"want every worker {WAITING_STATE!r} with {WAITING_HINT!r}, {old_version!r} and "
                             f"{NEW_VERSION!r} in last_error; outbox.workers: {seen}") from None


def update_while_the_application_enqueues(pg, app, update_takes_the_table):
    """ALTER EXTENSION outbox UPDATE, held open until some enqueue of `app` certainly lands
    mid-update: one waits for the update's lock on the table (`update_takes_the_table`) or 20
    commit while it is open; then 30 more enqueues on the new version."""
    with pg.connect(autocommit=False) as updater:
        updater.execute("ALTER EXTENSION outbox UPDATE")
        if update_takes_the_table:
            wait_until(lambda: pg.value("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                        (app.pid,)) == "Lock", 30, "an enqueue waiting for the update")
        else:
            count_at_open = app.count
            wait_until(lambda: app.count >= count_at_open + 20, 30, "enqueues committing during the update")
        updater.commit()
    count_at_update = app.count
    wait_until(lambda: app.count >= count_at_update + 30, 30, f"the application enqueueing on {NEW_VERSION}")


def untouched_by_relay(pg):
    """Nothing claimed, published or charged an attempt since the test wrote the rows."""
    return pg.sql("""SELECT count(*) FILTER (WHERE status NOT IN ('pending', 'failed', 'published')
                                             OR claimed_at IS NOT NULL
                                             OR (status <> 'published' AND (published_at IS NOT NULL
                                                                            OR kafka_offset IS NOT NULL))),
                            count(*) FILTER (WHERE status = 'pending' AND attempts <> 0)
                     FROM outbox.events""")[0] == (0, 0)


@pytest.mark.parametrize("old_version", WAITED_FOR_VERSIONS)
def test_update_under_running_relay_publishes_every_event_once_in_order(mock_cluster, make_relay, old_version):
    workers = 2
    pg = make_relay(mock_cluster.bootstrap, workers=workers, create_extension=False, max_attempts=3)
    pg.sql(f"CREATE EXTENSION outbox VERSION '{old_version}'")
    pg.wait_workers_running(workers)
    enqueued = Enqueued()

    # 1. Pending events over several keys and topics, enqueued on the old schema.
    with pg.connect() as c:
        for seq in range(120):
            enqueue_one(c, seq, enqueued)
    # Failed events, as 0.1.0's relay would have left them after max_attempts broker refusals
    # (written directly: this library's relay must not publish from 0.1.0, so it cannot make
    # them fail itself): a key's first event, an event in the middle of a key, one in the other
    # topic, and an unkeyed one.
    failed = [enqueued.by_stream[("billing", "k1")][0], enqueued.by_stream[("billing", "k2")][2],
              enqueued.by_stream[("orders", "k3")][0], enqueued.by_stream[("billing", None)][0]]
    pg.sql("UPDATE outbox.events SET status = 'failed', attempts = 3, last_error = 'INVALID_RECORD (written by the test)' "
           "WHERE event_id = ANY(%s::uuid[])", (failed,))
    # Published events, as the old relay would have left them (also written directly): the first
    # events of two keys. Already in Kafka as far as the relay knows: never sent again.
    published_before = enqueued.by_stream[("billing", "k4")][:2] + enqueued.by_stream[("orders", "k5")][:1]
    pg.sql("UPDATE outbox.events SET status = 'published', published_at = now(), kafka_partition = 0, "
           "kafka_offset = 1000000 + id WHERE event_id = ANY(%s::uuid[])", (published_before,))

    # 2. The library is newer than the schema: the relay waits and says what to run.
    app = Enqueuer(pg, 120, enqueued)
    app.start()
    try:
        wait_for_update_notice(pg, workers, old_version)
        # Every enqueue commit wakes a worker: it looked at the table again and still left it alone.
        wait_until(lambda: app.count >= 20, 30, f"the application enqueueing on {old_version}")
        assert untouched_by_relay(pg)
        for i in range(workers):
            old, new, hint = re.escape(old_version), re.escape(NEW_VERSION), re.escape(WAITING_HINT)
            assert re.search(rf"outbox relay {i}: .*{old}.*{new}.*{hint}", pg.log()), \
                f"no log line of worker {i} naming {old_version}, {NEW_VERSION} and {WAITING_HINT}"

        # 3. The update, while the relay runs and the application enqueues, held open until some
        # enqueue certainly lands mid-update. From 0.1.0, and to 0.4.0 (the table becomes the
        # ring's first member behind a view), the update alters the table: an enqueue waits for
        # it (nothing can read or write the table meanwhile: no check in between). From 0.2.0 to
        # 0.3.0 it leaves the table alone: enqueues go on committing while it is open.
        update_while_the_application_enqueues(pg, app, old_version == "0.1.0" or NEW_VERSION != "0.3.0")
    finally:
        app.finish()
    assert extension_version(pg) == NEW_VERSION

    # 4. Published now, except what a failed event holds back: with on_failed_event = block_key
    # (the default) a key's events after its failed one wait for it.
    rows = pg.sql("SELECT id, event_id::text, topic, key, status FROM outbox.events ORDER BY id")
    assert len(rows) == len(enqueued)
    first_failed = {}  # key -> (id, topic) of its earliest failed event
    for id_, event_id, topic, key, _ in rows:
        if event_id in failed and key is not None:
            first_failed.setdefault(key, (id_, topic))
    must_publish = [r[1] for r in rows if r[1] not in failed and (r[3] not in first_failed
                                                                  or r[0] < first_failed[r[3]][0])]
    published_now = "SELECT count(*) FROM outbox.events WHERE status = 'published' AND event_id = ANY(%s::uuid[])"
    wait_until(lambda: pg.value(published_now, (must_publish,)) == len(must_publish), 60,
               f"{len(must_publish)} events not held back by a failed one published")
    wait_until(lambda: all(r[2] != WAITING_STATE for r in pg.workers()), 30, "workers out of the waiting state")
    # (A key's events in the other topic are left out: whether a failed event holds back its key
    # or its (topic, key) is the claim's business, not this test's.)
    held_back = [r[1] for r in rows if r[3] in first_failed and r[2] == first_failed[r[3]][1]
                 and r[0] > first_failed[r[3]][0]]
    assert held_back, "the test needs events behind a failed one"
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status = 'pending' AND event_id = ANY(%s::uuid[])",
                    (held_back,)) == len(held_back), "an event went ahead of its key's failed predecessor"

    # 5. Retried: everything is published.
    assert pg.value("SELECT outbox.retry_failed()") == len(failed)
    pg.wait_published(len(enqueued), timeout=120)
    assert dict(pg.sql("SELECT status, count(*) FROM outbox.events GROUP BY status")) == {"published": len(enqueued)}

    # The events published before the update kept their rows (not sent again, below).
    assert pg.sql("SELECT count(*) FROM outbox.events WHERE event_id = ANY(%s::uuid[]) AND kafka_offset >= 1000000",
                  (published_before,)) == [(len(published_before),)]

    # 6. Kafka: every event not published before the update exactly once, each (topic, key) in
    # enqueue order. A retried event keeps its place: its key's later events waited behind it
    # (block_key), so a consumer sees the key's events in the order they were enqueued, as if the
    # event had never failed.
    for stream in enqueued.by_stream.values():
        stream[:] = [e for e in stream if e not in published_before]
    assert_in_kafka_once_in_order_where_recorded(mock_cluster, pg, enqueued)


@pytest.mark.parametrize("old_version", ("0.3.0", "0.4.0"))
def test_update_under_a_publishing_relay_and_enqueues(mock_cluster, make_relay, old_version):
    """0.3.0, the version before the ring, and 0.4.0, the ring that indexed every event id: this
    library's relay publishes from both, so it goes on publishing up to the update and from the
    ring after it, two workers, while the application enqueues throughout (an enqueue waits for
    the update). Every event reaches Kafka once, in per-(topic, key) order, at the position
    recorded for it."""
    workers = 2
    pg = make_relay(mock_cluster.bootstrap, workers=workers, create_extension=old_version)
    pg.wait_workers_running(workers)
    enqueued = Enqueued()
    app = Enqueuer(pg, 0, enqueued)
    app.start()
    try:
        wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'") >= 20, 60,
                   f"the relay publishing from {old_version}")
        update_while_the_application_enqueues(pg, app, True)
    finally:
        app.finish()
    assert extension_version(pg) == NEW_VERSION
    pg.wait_published(len(enqueued), timeout=120)
    assert pg.sql("SELECT count(*), count(DISTINCT id) FROM outbox.events") == [(len(enqueued),) * 2]
    assert_in_kafka_once_in_order_where_recorded(mock_cluster, pg, enqueued)


def assert_in_kafka_once_in_order_where_recorded(mock_cluster, pg, enqueued):
    """Every event of `enqueued` read back from Kafka exactly once, nothing else, each at the
    partition and offset its row records, each (topic, key) on one partition in enqueue order."""
    positions = {r[0]: (r[1], r[2]) for r in pg.sql("SELECT event_id::text, kafka_partition, kafka_offset "
                                                    "FROM outbox.events")}
    for topic in TOPICS:
        want = sum(len(ids) for (t, _), ids in enqueued.by_stream.items() if t == topic)
        records = read_topic(mock_cluster.bootstrap, topic, want, settle=True)
        ids = [r.event_id for r in records]
        assert len(ids) == len(set(ids)), f"{topic}: {len(ids) - len(set(ids))} duplicates"
        assert set(ids) == {e for (t, _), es in enqueued.by_stream.items() if t == topic for e in es}, \
            f"{topic}: lost or foreign events"
        for r in records:
            assert positions[r.event_id] == (r.partition, r.offset), f"{r.event_id}: recorded position differs"
            assert (topic, r.key.decode() if r.key is not None else None) == enqueued.stream_of[r.event_id]
        appended = {}
        for r in sorted(records, key=lambda r: (r.partition, r.offset)):
            appended.setdefault(r.key, []).append((r.partition, r.event_id))
        for (t, key), expected in enqueued.by_stream.items():
            if t != topic or key is None:
                continue  # unkeyed events have no order to keep
            got = appended[key.encode()]
            assert len({p for p, _ in got}) == 1, f"({topic}, {key}) spread over partitions"
            assert [e for _, e in got] == expected, f"({topic}, {key}) out of enqueue order"


@pytest.mark.parametrize("old_version", OLD_VERSIONS)
def test_update_waits_for_enqueues_under_way_and_gives_no_id_twice(mock_cluster, make_relay, old_version):
    """An enqueue that holds the table from before the update and draws another id while the
    update waits for it: the update's new id sequence starts above that id too. (0.4.0's members
    draw ids from a plain sequence set above every id given so far; with the ids read before the
    table was locked, the next enqueue after the update got an id already taken, and the relay,
    which records where an event landed by id, recorded one of the two as published unsent.)"""
    pg = make_relay(mock_cluster.bootstrap, workers=1, create_extension=False)
    pg.sql(f"CREATE EXTENSION outbox VERSION '{old_version}'")
    enqueued = Enqueued()
    with pg.connect(autocommit=False) as app, pg.connect() as updater:
        enqueue_one(app, 0, enqueued)
        update = InThread(updater, "ALTER EXTENSION outbox UPDATE")
        wait_until(lambda: waiting_on_lock(pg, updater), 30, "the update waiting for the open enqueue")
        enqueue_one(app, 1, enqueued)
        app.commit()
        update.join()
    assert extension_version(pg) == NEW_VERSION
    with pg.connect() as app:
        for seq in range(2, 8):
            enqueue_one(app, seq, enqueued)
    assert pg.sql("SELECT count(*), count(DISTINCT id) FROM outbox.events") == [(8, 8)]
    pg.wait_published(8)
    assert_in_kafka_once_in_order_where_recorded(mock_cluster, pg, enqueued)


def test_update_to_the_ring_runs_at_read_uncommitted(make_relay, mock_cluster):
    """READ UNCOMMITTED is READ COMMITTED in PostgreSQL (a snapshot per statement): not refused."""
    pg = make_relay(mock_cluster.bootstrap, workers=0, create_extension="0.3.0")
    with pg.connect(autocommit=False) as updater:
        updater.execute("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
        updater.execute("ALTER EXTENSION outbox UPDATE")
        updater.commit()
    assert extension_version(pg) == NEW_VERSION


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_update_to_the_ring_is_refused_above_read_committed(make_relay, mock_cluster, level):
    """At REPEATABLE READ or SERIALIZABLE the update's statements share one snapshot, taken before
    it waits for the table: the events it moves into the ring's tables would miss one committed
    meanwhile (left below ring_start, never sent). Refused, nothing changed; at READ COMMITTED it
    goes through and the event is published. A new install at those levels is not refused."""
    pg = make_relay(mock_cluster.bootstrap, workers=1, create_extension=False)
    pg.sql("CREATE EXTENSION outbox VERSION '0.3.0'")
    enqueued = Enqueued()
    with pg.connect(autocommit=False) as app, pg.connect(autocommit=False) as updater:
        enqueue_one(app, 0, enqueued)
        update = InThread(updater, f"SET TRANSACTION ISOLATION LEVEL {level}", "ALTER EXTENSION outbox UPDATE",
                          "COMMIT")
        # Refused at once, or (were it let through) waiting for the open enqueue's table lock.
        wait_until(lambda: not update.thread.is_alive() or waiting_on_lock(pg, updater), 30,
                   "the update refused or waiting")
        app.commit()
        update.thread.join(60)
        assert not update.thread.is_alive(), "the update still runs"
        updater.rollback()
    refused = update.error
    assert refused is not None, f"the update ran at {level.upper()}"
    assert refused.sqlstate == "0A000", refused
    assert f"must run at READ COMMITTED, not {level.upper()}" in str(refused)
    assert "BEGIN ISOLATION LEVEL READ COMMITTED" in refused.diag.message_hint
    assert extension_version(pg) == "0.3.0"
    assert pg.value("SELECT to_regclass('outbox.landed')") is None
    assert pg.value("SELECT count(*) FROM outbox.events") == 1
    pg.sql("ALTER EXTENSION outbox UPDATE")
    assert extension_version(pg) == NEW_VERSION
    pg.wait_published(1)
    assert_in_kafka_once_in_order_where_recorded(mock_cluster, pg, enqueued)
    pg.sql("CREATE DATABASE fresh", dbname="postgres")
    with pg.connect(dbname="fresh", autocommit=False) as c:
        c.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        c.execute("CREATE EXTENSION outbox")
        c.commit()
    assert extension_version(pg, "fresh") == NEW_VERSION


# --- the updated schema is a fresh install's -----------------------------------------------------

# Everything an install defines, in a form that does not depend on OIDs. (pg_dump prints only
# CREATE EXTENSION for an extension's members, so the catalogs are compared instead.) Column
# order is left out: ADD COLUMN can only append, a fresh script may place a column anywhere.
SCHEMA_QUERIES = {
    "members": """SELECT pg_describe_object(d.classid, d.objid, d.objsubid) FROM pg_depend d
                  JOIN pg_extension x ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = x.oid
                  WHERE x.extname = 'outbox' AND d.deptype = 'e' ORDER BY 1""",
    "extension": """SELECT extversion, extrelocatable, extnamespace::regnamespace::text,
                           ARRAY(SELECT c::regclass::text || ' ' || coalesce(w, '')
                                 FROM unnest(extconfig, extcondition) AS u(c, w) ORDER BY 1)
                    FROM pg_extension WHERE extname = 'outbox'""",
    "schema": "SELECT nspacl::text, obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = 'outbox'",
    "relations": """SELECT relname, relkind, relpersistence, relacl::text, reloptions::text, relrowsecurity,
                           relforcerowsecurity, obj_description(oid, 'pg_class'),
                           CASE WHEN relkind = 'v' THEN pg_get_viewdef(oid) END
                    FROM pg_class WHERE relnamespace = 'outbox'::regnamespace ORDER BY 1""",
    "columns": """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
                         a.attgenerated, pg_get_expr(d.adbin, d.adrelid), a.attacl::text, a.attcollation::regcollation::text
                  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                  WHERE c.relnamespace = 'outbox'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
                  ORDER BY 1, 2""",
    "constraints": """SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid), convalidated,
                             condeferrable, condeferred
                      FROM pg_constraint WHERE connamespace = 'outbox'::regnamespace ORDER BY 1, 2""",
    "indexes": """SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), i.indisvalid
                  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
                  WHERE c.relnamespace = 'outbox'::regnamespace ORDER BY 1""",
    "sequences": """SELECT s.seqrelid::regclass::text, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
                           s.seqmax, s.seqmin, s.seqcache, s.seqcycle
                    FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
                    WHERE c.relnamespace = 'outbox'::regnamespace ORDER BY 1""",
    "triggers": """SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
                   WHERE tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'outbox'::regnamespace)
                   ORDER BY 1, 2""",
    "functions": """SELECT oid::regprocedure::text, pg_get_functiondef(oid), proacl::text, obj_description(oid, 'pg_proc')
                    FROM pg_proc WHERE pronamespace = 'outbox'::regnamespace ORDER BY 1""",
}


def schema_of(pg, dbname):
    return {name: pg.sql(query, dbname=dbname) for name, query in SCHEMA_QUERIES.items()}


@pytest.mark.parametrize("old_version", OLD_VERSIONS)
def test_updated_schema_equals_a_fresh_install(mock_cluster, make_relay, old_version):
    # No worker: the rows below must stay as written (a relay could publish the unkeyed event
    # before the hand-written 'failed', which the table's checks then refuse).
    pg = make_relay(mock_cluster.bootstrap, workers=0, create_extension=False)
    pg.sql(f"CREATE EXTENSION outbox VERSION '{old_version}'")
    # With rows in it, as an update meets the table: pending, failed and unkeyed.
    pg.sql("SELECT outbox.enqueue('billing', 'k', '{}'::jsonb), outbox.enqueue('billing', NULL, 'x'::text)")
    if old_version == "0.4.0":  # the view takes pending rows only: a caller's id instead
        pg.sql("SELECT outbox.enqueue('billing', 'k', '{}'::jsonb, NULL, gen_random_uuid())")
    else:
        pg.sql("UPDATE outbox.events SET status = 'failed', attempts = 3, last_error = 'e' WHERE key IS NULL")
    pg.sql("ALTER EXTENSION outbox UPDATE")
    assert extension_version(pg) == NEW_VERSION
    pg.sql("CREATE DATABASE fresh", dbname="postgres")
    pg.sql("CREATE EXTENSION outbox", dbname="fresh")
    assert extension_version(pg, "fresh") == NEW_VERSION
    updated, fresh = schema_of(pg, "postgres"), schema_of(pg, "fresh")
    for part in SCHEMA_QUERIES:
        assert updated[part] == fresh[part], f"{part} differ between the updated and a fresh install"


def test_update_from_0_4_0_keeps_every_id_deduplicated_and_indexes_only_callers_after(make_relay, mock_cluster):
    """0.4.0 -> 0.4.1: the rows already in the ring keep their event-id index entries
    (caller_event_id true: they were all unique-checked), so every id enqueued before the update,
    generated or given, is still a duplicate for a caller; after it, a generated id has no entry
    (not deduplicated, and refused when given back: 22023) and a caller's has one. Enqueue works on
    0.4.0 with this library too."""
    pg = make_relay(mock_cluster.bootstrap, workers=0, create_extension="0.4.0")
    given_before = "a7c0f2a6-0000-4000-8000-000000000041"
    with pg.connect() as c:
        generated_before = c.execute("SELECT outbox.enqueue('billing', 'k', 'x'::text)::text").fetchone()[0]
        assert c.execute("SELECT outbox.enqueue('billing', 'k', 'x'::text, NULL, %s)::text",
                         (given_before,)).fetchone()[0] == given_before
        assert c.execute("SELECT outbox.enqueue('billing', 'k', 'x'::text, NULL, %s)", (given_before,)).fetchone()[0] is None
        # The same backend across the update: its kept plans and the member's shape follow it.
        c.execute("ALTER EXTENSION outbox UPDATE")
        assert extension_version(pg) == NEW_VERSION
        assert c.execute("SELECT count(*) FILTER (WHERE caller_event_id), count(*) FROM outbox.events_0").fetchone() == (2, 2)
        for old_id in (generated_before, given_before):
            assert c.execute("SELECT outbox.enqueue('billing', 'k', 'x'::text, NULL, %s)", (old_id,)).fetchone()[0] is None
        generated_after = c.execute("SELECT outbox.enqueue('billing', 'k', 'x'::text)::text").fetchone()[0]
        assert c.execute("SELECT caller_event_id FROM outbox.events_0 WHERE event_id = %s",
                         (generated_after,)).fetchone()[0] is False
        with pytest.raises(psycopg.errors.InvalidParameterValue):  # not kept for dedup: refused
            c.execute("SELECT outbox.enqueue('billing', 'k', 'x'::text, NULL, %s)::text", (generated_after,))
    assert pg.value("SELECT count(*) FROM outbox.events") == 3
