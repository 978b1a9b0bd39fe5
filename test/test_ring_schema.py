"""Schema 0.4.0, the preview of the insert-only queue (DESIGN.md "The insert-only queue", build
step 2; not the default version): the ring of generation tables, outbox.events as a view with
0.3.0's columns, the guard that keeps the members insert-only, enqueue into the current member,
the commit-order re-stamp on a member, the retries on outbox.event_state, and ALTER EXTENSION
UPDATE TO '0.4.0' from 0.3.0 with events in every state. Without the relay (outbox.workers = 0):
its claim on the ring is tested in test_ring_relay.py."""

import json
import os
import re
import subprocess
import threading
import time
import uuid

import psycopg
import pytest
import yaml

from harness.pg_cluster import PgCluster
from harness.wait import wait_until

# The default version (0.4.1: the ring, with event-id index entries for caller ids only).
with open(os.path.join(os.path.dirname(__file__), "..", "outbox.control")) as control:
    DEFAULT_VERSION = re.search(r"^default_version = '(.*)'", control.read(), re.M).group(1)
RING = "ring"   # CREATE EXTENSION outbox (the default version)
OLD = "v030"    # CREATE EXTENSION outbox VERSION '0.3.0'
MEMBERS = [f"events_{n}" for n in range(4)]
# The contract's member columns, in order (events_0 is 0.3.0's table: same names, its own order).
MEMBER_COLUMNS = [("id", "bigint"), ("event_id", "uuid"), ("topic", "text"), ("key", "text"),
                  ("lane", "smallint"), ("payload", "bytea"), ("headers", "jsonb"),
                  ("created_at", "timestamp with time zone"), ("order_lsn", "pg_lsn"), ("writer", "xid8"),
                  ("target_partition", "integer"), ("ce_content_type", "text"), ("ce_type", "text"),
                  ("ce_source", "text"), ("caller_event_id", "boolean")]
# Every column of outbox.events, in the order a SELECT * shows them.
VIEW_COLUMNS_SQL = ("SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute "
                    "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum")
HOSTILE = "ring_hostile"
READER = "ring_reader"


@pytest.fixture(scope="module")
def pg():
    with PgCluster(settings={"outbox.workers": "0"}, create_extension=False) as cluster:
        for db, version in ((RING, None), (OLD, "0.3.0")):
            cluster.sql(f"CREATE DATABASE {db}")
            cluster.sql("CREATE EXTENSION outbox" + (f" VERSION '{version}'" if version else ""), dbname=db)
        cluster.sql(f"CREATE ROLE {HOSTILE} LOGIN")
        cluster.sql(f"CREATE ROLE {READER} LOGIN")
        yield cluster


def connect(pg, db, user="postgres"):
    return psycopg.connect(host=pg.tmp, port=pg.port, user=user, dbname=db, autocommit=True)


def fresh_database(pg, version=None):
    db = "d" + uuid.uuid4().hex[:10]
    pg.sql(f"CREATE DATABASE {db}")
    pg.sql("CREATE EXTENSION outbox" + (f" VERSION '{version}'" if version else ""), dbname=db)
    return db


def refusal(conn, statement, params=None):
    """(sqlstate, hint) of a statement that must fail."""
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, params)
    return caught.value.sqlstate, caught.value.diag.message_hint or ""


def everything(pg, db):
    """Every column of every event, as outbox.events shows them, in id order."""
    return pg.sql("SELECT id, event_id, topic, key, lane, payload, headers, status, attempts, next_attempt_at, "
                  "last_error, created_at, claimed_at, published_at, kafka_partition, kafka_offset, order_lsn, "
                  "target_partition, ce_content_type, ce_type, ce_source FROM outbox.events ORDER BY id", dbname=db)


def member_rows(pg, db, member="events_0"):
    return pg.sql(f"SELECT id, event_id, topic, key, lane, payload, headers, created_at, order_lsn, writer, "
                  f"target_partition, ce_content_type, ce_type, ce_source FROM outbox.{member} ORDER BY id", dbname=db)


def test_the_ring_is_the_default_version(pg):
    assert pg.value("SELECT default_version FROM pg_available_extensions WHERE name = 'outbox'") == DEFAULT_VERSION
    assert DEFAULT_VERSION == "0.4.1"
    db = fresh_database(pg)
    assert pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname=db) == DEFAULT_VERSION
    assert pg.value("SELECT relkind::text FROM pg_class WHERE oid = 'outbox.events'::regclass", dbname=db) == "v"
    pg.sql(f"DROP DATABASE {db}")


def test_versions_of_the_two_databases(pg):
    assert pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname=RING) == DEFAULT_VERSION
    assert pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname=OLD) == "0.3.0"


def test_view_has_the_columns_of_0_3_0s_table(pg):
    old = pg.sql(VIEW_COLUMNS_SQL, ("outbox.events",), dbname=OLD)
    new = pg.sql(VIEW_COLUMNS_SQL, ("outbox.events",), dbname=RING)
    assert pg.value("SELECT relkind::text FROM pg_class WHERE oid = 'outbox.events'::regclass", dbname=OLD) == "r"
    assert pg.value("SELECT relkind::text FROM pg_class WHERE oid = 'outbox.events'::regclass", dbname=RING) == "v"
    assert new == old
    assert len(new) == 21


def test_members_have_the_contracts_columns_and_indexes(pg):
    for n, member in enumerate(MEMBERS):
        columns = pg.sql(VIEW_COLUMNS_SQL, (f"outbox.{member}",), dbname=RING)
        if n == 0:  # 0.3.0's table: dropped columns and writer added last
            assert sorted(columns) == sorted(MEMBER_COLUMNS)
        else:
            assert columns == MEMBER_COLUMNS
        indexes = pg.sql("SELECT indexrelid::regclass::text, indisunique, pg_get_indexdef(indexrelid) FROM pg_index "
                         "WHERE indrelid = %s::regclass ORDER BY 1", (f"outbox.{member}",), dbname=RING)
        assert [(i[0], i[1]) for i in indexes] == [(f"outbox.{member}_event_id_key", True),
                                                     (f"outbox.{member}_order_idx", False)]
        assert indexes[0][2].endswith("USING btree (event_id) WHERE caller_event_id"), indexes[0][2]
        assert indexes[1][2].endswith("(order_lsn, id)")
        triggers = pg.sql("SELECT tgname::text, tgenabled::text FROM pg_trigger WHERE tgrelid = %s::regclass "
                          "AND NOT tgisinternal ORDER BY 1", (f"outbox.{member}",), dbname=RING)
        assert triggers == [("~outbox_guard", "A"), ("~outbox_guard_truncate", "A"), ("~outbox_stamp", "A")]
    assert pg.sql("SELECT member, is_current FROM outbox.ring ORDER BY member", dbname=RING) == [
        (0, True), (1, False), (2, False), (3, False)]
    assert pg.value("SELECT count(*) FROM outbox.ring_start", dbname=RING) == 1
    assert pg.value("SELECT count(*) FROM outbox.cursors", dbname=RING) == 0


def test_enqueue_lands_in_the_current_member_stamped(pg):
    topic = "enq-" + uuid.uuid4().hex[:8]
    with connect(pg, RING) as c:
        c.execute("BEGIN")
        before = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        event_id = c.execute("SELECT outbox.enqueue(%s, 'k', '{\"n\": 1}'::jsonb)", (topic,)).fetchone()[0]
        unkeyed = c.execute("SELECT outbox.enqueue(%s, NULL, 'x'::text, partition => 2)", (topic,)).fetchone()[0]
        xid = c.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        after = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        c.execute("COMMIT")
    rows = pg.sql("SELECT event_id, order_lsn >= %s::pg_lsn AND order_lsn <= %s::pg_lsn, writer::text, target_partition "
                  "FROM outbox.events_0 WHERE topic = %s ORDER BY id", (str(before), str(after), topic), dbname=RING)
    assert rows == [(event_id, True, xid, None), (unkeyed, True, xid, 2)]
    for member in MEMBERS[1:]:
        assert pg.value(f"SELECT count(*) FROM outbox.{member}", dbname=RING) == 0
    assert pg.sql("SELECT status, attempts, published_at FROM outbox.events WHERE topic = %s", (topic,),
                  dbname=RING) == [("pending", 0, None), ("pending", 0, None)]


def test_caller_event_id_is_deduplicated(pg):
    topic = "dup-" + uuid.uuid4().hex[:8]
    given = uuid.uuid4()
    first = pg.value("SELECT outbox.enqueue(%s, 'k', 'a'::text, event_id => %s)", (topic, given), dbname=RING)
    again = pg.value("SELECT outbox.enqueue(%s, 'k', 'b'::text, event_id => %s)", (topic, given), dbname=RING)
    assert first == given and again is None
    assert pg.sql("SELECT convert_from(payload, 'UTF8') FROM outbox.events_0 WHERE topic = %s", (topic,),
                  dbname=RING) == [("a",)]


def uuid_with_version(version, mark=None):
    """A time-ordered id: the millisecond, the version, `mark` in the next 12 bits (random without
    one), random bits. Version 8 with mark 0x0B0 is the kind enqueue generates (docs/sql-api.md);
    version 7 is what callers' libraries make."""
    raw = bytearray(int(time.time() * 1000).to_bytes(6, "big") + os.urandom(10))
    raw[6] = (version << 4) | (raw[6] & 0x0F)
    if mark is not None:
        raw[6] = (version << 4) | (mark >> 8)
        raw[7] = mark & 0xFF
    raw[8] = 0x80 | (raw[8] & 0x3F)
    return uuid.UUID(bytes=bytes(raw))


def generated_like_id():
    return uuid_with_version(8, 0x0B0)


def index_entries(c, member="events_0"):
    """The entries of the member's event-id index, read by an index-only scan of it: the scan
    returns what the index holds (its predicate is not checked again), so a row wrongly given an
    entry is counted."""
    c.execute("SET enable_seqscan = off")
    c.execute("SET enable_bitmapscan = off")
    try:
        query = f"SELECT count(*) FROM outbox.{member} WHERE caller_event_id"
        plan = "\n".join(r[0] for r in c.execute("EXPLAIN " + query).fetchall())
        assert f"{member}_event_id_key" in plan, plan
        return c.execute(query).fetchone()[0]
    finally:
        c.execute("RESET enable_seqscan")
        c.execute("RESET enable_bitmapscan")


def test_only_a_callers_event_id_gets_an_index_entry(pg):
    """0.4.1: a row whose id enqueue generated says so (caller_event_id false) and gets no entry in
    the member's unique index on event_id (partial, WHERE caller_event_id): whichever way enqueue
    wrote it (straight into the member, or its statement when an owner's trigger is on the
    member). A caller's id, a row written by hand through the view, an INSERT or a COPY into the
    member (caller_event_id left out: true) have one, and stay unique. On 0.4.0 (the same library)
    every row had one: the index grows there with the same events."""
    db, old = fresh_database(pg), fresh_database(pg, "0.4.0")
    for d in (db, old):
        pg.sql("SELECT outbox.enqueue('ix', 'k' || g, 'x'::text) FROM generate_series(1, 2000) g", dbname=d)
    with connect(pg, db) as c:
        # The statement's way for a generated id: an owner's trigger on the member.
        c.execute("CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$")
        c.execute("CREATE TRIGGER noop AFTER INSERT ON outbox.events_0 FOR EACH ROW EXECUTE FUNCTION public.noop()")
        c.execute("SELECT outbox.enqueue('ix', 'k', 'by the statement'::text)")
        c.execute("DROP TRIGGER noop ON outbox.events_0")
        given = uuid.uuid4()
        assert c.execute("SELECT outbox.enqueue('ix', 'k', 'x'::text, event_id => %s)", (given,)).fetchone()[0] == given
        c.execute("INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                  "VALUES (gen_random_uuid(), 'ix', 'h', outbox.lane_of('h', NULL), 'view')")
        c.execute("INSERT INTO outbox.events_0 (event_id, topic, key, lane, payload) "
                  "VALUES (gen_random_uuid(), 'ix', 'h', outbox.lane_of('h', NULL), 'member')")
        lane = c.execute("SELECT outbox.lane_of('h', NULL)").fetchone()[0]
        with c.cursor().copy("COPY outbox.events_0 (event_id, topic, key, lane, payload) FROM STDIN") as copy:
            copy.write_row((str(uuid.uuid4()), "ix", "h", lane, "copied"))
        assert c.execute("SELECT caller_event_id, count(*) FROM outbox.events_0 GROUP BY 1 ORDER BY 1").fetchall() == [
            (False, 2001), (True, 4)]
        assert index_entries(c) == 4
        # Nothing checks a generated id for uniqueness; a caller's is, by hand too (23505).
        state, _ = refusal(c, "INSERT INTO outbox.events_0 (event_id, topic, key, lane, payload) "
                              "VALUES (%s, 'ix', 'k', outbox.lane_of('k', NULL), 'again')", (given,))
        assert state == "23505"
        c.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
        for index in ("outbox.events_0_event_id_key", "outbox.events_0_order_idx"):
            c.execute("SELECT bt_index_check(%s::regclass, true)", (index,))
    # 4 entries: the metapage and one leaf. On 0.4.0 the 2,000 generated ids filled pages more.
    one_leaf = 2 * 8192
    assert pg.value("SELECT pg_relation_size('outbox.events_0_event_id_key')", dbname=db) == one_leaf
    assert pg.value("SELECT pg_relation_size('outbox.events_0_event_id_key')", dbname=old) > 2 * one_leaf
    for d in (db, old):
        pg.sql(f"DROP DATABASE {d}")


def test_dedup_covers_caller_ids_only_and_probes_by_the_index(pg):
    """A caller's id is deduplicated in its member (ON CONFLICT ... WHERE caller_event_id), in the
    other members after a rotation and under REPEATABLE READ (their partial indexes: the probes
    name the predicate, so they are index scans, not scans of the members), and by the view's
    INSERT (23505). An id enqueue generated is not, and given again (to enqueue, or the view) it is
    refused, 22023, nothing written (docs/sql-api.md "Duplicates")."""
    db = fresh_database(pg)
    # Enough rows that a probe by event_id is an index scan, not a scan of a one-page table.
    pg.sql("SELECT outbox.enqueue('dd', 'k' || g, 'x'::text) FROM generate_series(1, 5000) g", dbname=db)
    with connect(pg, db) as c:
        generated = c.execute("SELECT outbox.enqueue('dd', 'k', 'generated'::text)").fetchone()[0]
        for sql in ("SELECT outbox.enqueue('dd', 'k', 'same id'::text, event_id => %s)",
                    "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                    "VALUES (%s, 'dd', 'k', outbox.lane_of('k', NULL), 'x')"):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
                c.execute(sql, (generated,))
            assert "was generated by outbox.enqueue() and cannot be given to another event" in str(refused.value)
        assert c.execute("SELECT count(*) FROM outbox.events WHERE event_id = %s", (generated,)).fetchone()[0] == 1
        given = uuid.uuid4()
        assert c.execute("SELECT outbox.enqueue('dd', 'k', 'a'::text, event_id => %s)", (given,)).fetchone()[0] == given
        assert c.execute("SELECT outbox.enqueue('dd', 'k', 'b'::text, event_id => %s)", (given,)).fetchone()[0] is None
        # The current member moves on: events_0 is probed as an older member.
        c.execute("SELECT outbox.purge(interval '0')")
        assert c.execute("SELECT member FROM outbox.ring WHERE is_current").fetchone()[0] == 1
        for level in ("READ COMMITTED", "REPEATABLE READ"):
            c.execute(f"BEGIN ISOLATION LEVEL {level}")
            scans = "SELECT pg_stat_get_xact_numscans('outbox.events_0'::regclass), " \
                    "pg_stat_get_xact_numscans('outbox.events_0_event_id_key'::regclass)"
            # (Counted around the call: PostgreSQL 15's "xact" counters also hold what earlier
            # transactions of the session left unflushed.)
            seq_before, index_before = c.execute(scans).fetchone()
            assert c.execute("SELECT outbox.enqueue('dd', 'k', 'c'::text, event_id => %s)",
                             (given,)).fetchone()[0] is None, level
            # enqueue's own probes: a scan of events_0 would count in the first.
            seq_scans, index_scans = (a - b for a, b in zip(c.execute(scans).fetchone(), (seq_before, index_before)))
            assert seq_scans == 0 and index_scans >= 1, (level, seq_scans, index_scans)
            state, _ = refusal(c, "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                                  "VALUES (%s, 'dd', 'k', outbox.lane_of('k', NULL), 'by hand')", (given,))
            assert state == "23505", level
            c.execute("ROLLBACK")
        # A generated id whose event failed or waits (a copy in event_state, which the caller-id
        # probes read): refused all the same, so the answer does not tell its state.
        failed = c.execute("SELECT outbox.enqueue('dd', 'k', 'fails'::text)").fetchone()[0]
        member = c.execute("SELECT member FROM outbox.ring WHERE is_current").fetchone()[0]
        c.execute("INSERT INTO outbox.event_state (id, member, event_id, topic, key, lane, payload, created_at, "
                  "order_lsn, member_lsn, writer, status, attempts) "
                  f"SELECT id, {member}, event_id, topic, key, lane, payload, created_at, order_lsn, order_lsn, "
                  f"writer, 'failed', 1 FROM outbox.events_{member} WHERE event_id = %s", (failed,))
        assert c.execute("SELECT status FROM outbox.events WHERE event_id = %s", (failed,)).fetchone() == ("failed",)
        for sql in ("SELECT outbox.enqueue('dd', 'k', 'again'::text, event_id => %s)",
                    "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                    "VALUES (%s, 'dd', 'k', outbox.lane_of('k', NULL), 'x')"):
            state, _ = refusal(c, sql, (failed,))
            assert state == "22023", sql
        # A generated id by hand through the view, after a rotation (the member it is in is an
        # older one now): refused as well, and nothing written.
        for event_id in (generated, c.execute("SELECT outbox.enqueue('dd', 'k', 'generated'::text)").fetchone()[0]):
            state, _ = refusal(c, "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                                  "VALUES (%s, 'dd', 'k', outbox.lane_of('k', NULL), 'by hand')", (event_id,))
            assert state == "22023"
            assert c.execute("SELECT count(*) FROM outbox.events WHERE event_id = %s", (event_id,)).fetchone()[0] == 1
        assert c.execute("SELECT count(*) FROM outbox.events WHERE event_id = %s", (given,)).fetchone()[0] == 1
    pg.sql(f"DROP DATABASE {db}")


def write_member_row(c, path, columns, values):
    if path == "insert":
        c.execute(f"INSERT INTO outbox.events_0 ({columns}) VALUES (%s, %s, %s, %s, %s, %s)", values)
    elif path == "insert_select":
        c.execute(f"INSERT INTO outbox.events_0 ({columns}) SELECT * FROM "
                  f"(VALUES (%s::uuid, %s, %s, %s::smallint, %s::bytea, %s::boolean)) v", values)
    else:
        with c.cursor().copy(f"COPY outbox.events_0 ({columns}) FROM STDIN") as copy:
            copy.write_row(values)


def test_a_row_says_generated_only_for_an_id_of_enqueues_kind(pg):
    """caller_event_id false takes a row out of dedup: the stamp trigger lets a row written by hand
    say so only for an id with enqueue's mark (version 8, ...-80b0-...; a dump of a 0.4.1 database
    has them), on every way into a member (INSERT, INSERT ... SELECT, COPY): 23514 naming the rule
    and the column otherwise, and nothing goes in. A marked id with true (enqueue made it before
    the update to 0.4.1; a 0.4.0 dump's rows restored) is kept so, indexed. A version 7 id
    (callers' libraries make them), another version 8 layout or the mark under another variant
    is a caller's. (The view has no such column and refuses a marked id it does not find:
    test_dedup_covers_caller_ids_only...)"""
    db = fresh_database(pg)
    with connect(pg, db) as c:
        lane = c.execute("SELECT outbox.lane_of('k', NULL)").fetchone()[0]
        columns = "event_id, topic, key, lane, payload, caller_event_id"
        wrong_variant = bytearray(generated_like_id().bytes)
        wrong_variant[8] = 0xC0 | (wrong_variant[8] & 0x3F)
        callers = (uuid.uuid4(), uuid.uuid1(), uuid_with_version(7), uuid_with_version(7, 0x0B0),
                   uuid_with_version(8, 0x0B1), uuid.UUID(bytes=bytes(wrong_variant)))
        written = 0
        for path in ("insert", "insert_select", "copy"):
            cases = [(event_id, False, "caller_event_id") for event_id in callers]
            cases += [(generated_like_id(), True, None), (generated_like_id(), False, None)]
            cases += [(event_id, True, None) for event_id in (uuid_with_version(7), uuid_with_version(8, 0x0B1))]
            for event_id, caller, refused_column in cases:
                values = (event_id, "gen", "k", lane, b"x", caller)
                if refused_column is None:
                    write_member_row(c, path, columns, values)
                    written += 1
                    continue
                with pytest.raises(psycopg.Error) as caught:
                    write_member_row(c, path, columns, values)
                error = caught.value
                assert error.sqlstate == "23514", (path, event_id, str(error))
                assert (error.diag.constraint_name, error.diag.column_name) == (
                    "events_generated_event_id_check", refused_column), str(error)
        rows = c.execute("SELECT caller_event_id, count(*), bool_and(substr(event_id::text, 15, 4) = '80b0') "
                         "FROM outbox.events_0 GROUP BY 1 ORDER BY 1").fetchall()
        assert rows == [(False, 3, True), (True, 9, False)] and written == 12
        assert index_entries(c) == 9
    pg.sql(f"DROP DATABASE {db}")


def test_no_statement_inside_enqueues_insert_can_copy_its_generated_id(pg):
    """While a generated id goes through enqueue's INSERT statement (a member with a trigger of its
    owner's takes the statement), code that statement runs (an AFTER INSERT trigger) cannot give
    the id to a second event: enqueue refuses it (22023), so the whole enqueue fails and nothing is
    written. A caller's id forwarded the same way is a duplicate (NULL)."""
    db = fresh_database(pg)
    with connect(pg, db) as c:
        c.execute("CREATE FUNCTION public.mirror() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
                  "IF NEW.topic = 'orders' THEN "
                  "PERFORM outbox.enqueue('orders.audit', NEW.key, 'mirror'::text, NULL, NEW.event_id); END IF; "
                  "RETURN NULL; END$$")
        c.execute("CREATE TRIGGER mirror AFTER INSERT ON outbox.events_0 FOR EACH ROW EXECUTE FUNCTION public.mirror()")
        state, _ = refusal(c, "SELECT outbox.enqueue('orders', 'o-1', 'x'::text)")
        assert state == "22023"
        given = c.execute("SELECT outbox.event_id('orders', 'o-2')").fetchone()[0]
        assert c.execute("SELECT outbox.enqueue('orders', 'o-2', 'x'::text, NULL, %s)", (given,)).fetchone()[0] == given
        assert c.execute("SELECT topic, event_id FROM outbox.events ORDER BY id").fetchall() == [("orders", given)]
    pg.sql(f"DROP DATABASE {db}")


def test_an_enqueue_statement_that_failed_lets_no_generated_id_through_later(pg):
    """A generated-id enqueue whose statement fails (an owner's CHECK on the member; its error
    shows the row, the id included) leaves nothing behind that would let that id through later:
    the view and enqueue refuse it (22023) in the same backend, under another role too."""
    db = fresh_database(pg)
    with connect(pg, db) as c:
        c.execute("ALTER TABLE outbox.events_0 ADD CONSTRAINT no_boom CHECK (payload IS DISTINCT FROM 'boom'::bytea)")
        with pytest.raises(psycopg.errors.CheckViolation) as failed:
            c.execute("SELECT outbox.enqueue('t.e', 'k', 'boom'::text)")
        shown = failed.value.diag.message_detail.split("(")[1].split(",")[1].strip()
        assert shown[14:18] == "80b0", failed.value.diag.message_detail
        lane = c.execute("SELECT outbox.lane_of('k', NULL)").fetchone()[0]
        for sql in ("INSERT INTO outbox.events (event_id, topic, key, lane, payload) VALUES (%s, 't.e', 'k', %s, 'x')",
                    "SELECT outbox.enqueue('t.e', 'k', 'y'::text, NULL, %s)"):
            for _ in range(2):
                state, _ = refusal(c, sql, (shown, lane) if "lane" in sql else (shown,))
                assert state == "22023", sql
        assert c.execute("SELECT count(*) FROM outbox.events").fetchone()[0] == 0
    pg.sql(f"DROP DATABASE {db}")


def test_insert_by_hand_into_the_view(pg):
    topic = "hand-" + uuid.uuid4().hex[:8]
    with connect(pg, RING) as c:
        row = c.execute("INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                        "VALUES (gen_random_uuid(), %s, 'h', outbox.lane_of('h', NULL), 'x') "
                        "RETURNING id, status, attempts, order_lsn IS NOT NULL", (topic,)).fetchone()
        assert row[1:] == ("pending", 0, True)
        assert c.execute("SELECT id, writer <> '0' FROM outbox.events_0 WHERE topic = %s", (topic,)).fetchall() == [
            (row[0], True)]
        # What the relay owns, or an id, cannot be given.
        state, hint = refusal(c, "INSERT INTO outbox.events (event_id, topic, key, lane, payload, status) "
                                 "VALUES (gen_random_uuid(), %s, 'h', outbox.lane_of('h', NULL), 'x', 'failed')", (topic,))
        assert state == "0A000" and "Leave those columns out" in hint
        state, hint = refusal(c, "INSERT INTO outbox.events (id, event_id, topic, key, lane, payload) "
                                 "VALUES (1, gen_random_uuid(), %s, 'h', outbox.lane_of('h', NULL), 'x')", (topic,))
        assert state == "428C9" and "Leave id out" in hint
        # The member's row rules hold for rows by hand.
        state, _ = refusal(c, "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                              "VALUES (gen_random_uuid(), %s, 'h', 7, 'x')", (topic,))
        assert state == "23514"
        # ON CONFLICT (event_id) on the view is not supported (docs/upgrading.md).
        state, _ = refusal(c, "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                              "VALUES (gen_random_uuid(), %s, 'h', outbox.lane_of('h', NULL), 'x') "
                              "ON CONFLICT (event_id) DO NOTHING", (topic,))
        assert state == "42P10"
        # COPY into the view goes the same way.
        lane = c.execute("SELECT outbox.lane_of('h', NULL)").fetchone()[0]
        with c.cursor().copy("COPY outbox.events (event_id, topic, key, lane, payload) FROM STDIN") as copy:
            copy.write_row((str(uuid.uuid4()), topic, "h", lane, "copied"))
    assert pg.sql("SELECT convert_from(payload, 'UTF8'), writer <> '0' FROM outbox.events_0 WHERE topic = %s "
                  "ORDER BY id", (topic,), dbname=RING) == [("x", True), ("copied", True)]


# Each row rule a member row can break (status, attempts and the outcome columns are not a
# member's: the view refuses them with 0A000), as (rule, column, changes to a good row,
# whether the lane is then computed again for the row's key and id).
MEMBER_RULES = [
    ("events_cloudevent_check", "ce_type", {"ce_type": "x"}, True),
    ("events_headers_check", "headers", {"headers": [1]}, True),
    ("events_key_length_check", "key", {"key": "k" * 2049}, True),
    ("events_lane_check", "lane", {"lane": 1024}, False),
    ("events_lane_of_key_check", "lane", {"lane": "other"}, False),
    ("events_target_partition_check", "target_partition", {"target_partition": -1}, True),
    ("events_times_check", "created_at", {"created_at": "infinity"}, True),
    ("events_tombstone_check", "payload", {"key": None, "payload": None}, True),
    ("events_topic_check", "topic", {"topic": "bad topic"}, True),
]
ROW_PATHS = ["enqueue", "view_insert", "view_copy", "member_insert", "member_insert_select", "member_copy"]
# (column, cast) of the rows the paths below write.
ROW_COLUMNS = [("event_id", "uuid"), ("topic", "text"), ("key", "text"), ("lane", "smallint"), ("payload", "bytea"),
               ("headers", "jsonb"), ("created_at", "timestamptz"), ("target_partition", "integer"),
               ("ce_type", "text")]


@pytest.fixture(scope="module")
def rules_db(pg):
    """A database of its own: a trigger of the owner's on events_0 (it sorts before the stamp) makes
    the row enqueue writes the bad one, after enqueue's own checks, when meddle.row is set."""
    db = fresh_database(pg)
    pg.sql("CREATE FUNCTION public.meddle() RETURNS trigger LANGUAGE plpgsql AS $$ "
           "BEGIN "
           "  IF current_setting('meddle.row', true) IS NULL OR current_setting('meddle.row') = '' THEN RETURN NEW; END IF; "
           "  NEW := jsonb_populate_record(NEW, current_setting('meddle.row')::jsonb); "
           "  IF current_setting('meddle.relane') = 'on' THEN NEW.lane := outbox.lane_of(NEW.key, NEW.event_id); END IF; "
           "  RETURN NEW; "
           "END $$", dbname=db)
    pg.sql("CREATE TRIGGER meddle BEFORE INSERT ON outbox.events_0 FOR EACH ROW EXECUTE FUNCTION public.meddle()",
           dbname=db)
    yield db
    pg.sql(f"DROP DATABASE {db}")


def bad_row(c, changes, relane):
    row = {"event_id": str(uuid.uuid4()), "topic": "rules", "key": "k", "payload": b"x", "headers": None,
           "created_at": None, "target_partition": None, "ce_type": None}
    row.update(changes)
    if relane:
        row["lane"] = c.execute("SELECT outbox.lane_of(%s, %s)", (row["key"], row["event_id"])).fetchone()[0]
    elif row["lane"] == "other":
        row["lane"] = (c.execute("SELECT outbox.lane_of(%s, NULL)", (row["key"],)).fetchone()[0] + 1) % 1024
    if row["created_at"] is None:
        row["created_at"] = "2026-12-04 00:00:00+00"  # a member's created_at is NOT NULL
    if row["headers"] is not None:
        row["headers"] = json.dumps(row["headers"])
    return row


@pytest.mark.parametrize("path", ROW_PATHS)
@pytest.mark.parametrize("rule,column,changes,relane", MEMBER_RULES, ids=[r[0] for r in MEMBER_RULES])
def test_each_row_rule_holds_on_every_path_into_a_member(pg, rules_db, path, rule, column, changes, relane):
    # The members have no CHECK: their stamp trigger holds every new row to the rules (check_violation,
    # naming the rule and the column), whoever writes it and however, and nothing goes in.
    with connect(pg, rules_db) as c:
        assert c.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = 'outbox.events_0'::regclass "
                         "AND contype = 'c'").fetchone()[0] == 0
        before = c.execute("SELECT count(*) FROM outbox.events").fetchone()[0]
        row = bad_row(c, changes, relane)
        names = ", ".join(name for name, _ in ROW_COLUMNS)
        values = [row[name] for name, _ in ROW_COLUMNS]
        placeholders = ", ".join(f"%s::{cast}" for _, cast in ROW_COLUMNS)
        with pytest.raises(psycopg.Error) as caught:
            if path == "enqueue":  # the owner's trigger makes enqueue's row the bad one
                meddled = dict(changes, **({"lane": row["lane"]} if "lane" in changes else {}))
                c.execute("SELECT set_config('meddle.row', %s, false), set_config('meddle.relane', %s, false)",
                          (json.dumps(meddled), "on" if relane else "off"))
                c.execute("SELECT outbox.enqueue('rules', 'k', 'x'::text)")
            elif path == "view_insert":
                c.execute(f"INSERT INTO outbox.events ({names}) VALUES ({placeholders})", values)
            elif path == "member_insert":
                c.execute(f"INSERT INTO outbox.events_0 ({names}) VALUES ({placeholders})", values)
            elif path == "member_insert_select":
                c.execute(f"INSERT INTO outbox.events_0 ({names}) SELECT * FROM (VALUES ({placeholders})) v", values)
            else:
                target = "outbox.events" if path == "view_copy" else "outbox.events_0"
                with c.cursor().copy(f"COPY {target} ({names}) FROM STDIN") as copy:
                    copy.write_row(values)
        c.execute("SELECT set_config('meddle.row', '', false)")
        error = caught.value
        assert error.sqlstate == "23514", (error.sqlstate, str(error))
        assert error.diag.constraint_name == rule and error.diag.column_name == column, str(error)
        assert error.diag.table_name == "events_0"
        assert f'"{rule}"' in error.diag.message_primary and f'"{column}"' in error.diag.message_primary
        assert "docs/sql-api.md" in error.diag.message_hint
        assert c.execute("SELECT count(*) FROM outbox.events").fetchone()[0] == before


def test_a_good_row_goes_in_on_every_path_into_a_member(pg, rules_db):
    # The paths above write a good row (so a refusal there is the rule's, not the path's).
    with connect(pg, rules_db) as c:
        before = c.execute("SELECT count(*) FROM outbox.events").fetchone()[0]
        names = ", ".join(name for name, _ in ROW_COLUMNS)
        placeholders = ", ".join(f"%s::{cast}" for _, cast in ROW_COLUMNS)
        c.execute("SELECT outbox.enqueue('rules', 'k', 'x'::text)")
        for path in ROW_PATHS[1:]:
            values = [bad_row(c, {}, True)[name] for name, _ in ROW_COLUMNS]
            if path == "view_insert":
                c.execute(f"INSERT INTO outbox.events ({names}) VALUES ({placeholders})", values)
            elif path == "member_insert":
                c.execute(f"INSERT INTO outbox.events_0 ({names}) VALUES ({placeholders})", values)
            elif path == "member_insert_select":
                c.execute(f"INSERT INTO outbox.events_0 ({names}) SELECT * FROM (VALUES ({placeholders})) v", values)
            else:
                target = "outbox.events" if path == "view_copy" else "outbox.events_0"
                with c.cursor().copy(f"COPY {target} ({names}) FROM STDIN") as copy:
                    copy.write_row(values)
        assert c.execute("SELECT count(*) FROM outbox.events").fetchone()[0] == before + len(ROW_PATHS)


def test_update_delete_truncate_are_refused_and_change_nothing(pg):
    topic = "guard-" + uuid.uuid4().hex[:8]
    # A caller's id: its row is in the member's event-id index, which ON CONFLICT ... DO UPDATE
    # below conflicts with.
    pg.sql("SELECT outbox.enqueue(%s, 'k', 'a'::text, event_id => gen_random_uuid())", (topic,), dbname=RING)
    before = member_rows(pg, RING)
    with connect(pg, RING) as c:
        for statement in (f"UPDATE outbox.events SET key = 'z' WHERE topic = '{topic}'",
                          f"DELETE FROM outbox.events WHERE topic = '{topic}'"):
            state, hint = refusal(c, statement)
            assert state == "55000" and "outbox.retry()" in hint and "outbox.purge()" in hint, statement
        for member in MEMBERS[:1]:
            for statement in (f"UPDATE outbox.{member} SET key = 'z' WHERE topic = '{topic}'",
                              # raising order_lsn is the re-stamp's, and only the re-stamp's
                              f"UPDATE outbox.{member} SET order_lsn = order_lsn + 1 WHERE topic = '{topic}'",
                              f"DELETE FROM outbox.{member} WHERE topic = '{topic}'",
                              f"INSERT INTO outbox.{member} (event_id, topic, key, lane, payload) "
                              f"SELECT event_id, topic, key, lane, payload FROM outbox.{member} WHERE topic = '{topic}' "
                              f"ON CONFLICT (event_id) WHERE caller_event_id DO UPDATE SET key = 'z'",
                              f"TRUNCATE outbox.{member}"):
                state, hint = refusal(c, statement)
                assert state == "55000" and "outbox.retry()" in hint, statement
        # Also as a replica applies changes (the triggers fire ALWAYS).
        c.execute("SET session_replication_role = replica")
        state, _ = refusal(c, f"DELETE FROM outbox.events_0 WHERE topic = '{topic}'")
        assert state == "55000"
        state, _ = refusal(c, "TRUNCATE outbox.events_1")
        assert state == "55000"
    assert member_rows(pg, RING) == before


def test_a_role_without_grants_cannot_read_or_write_the_ring(pg):
    pg.sql("SELECT outbox.enqueue('hostile', 'k', 'secret'::text)", dbname=RING)
    tables = MEMBERS + ["ring", "cursors", "ring_start", "landed", "event_state", "events"]
    for table in tables:
        assert not pg.value("SELECT has_table_privilege('public', %s, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE')",
                            (f"outbox.{table}",), dbname=RING), table
    pg.sql(f"GRANT USAGE ON SCHEMA outbox TO {HOSTILE}", dbname=RING)  # even with the schema's USAGE
    try:
        with connect(pg, RING, user=HOSTILE) as c:
            for table in tables:
                state, _ = refusal(c, f"SELECT count(*) FROM outbox.{table}")
                assert state == "42501", table
            for member in MEMBERS:
                state, _ = refusal(c, f"INSERT INTO outbox.{member} (event_id, topic, key, lane, payload) "
                                      "VALUES (gen_random_uuid(), 't', 'h', 0, 'x')")
                assert state == "42501", member
            state, _ = refusal(c, "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                                  "VALUES (gen_random_uuid(), 't', 'h', 0, 'x')")
            assert state == "42501"
            state, _ = refusal(c, "SELECT nextval('outbox.events_id_seq')")
            assert state == "42501"
    finally:
        pg.sql(f"REVOKE USAGE ON SCHEMA outbox FROM {HOSTILE}", dbname=RING)


def test_relay_role_gets_what_the_ring_relay_needs(pg):
    rights = dict(pg.sql(
        "SELECT t, string_agg(p, ',' ORDER BY p) FROM unnest(%s::text[]) t, "
        "unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE']) p "
        "WHERE has_table_privilege('outbox_relay', 'outbox.' || t, p) GROUP BY t",
        (MEMBERS + ["ring", "ring_start", "cursors", "landed", "event_state", "events"],), dbname=RING))
    # The retention goes through outbox.ring_retention() (SECURITY DEFINER): no TRUNCATE of a
    # member, no UPDATE of the ring, and not the TRUNCATE function itself.
    for member in MEMBERS + ["ring", "ring_start", "events"]:
        assert rights[member] == "SELECT", member
    assert pg.value("SELECT has_function_privilege('outbox_relay', 'outbox.ring_retention(interval)', 'EXECUTE') "
                    "AND NOT has_function_privilege('outbox_relay', 'outbox.truncate_ring_member(smallint)', 'EXECUTE')",
                    dbname=RING)
    # Cursors move forward and landed rows are only added (test_ring_attack.py).
    assert rights["cursors"] == "INSERT,SELECT,UPDATE"
    assert rights["landed"] == "INSERT"
    assert rights["event_state"] == "DELETE,INSERT,SELECT,UPDATE"
    assert not pg.value("SELECT has_sequence_privilege('outbox_relay', 'outbox.events_id_seq', 'USAGE')", dbname=RING)


def restamp_forced(pg, db, topic):
    """T1 enqueues B; T2 enqueues A for the same key and commits; T1 commits: T1's commit must
    move B above A (test_commit_order.py's shape (b))."""
    t1, t2 = connect(pg, db), connect(pg, db)
    with t1, t2:
        t1.execute("SET lock_timeout = '30s'")
        t1.execute("BEGIN")
        t1.execute("SELECT outbox.enqueue(%s, 'k', 'B'::text)", (topic,))
        inserted = t1.execute("SELECT order_lsn FROM outbox.events_0 WHERE topic = %s", (topic,)).fetchone()[0]
        t2.execute("BEGIN")
        t2.execute("SELECT outbox.enqueue(%s, 'k', 'A'::text)", (topic,))
        t2.execute("COMMIT")
        t1.execute("COMMIT")
    return inserted


def test_commit_order_restamp_updates_the_member_row(pg):
    topic = "co-" + uuid.uuid4().hex[:8]
    inserted = restamp_forced(pg, RING, topic)
    rows = pg.sql("SELECT convert_from(payload, 'UTF8'), order_lsn > %s::pg_lsn FROM outbox.events_0 "
                  "WHERE topic = %s ORDER BY order_lsn, id", (str(inserted), topic), dbname=RING)
    # B's row was re-stamped, upwards, in place (the guard let the re-stamp through)
    assert rows == [("A", True), ("B", True)]
    assert pg.value("SELECT count(*) FROM outbox.events WHERE topic = %s", (topic,), dbname=RING) == 2


def test_the_guard_lets_the_restamp_raise_order_lsn_only(pg):
    # A trigger of the owner's that fires before the guard and changes the row during the
    # re-stamp: the guard sees more than a raised order_lsn and refuses, so the commit fails
    # and nothing of it stays.
    db = fresh_database(pg, "0.4.0")
    pg.sql("CREATE FUNCTION public.meddle() RETURNS trigger LANGUAGE plpgsql AS "
           "$$ BEGIN NEW.key := NEW.key || '!'; RETURN NEW; END $$", dbname=db)
    pg.sql("CREATE TRIGGER meddle BEFORE UPDATE ON outbox.events_0 FOR EACH ROW EXECUTE FUNCTION public.meddle()",
           dbname=db)
    topic = "meddle"
    with pytest.raises(psycopg.Error) as caught:
        restamp_forced(pg, db, topic)
    assert caught.value.sqlstate == "55000"
    assert pg.sql("SELECT convert_from(payload, 'UTF8'), key FROM outbox.events_0 WHERE topic = %s", (topic,),
                  dbname=db) == [("A", "k")]
    # Without it the same commit goes through.
    pg.sql("DROP TRIGGER meddle ON outbox.events_0", dbname=db)
    restamp_forced(pg, db, topic)
    assert pg.value("SELECT count(*) FROM outbox.events_0 WHERE topic = %s", (topic,), dbname=db) == 3
    pg.sql(f"DROP DATABASE {db}")


def test_update_from_0_3_0_keeps_every_event_as_it_was(pg):
    db = fresh_database(pg, "0.3.0")
    pg.sql(f"GRANT USAGE ON SCHEMA outbox TO {READER}", dbname=db)
    pg.sql(f"GRANT SELECT ON outbox.events TO {READER}", dbname=db)
    pg.sql(f"GRANT SELECT (event_id, status) ON outbox.events TO {HOSTILE}", dbname=db)
    with connect(pg, db) as c:
        for key in ("published", "failed", "waiting", "pending", "published-by-hand"):
            c.execute("SELECT outbox.enqueue('upg', %s, %s::text)", (key, key))
        c.execute("SELECT outbox.enqueue('upg', NULL, 'unkeyed'::text, partition => 1)")
        c.execute("UPDATE outbox.events SET status = 'published', published_at = now() - interval '1 hour', "
                  "kafka_partition = 3, kafka_offset = 41 WHERE key = 'published'")
        c.execute("UPDATE outbox.events SET status = 'published', published_at = now() WHERE key = 'published-by-hand'")
        c.execute("UPDATE outbox.events SET status = 'failed', attempts = 10, last_error = 'broker said no' "
                  "WHERE key = 'failed'")
        c.execute("UPDATE outbox.events SET attempts = 2, next_attempt_at = now() + interval '1 hour', "
                  "last_error = 'try later' WHERE key = 'waiting'")
        backlog = c.execute("SELECT * FROM outbox.backlog").fetchall()
        failed = c.execute("SELECT * FROM outbox.failed").fetchall()
        metrics = c.execute("SELECT topic, pending, failed FROM outbox.topic_metrics").fetchall()
    before = everything(pg, db)
    max_id = max(r[0] for r in before)

    with connect(pg, db) as c:
        c.execute("ALTER EXTENSION outbox UPDATE TO '0.4.0'")
        # The same backend enqueues into the member at once.
        after_id = c.execute("SELECT outbox.enqueue('upg', 'after', 'x'::text)").fetchone()[0]
        assert c.execute("SELECT writer <> '0' FROM outbox.events_0 WHERE event_id = %s", (after_id,)).fetchone() == (
            True,)
        c.execute("SELECT outbox.retry_failed('no-such-topic')")
    assert pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname=db) == "0.4.0"
    after = [r for r in everything(pg, db) if r[1] != after_id]
    assert after == before
    assert pg.value("SELECT id FROM outbox.events WHERE event_id = %s", (after_id,), dbname=db) > max_id
    assert pg.sql("SELECT * FROM outbox.backlog", dbname=db)[0][:5] == (backlog[0][0], backlog[0][1] + 1,
                                                                          *backlog[0][2:5])
    assert pg.sql("SELECT * FROM outbox.failed", dbname=db) == failed
    assert pg.sql("SELECT topic, pending, failed FROM outbox.topic_metrics", dbname=db) == [
        (metrics[0][0], metrics[0][1] + 1, metrics[0][2])]

    # Where it all went: a landed row per published event, an event_state row per other one,
    # and the cursors start after every row of 0.3.0.
    assert pg.sql("SELECT topic, kafka_partition, first_offset, array_length(ids, 1) FROM outbox.landed "
                  "ORDER BY ids[1]", dbname=db) == [("upg", 3, 41, 1), ("upg", -1, -1, 1)]
    assert pg.sql("SELECT key, status, attempts, next_attempt_at IS NOT NULL, last_error FROM outbox.event_state "
                  "ORDER BY id", dbname=db) == [
        ("failed", "failed", 10, False, "broker said no"), ("waiting", "pending", 2, True, "try later"),
        ("pending", "pending", 0, False, None), (None, "pending", 0, False, None)]
    assert pg.value("SELECT (SELECT order_lsn FROM outbox.ring_start) > max(order_lsn) FROM outbox.events_0 "
                    "WHERE id <= %s", (max_id,), dbname=db)
    # Rights on the table go to the view, not to the member.
    assert pg.value(f"SELECT has_table_privilege('{READER}', 'outbox.events', 'SELECT')", dbname=db)
    assert not pg.value(f"SELECT has_table_privilege('{READER}', 'outbox.events_0', 'SELECT')", dbname=db)
    assert pg.value(f"SELECT has_column_privilege('{HOSTILE}', 'outbox.events', 'status', 'SELECT')", dbname=db)
    assert not pg.value(f"SELECT has_any_column_privilege('{HOSTILE}', 'outbox.events_0', 'SELECT')", dbname=db)
    with connect(pg, db, user=READER) as c:
        assert len(c.execute("SELECT * FROM outbox.events").fetchall()) == len(before) + 1
    assert pg.value("SELECT current_setting('outbox_upgrade.events_acl', true)", dbname=db) in (None, "")
    pg.sql(f"DROP DATABASE {db}")


def test_retries_work_on_event_state(pg):
    db = fresh_database(pg, "0.3.0")
    with connect(pg, db) as c:
        for key in ("f1", "f2", "ok"):
            c.execute("SELECT outbox.enqueue('rt', %s, 'x'::text)", (key,))
        c.execute("SELECT outbox.enqueue('other', 'f3', 'x'::text)")
        c.execute("UPDATE outbox.events SET status = 'failed', attempts = 10, last_error = 'no' WHERE key LIKE 'f%'")
        c.execute("UPDATE outbox.events SET status = 'published', published_at = now(), kafka_partition = 0, "
                  "kafka_offset = 7 WHERE key = 'ok'")
        c.execute("ALTER EXTENSION outbox UPDATE TO '0.4.0'")
        ids = dict(c.execute("SELECT key, event_id FROM outbox.events").fetchall())
        assert c.execute("SELECT outbox.retry(%s)", (ids["f1"],)).fetchone() == (1,)
        assert c.execute("SELECT status, attempts, next_attempt_at FROM outbox.event_state WHERE key = 'f1'").fetchone() == (
            "pending", 0, None)
        state, hint = refusal(c, "SELECT outbox.retry(%s)", (ids["f1"],))
        assert state == "55000" and "outbox.failed" in hint
        state, _ = refusal(c, "SELECT outbox.retry(%s)", (ids["ok"],))  # published
        assert state == "55000"
        state, _ = refusal(c, "SELECT outbox.retry(%s)", (uuid.uuid4(),))
        assert state == "P0002"
        assert c.execute("SELECT outbox.retry_failed('rt')").fetchone() == (1,)
        assert c.execute("SELECT key, status FROM outbox.events ORDER BY id").fetchall() == [
            ("f1", "pending"), ("f2", "pending"), ("ok", "published"), ("f3", "failed")]
        assert c.execute("SELECT outbox.retry_failed()").fetchone() == (1,)
        assert c.execute("SELECT count(*) FROM outbox.failed").fetchone() == (0,)
    pg.sql(f"DROP DATABASE {db}")


def runbook_setup(pg):
    """README's "Runbook: a poison event" on 0.4.0, without the relay: a database made on 0.3.0
    with a failed event of key 'bad-key', two later events of that key waiting behind it and one
    published event, updated to 0.4.0 (the failed one is in event_state, as the relay leaves it).
    Returns (db, poison, [later ids], published id, dba role: SELECT, UPDATE, DELETE on the view,
    reader role: SELECT only)."""
    db = fresh_database(pg, "0.3.0")
    tag = uuid.uuid4().hex[:6]
    dba, reader = f"dba_{tag}", f"reader_{tag}"
    with connect(pg, db) as c:
        poison = c.execute("SELECT outbox.enqueue('billing', 'bad-key', %s::text)::text", ("x" * 3000,)).fetchone()[0]
        after = [c.execute("SELECT outbox.enqueue('billing', 'bad-key', %s::text)::text", (f"after {i}",)).fetchone()[0]
                 for i in range(2)]
        published = c.execute("SELECT outbox.enqueue('billing', 'ok', 'fine'::text)::text").fetchone()[0]
        c.execute("UPDATE outbox.events SET status = 'failed', attempts = 3, last_error = 'MSG_SIZE_TOO_LARGE' "
                  "WHERE event_id = %s", (poison,))
        c.execute("UPDATE outbox.events SET status = 'published', published_at = now(), kafka_partition = 0, "
                  "kafka_offset = 5 WHERE event_id = %s", (published,))
        c.execute("ALTER EXTENSION outbox UPDATE TO '0.4.0'")
        for role in (dba, reader):
            c.execute(f"CREATE ROLE {role} LOGIN")
            c.execute(f"GRANT USAGE ON SCHEMA outbox TO {role}")
            c.execute(f"GRANT SELECT ON outbox.events TO {role}")
        c.execute(f"GRANT UPDATE, DELETE ON outbox.events TO {dba}")
        c.execute(f"GRANT EXECUTE ON FUNCTION outbox.retry(uuid) TO {dba}")
    return db, poison, after, published, dba, reader


def runbook_teardown(pg, db, *roles):
    pg.sql(f"DROP DATABASE {db}")
    for role in roles:
        pg.sql(f"DROP ROLE {role}")


def ring_state(pg, db):
    """Everything a refused statement must leave as it was."""
    return (everything(pg, db), pg.sql("SELECT * FROM outbox.event_state ORDER BY id", dbname=db),
            member_rows(pg, db), pg.sql("SELECT * FROM outbox.landed ORDER BY ids", dbname=db))


def test_runbook_delete_gives_up_a_failed_event_and_nothing_else(pg):
    db, poison, after, published, dba, reader = runbook_setup(pg)
    before = ring_state(pg, db)
    with connect(pg, db, user=dba) as c:
        # A pending or a published event, or a statement that matches one besides the failed
        # one, is refused whole (the failed one stays too).
        for statement, params in (("DELETE FROM outbox.events WHERE event_id = %s", (after[0],)),
                                  ("DELETE FROM outbox.events WHERE event_id = %s", (published,)),
                                  ("DELETE FROM outbox.events WHERE key = 'bad-key'", None),
                                  ("DELETE FROM outbox.events WHERE event_id = %s AND status = 'pending'", (after[1],))):
            state, hint = refusal(c, statement, params)
            assert state == "55000" and "outbox.retry()" in hint and "outbox.purge()" in hint, statement
    with connect(pg, db, user=reader) as c:  # no DELETE right on the view
        state, _ = refusal(c, "DELETE FROM outbox.events WHERE event_id = %s AND status = 'failed'", (poison,))
        assert state == "42501"
    assert ring_state(pg, db) == before

    # Step 4 verbatim, by a role with DELETE on the view.
    with connect(pg, db, user=dba) as c:
        cur = c.execute(f"DELETE FROM outbox.events WHERE event_id = '{poison}' AND status = 'failed'")
        assert cur.rowcount == 1
        # Given up: not shown, not failed, not retried, not deleted twice.
        assert c.execute("SELECT count(*) FROM outbox.events WHERE event_id = %s", (poison,)).fetchone() == (0,)
        state, _ = refusal(c, "SELECT outbox.retry(%s)", (poison,))
        assert state == "P0002"
        assert c.execute("DELETE FROM outbox.events WHERE event_id = %s", (poison,)).rowcount == 0
    assert pg.sql("SELECT * FROM outbox.failed", dbname=db) == []
    assert pg.sql("SELECT topic, pending, failed, published FROM outbox.backlog", dbname=db) == [("billing", 2, 0, 1)]
    assert pg.sql("SELECT topic, pending, failed FROM outbox.topic_metrics", dbname=db) == [("billing", 2, 0)]
    assert pg.value("SELECT outbox.retry_failed()", dbname=db) == 0
    # The later events of its key and the published one are as they were.
    assert [r for r in everything(pg, db)] == [r for r in before[0] if str(r[1]) != poison]
    assert member_rows(pg, db) == before[2]
    # Its event_state row is kept, given up, until the retention empties its member (a relay
    # cursor past every row, as a relay writes it): then it goes with it; waiting events stay.
    assert pg.sql("SELECT event_id::text, status FROM outbox.event_state WHERE status NOT IN ('pending')",
                  dbname=db) == [(poison, "discarded")]
    pg.sql("INSERT INTO outbox.cursors VALUES (1, 0, pg_current_wal_insert_lsn(), 0, "
           "(SELECT system_identifier FROM pg_control_system()), now())", dbname=db)
    assert pg.value("SELECT outbox.purge(interval '0')", dbname=db) == 1
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 0
    assert pg.sql("SELECT event_id::text, status FROM outbox.event_state ORDER BY id", dbname=db) == [
        (after[0], "pending"), (after[1], "pending")]
    assert pg.sql("SELECT event_id::text, status FROM outbox.events ORDER BY id", dbname=db) == [
        (after[0], "pending"), (after[1], "pending")]
    runbook_teardown(pg, db, dba, reader)


def test_delete_of_a_failed_event_whose_member_was_emptied_removes_it(pg):
    db, poison, after, published, dba, reader = runbook_setup(pg)
    pg.sql("INSERT INTO outbox.cursors VALUES (1, 0, pg_current_wal_insert_lsn(), 0, "
           "(SELECT system_identifier FROM pg_control_system()), now())", dbname=db)
    pg.value("SELECT outbox.purge(interval '0')", dbname=db)
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 0
    assert pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (poison,), dbname=db) == "failed"
    with connect(pg, db, user=dba) as c:
        assert c.execute("DELETE FROM outbox.events WHERE event_id = %s AND status = 'failed'", (poison,)).rowcount == 1
    # Nothing of it is left (no member row to hide): its event id is free again, as on 0.3.0.
    assert pg.sql("SELECT event_id::text FROM outbox.event_state ORDER BY id", dbname=db) == [(a,) for a in after]
    assert pg.value("SELECT outbox.enqueue('billing', 'bad-key', 'again'::text, NULL, %s)::text", (poison,),
                    dbname=db) == poison
    runbook_teardown(pg, db, dba, reader)


def test_runbook_update_corrects_a_failed_event_and_nothing_else(pg):
    db, poison, after, published, dba, reader = runbook_setup(pg)
    before = ring_state(pg, db)
    with connect(pg, db, user=dba) as c:
        # Columns that are not the event's content, or whose change would move the event, are
        # refused; so is a change of a pending or published event, or a statement matching one.
        for column, value in (("key", "'other'"), ("topic", "'billing.other'"), ("status", "'pending'"),
                              ("attempts", "0"), ("lane", "lane"), ("event_id", "gen_random_uuid()"),
                              ("created_at", "now()"), ("last_error", "NULL"), ("order_lsn", "'0/1'")):
            if column == "lane":
                value = "(lane + 1) %% 1024"
            state, hint = refusal(c, f"UPDATE outbox.events SET {column} = {value} WHERE event_id = %s", (poison,))
            assert state == "55000" and "outbox.retry()" in hint, column
        for statement, params in (("UPDATE outbox.events SET payload = 'y' WHERE event_id = %s", (after[0],)),
                                  ("UPDATE outbox.events SET payload = 'y' WHERE event_id = %s", (published,)),
                                  ("UPDATE outbox.events SET payload = 'y' WHERE key = 'bad-key'", None)):
            state, hint = refusal(c, statement, params)
            assert state == "55000" and "outbox.retry()" in hint, statement
        # What the relay could not publish is refused as 0.3.0's row check refused it.
        for assignment in ("headers = '{\"event_id\": \"x\"}'", "headers = '{\"n\": 1}'", "headers = '[1]'",
                           "ce_type = 'com.example'", "target_partition = -1",
                           "ce_content_type = 'text/plain', ce_type = '', ce_source = '/s'"):
            state, _ = refusal(c, f"UPDATE outbox.events SET {assignment} WHERE event_id = %s", (poison,))
            assert state == "23514", assignment
    with connect(pg, db, user=reader) as c:  # no UPDATE right on the view
        state, _ = refusal(c, "UPDATE outbox.events SET payload = 'y' WHERE event_id = %s", (poison,))
        assert state == "42501"
    assert ring_state(pg, db) == before

    # Step 2: the row corrected through the view; step 3: retried.
    with connect(pg, db, user=dba) as c:
        cur = c.execute("UPDATE outbox.events SET payload = 'small', headers = '{\"fixed\": \"yes\"}', "
                        "target_partition = 0 WHERE event_id = %s RETURNING status", (poison,))
        assert cur.fetchall() == [("failed",)]
        assert c.execute("SELECT outbox.retry(%s)", (poison,)).fetchone() == (1,)
    # The view and the copy the relay publishes show the correction; the member row is not written.
    assert pg.sql("SELECT convert_from(payload, 'UTF8'), headers, target_partition, status, attempts FROM outbox.events "
                  "WHERE event_id = %s", (poison,), dbname=db) == [("small", {"fixed": "yes"}, 0, "pending", 0)]
    assert pg.sql("SELECT convert_from(payload, 'UTF8'), target_partition, status FROM outbox.event_state "
                  "WHERE event_id = %s", (poison,), dbname=db) == [("small", 0, "pending")]
    assert member_rows(pg, db) == before[2]
    # A pending event is not corrected (it is published as it is).
    with connect(pg, db, user=dba) as c:
        state, _ = refusal(c, "UPDATE outbox.events SET payload = 'again' WHERE event_id = %s", (poison,))
        assert state == "55000"
    runbook_teardown(pg, db, dba, reader)


def test_delete_or_update_of_an_event_retried_meanwhile_is_refused(pg):
    """A DELETE or UPDATE whose statement saw the event failed while a retry() of it commits
    (the trigger waits for the row, then finds it pending): refused, the retry stands."""
    db, poison, after, published, dba, reader = runbook_setup(pg)
    for statement in ("DELETE FROM outbox.events WHERE event_id = %s AND status = 'failed'",
                      "UPDATE outbox.events SET payload = 'y' WHERE event_id = %s"):
        pg.sql("UPDATE outbox.event_state SET status = 'failed' WHERE event_id = %s", (poison,), dbname=db)
        outcome = {}
        with connect(pg, db) as retrier, connect(pg, db, user=dba) as c:
            retrier.execute("BEGIN")
            assert retrier.execute("SELECT outbox.retry(%s)", (poison,)).fetchone() == (1,)
            pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]

            def run():
                try:
                    c.execute(statement, (poison,))
                    outcome["state"] = None
                except psycopg.Error as e:
                    outcome["state"], outcome["message"] = e.sqlstate, str(e)
            worker = threading.Thread(target=run)
            worker.start()
            wait_until(lambda: pg.value("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                        (pid,), dbname=db), 30, "the statement waits for the retry's row")
            retrier.execute("COMMIT")
            worker.join(30)
        assert outcome["state"] == "55000" and "no longer failed" in outcome["message"], statement
        assert pg.sql("SELECT status, convert_from(payload, 'UTF8') = %s FROM outbox.event_state WHERE event_id = %s",
                      ("x" * 3000, poison), dbname=db) == [("pending", True)], statement
    runbook_teardown(pg, db, dba, reader)


def test_purge_rotates_but_empties_no_member_a_cursor_has_not_passed(pg):
    db = fresh_database(pg, "0.4.0")
    for n in range(3):
        pg.sql("SELECT outbox.enqueue('t', %s, 'x'::text)", (f"k{n}",), dbname=db)
    # No relay ran here: no cursor has passed anything, so the sealed member keeps its rows.
    assert pg.value("SELECT outbox.purge(interval '0')", dbname=db) == 0
    assert pg.sql("SELECT member, is_current, sealed_at IS NOT NULL FROM outbox.ring ORDER BY member", dbname=db) == [
        (0, False, True), (1, True, False), (2, False, False), (3, False, False)]
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 3
    # New events go into the new current member; the view shows both.
    pg.sql("SELECT outbox.enqueue('t', 'k9', 'x'::text)", dbname=db)
    assert pg.value("SELECT count(*) FROM outbox.events_1", dbname=db) == 1
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status = 'pending'", dbname=db) == 4
    # A second round: the next member is free but events_0 is still sealed and unpassed.
    assert pg.value("SELECT outbox.purge(interval '0')", dbname=db) == 0
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 3
    with connect(pg, db) as c:
        state, _ = refusal(c, "SELECT outbox.purge(interval '-1 day')")
        assert state == "22023"
        # The member's TRUNCATE goes only through the retention's checks.
        state, hint = refusal(c, "TRUNCATE outbox.events_0")
        assert state == "55000" and "outbox.purge()" in hint
        state, hint = refusal(c, "SELECT outbox.truncate_ring_member(0::smallint)")
        assert state == "55000" and "outbox.purge()" in hint
        state, _ = refusal(c, "SELECT outbox.truncate_ring_member(7::smallint)")
        assert state == "22023"
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 3
    assert pg.value("SELECT has_function_privilege('public', 'outbox.truncate_ring_member(smallint)', 'EXECUTE') OR "
                    "has_function_privilege('public', 'outbox.ring_retention(interval)', 'EXECUTE')", dbname=db) is False
    # Cursors: slot 0 of 2 past every row, slot 1 never ran (it would start at ring_start):
    # events_0 is not passed. A cursor above the WAL insert position is not a relay's either.
    cursor = ("INSERT INTO outbox.cursors VALUES (2, %s, %s::pg_lsn, 0, "
              "(SELECT system_identifier FROM pg_control_system()), now())")
    pg.sql(cursor, (0, pg.value("SELECT pg_current_wal_insert_lsn()::text", dbname=db)), dbname=db)
    assert pg.value("SELECT outbox.purge(interval '0')", dbname=db) == 0
    with connect(pg, db) as c:  # a slot outside the count (complete by count, slot 1 missing): refused
        state, _ = refusal(c, cursor, (5, "FFFFFFFF/FFFFFFFF"))
        assert state == "23514"
    pg.sql(cursor, (1, "FFFFFFFF/FFFFFFFF"), dbname=db)  # above the WAL: forged
    assert pg.value("SELECT outbox.purge(interval '0')", dbname=db) == 0
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 3
    # A hole of a slot (an open writer its cursor passed, whose rows are still to be walked once it
    # committed) counts as a cursor just below the writer's lowest stamp: events_0 is not passed.
    pg.sql("UPDATE outbox.cursors SET order_lsn = pg_current_wal_insert_lsn(), hole_xids = '{1000}', "
           "hole_froms = ARRAY[(SELECT min(order_lsn) FROM outbox.events_0)], hole_walked_lsns = '{0/0}', "
           "hole_walked_ids = '{0}' WHERE worker = 1", dbname=db)
    assert pg.value("SELECT outbox.purge(interval '0')", dbname=db) == 0
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 3
    pg.sql("UPDATE outbox.cursors SET order_lsn = pg_current_wal_insert_lsn(), hole_xids = '{}', hole_froms = '{}', "
           "hole_walked_lsns = '{}', hole_walked_ids = '{}' WHERE worker = 1", dbname=db)
    assert pg.value("SELECT outbox.purge(interval '0')", dbname=db) == 0  # no landed rows: 0 published
    # Both sealed members are at or below the (hand-set) cursors now: events_0, then events_1
    # sealed in the same round, are emptied; events_2 is current.
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 0
    assert pg.value("SELECT count(*) FROM outbox.events_1", dbname=db) == 0
    assert pg.sql("SELECT member FROM outbox.ring WHERE is_current", dbname=db) == [(2,)]
    pg.sql(f"DROP DATABASE {db}")


def ring_status(conn, window="0"):
    """{member: (is_current, sealed, overdue, kept_because)} of outbox.ring_status(window)."""
    rows = conn.execute("SELECT member, is_current, sealed_at IS NOT NULL, overdue, kept_because "
                        "FROM outbox.ring_status(%s::interval)", (window,)).fetchall()
    return {m: tuple(rest) for m, *rest in rows}


def test_ring_status_says_what_keeps_a_sealed_member(pg):
    db = fresh_database(pg, "0.4.0")
    for n in range(3):
        pg.sql("SELECT outbox.enqueue('t', %s, 'x'::text)", (f"k{n}",), dbname=db)
    assert pg.value("SELECT outbox.purge(interval '0')", dbname=db) == 0  # sealed, no relay: kept
    with connect(pg, db) as c, connect(pg, db) as holder:
        status = ring_status(c)
        assert status[0] == (False, True, True, "no relay cursor yet (no relay has published from the ring)")
        assert status[1] == (True, False, False, None)
        assert status[2] == status[3] == (False, False, False, None)
        # Not past a window of a day: not overdue, no reason asked for.
        assert ring_status(c, "1 day")[0] == (False, True, False, None)
        # The view uses outbox.retention (7 days here), one row per member in order.
        assert pg.sql("SELECT member, overdue, kept_because FROM outbox.ring_status", dbname=db) == [
            (0, False, None), (1, False, None), (2, False, None), (3, False, None)]
        # A relay slot whose cursor is below the member's last row.
        cursor = ("INSERT INTO outbox.cursors VALUES (2, %s, %s::pg_lsn, 0, "
                  "(SELECT system_identifier FROM pg_control_system()), now())")
        pg.sql(cursor, (0, pg.value("SELECT pg_current_wal_insert_lsn()::text", dbname=db)), dbname=db)
        assert ring_status(c)[0][3] == "no cursor of worker slot 1 (n_workers 2) yet"
        pg.sql(cursor, (1, pg.value("SELECT order_lsn::text FROM outbox.ring_start", dbname=db)), dbname=db)
        assert ring_status(c)[0][3] == "cursor of worker slot 1 (n_workers 2) has not passed it"
        pg.sql("UPDATE outbox.cursors SET order_lsn = 'FFFFFFFF/FFFFFFFF' WHERE worker = 1", dbname=db)
        assert ring_status(c)[0][3].startswith("a cursor lies above the WAL insert position")
        pg.sql("UPDATE outbox.cursors SET order_lsn = pg_current_wal_insert_lsn() WHERE worker = 1", dbname=db)
        # Every cursor passed it; a session holds it (a long SELECT of it in an open transaction):
        # the retention skips it, the status names the session.
        holder.execute("BEGIN")
        holder.execute("SELECT count(*) FROM outbox.events_0")
        holder_pid = holder.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert ring_status(c)[0] == (False, True, True, f"locked by pid {holder_pid}")
        assert pg.value("SELECT outbox.purge(interval '0')", dbname=db) == 0
        assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 3
        # A second sealed member behind it waits for it (emptied oldest first).
        pg.sql("SELECT outbox.enqueue('t', 'k9', 'x'::text)", dbname=db)
        pg.sql("UPDATE outbox.cursors SET order_lsn = pg_current_wal_insert_lsn()", dbname=db)
        pg.sql("SELECT outbox.purge(interval '0')", dbname=db)
        status = ring_status(c)
        assert status[1] == (False, True, True, "member 0, sealed before it, is kept: members are emptied oldest first")
        # Asking keeps no lock on a member, also inside a transaction of the caller's.
        c.execute("BEGIN")
        ring_status(c)
        assert c.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND relation IN "
                         "('outbox.events_0'::regclass, 'outbox.events_1'::regclass)").fetchone()[0] == 0
        c.execute("COMMIT")
        # The holder ends: the next round empties both, and nothing is overdue any more.
        holder.execute("COMMIT")
        pg.sql("SELECT outbox.purge(interval '0')", dbname=db)
        assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 0
        assert [v[2] for v in ring_status(c).values()] == [False] * 4
        state, _ = refusal(c, "SELECT * FROM outbox.ring_status(interval '-1 day')")
        assert state == "22023"
    pg.sql(f"DROP DATABASE {db}")


def test_ring_status_says_nothing_is_overdue_while_the_retention_is_off(pg):
    """outbox.retention = 0: the relay never purges, so no member is overdue or kept for a reason;
    the view passes NULL (not a window of 0) and shows every member with overdue and
    kept_because NULL. outbox.ring_status(NULL) does the same."""
    pg.sql("ALTER SYSTEM SET outbox.retention = 0")
    pg.sql("SELECT pg_reload_conf()")
    db = fresh_database(pg, "0.4.0")
    try:
        wait_until(lambda: pg.value("SELECT current_setting('outbox.retention')", dbname=db) == "0", 30,
                   "outbox.retention = 0")
        pg.sql("SELECT outbox.enqueue('t', 'k', 'x'::text)", dbname=db)
        pg.sql("UPDATE outbox.ring SET opened_at = now() - interval '20 days' WHERE is_current", dbname=db)
        pg.value("SELECT outbox.purge(interval '30 days')", dbname=db)  # seals events_0, kept for 30 days
        assert pg.value("SELECT sealed_at IS NOT NULL FROM outbox.ring WHERE member = 0", dbname=db)
        assert pg.sql("SELECT member, is_current, sealed_at IS NOT NULL, overdue, kept_because "
                      "FROM outbox.ring_status", dbname=db) == [
            (0, False, True, None, None), (1, True, False, None, None), (2, False, False, None, None),
            (3, False, False, None, None)]
        assert pg.sql("SELECT member, overdue, kept_because FROM outbox.ring_status(NULL) ORDER BY member",
                      dbname=db) == [(m, None, None) for m in range(4)]
    finally:
        pg.sql("ALTER SYSTEM RESET outbox.retention")
        pg.sql("SELECT pg_reload_conf()")
        pg.sql(f"DROP DATABASE {db}")


def test_ring_status_is_for_monitoring_roles_only(pg):
    db = fresh_database(pg, "0.4.0")
    pg.sql("SELECT outbox.enqueue('t', 'k', 'secret'::text)", dbname=db)
    pg.sql("SELECT outbox.purge(interval '0')", dbname=db)
    assert pg.value("SELECT has_table_privilege('public', 'outbox.ring_status', 'SELECT') OR "
                    "has_function_privilege('public', 'outbox.ring_status(interval)', 'EXECUTE')", dbname=db) is False
    # A role with the schema's USAGE (and even SELECT on the ring) reads neither the view nor
    # the function.
    pg.sql(f"GRANT USAGE ON SCHEMA outbox TO {HOSTILE}", dbname=db)
    try:
        with connect(pg, db, user=HOSTILE) as c:
            for statement in ("SELECT * FROM outbox.ring_status", "SELECT * FROM outbox.ring_status(interval '0')",
                              "SELECT * FROM outbox.ring"):
                state, _ = refusal(c, statement)
                assert state == "42501", statement
    finally:
        pg.sql(f"REVOKE USAGE ON SCHEMA outbox FROM {HOSTILE}", dbname=db)
    # A monitoring role (pg_monitor, as for outbox.worker_metrics) reads it: members, times,
    # reasons; nothing of an event.
    pg.sql(f"GRANT pg_monitor TO {READER}")
    try:
        with connect(pg, db, user=READER) as c:
            rows = c.execute("SELECT * FROM outbox.ring_status(interval '0')").fetchall()
            assert len(rows) == 4 and not any("secret" in repr(r) for r in rows)
            assert [d.name for d in c.execute("SELECT * FROM outbox.ring_status").description] == [
                "member", "is_current", "opened_at", "sealed_at", "overdue", "kept_because"]
            state, _ = refusal(c, "SELECT * FROM outbox.events_0")
            assert state == "42501"
    finally:
        pg.sql(f"REVOKE pg_monitor FROM {READER}")
    # The exporter's ring query (docs/metrics/queries.yaml) runs on 0.3.0 too, returning nothing.
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "metrics", "queries.yaml")) as f:
        query = yaml.safe_load(f)["outbox_worker_ring"]["query"]
    assert pg.sql(query, dbname=OLD) == [] and pg.sql(query, dbname=db) == []  # (no worker here)
    # The relay role calls it (its retention reports what it could not empty).
    assert pg.value("SELECT has_function_privilege('outbox_relay', 'outbox.ring_status(interval)', 'EXECUTE')",
                    dbname=db)
    pg.sql(f"DROP DATABASE {db}")


def test_ring_status_reads_on_a_hot_standby(pg, standbys):
    db = fresh_database(pg, "0.4.0")
    pg.sql("SELECT outbox.enqueue('t', 'k', 'x'::text)", dbname=db)
    pg.sql("SELECT outbox.purge(interval '0')", dbname=db)
    pg.sql("INSERT INTO outbox.cursors VALUES (1, 0, '0/10'::pg_lsn, 0, "
           "(SELECT system_identifier FROM pg_control_system()), now())", dbname=db)
    standby = pg.make_standby("ring_standby", settings={"outbox.workers": "0"})
    standbys.append(standby)
    standby.start()
    written = pg.value("SELECT pg_current_wal_lsn()::text", dbname=db)
    wait_until(lambda: standby.value("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (written,)), 60,
               "the standby replayed the ring")
    assert standby.sql("SELECT member, overdue, kept_because FROM outbox.ring_status(interval '0') WHERE member = 0",
                       dbname=db) == [(0, True, "cursor of worker slot 0 (n_workers 1) has not passed it")]
    pg.sql(f"DROP DATABASE {db}")


def test_update_gives_worker_metrics_the_rings_columns_and_keeps_its_rights_and_dependents(pg):
    """The view gets the ring's columns at its end from a new function (the old one keeps 0.3.0's
    result columns: a function's cannot change in place), with the same rights; nothing is
    dropped, so a monitoring role's own view on outbox.worker_metrics does not stop the update."""
    db = fresh_database(pg, "0.3.0")
    dash = f"dash_{db}"
    pg.sql(f"CREATE ROLE {dash} LOGIN")
    pg.sql(f"GRANT pg_monitor TO {dash}")
    pg.sql(f"GRANT USAGE ON SCHEMA outbox TO {READER}; GRANT SELECT ON outbox.worker_metrics TO {READER}; "
           f"GRANT EXECUTE ON FUNCTION outbox.worker_metrics() TO {READER}; "
           f"CREATE SCHEMA {dash} AUTHORIZATION {dash}", dbname=db)
    try:
        with connect(pg, db, user=dash) as c:
            c.execute(f"CREATE VIEW {dash}.relay_published AS "
                      "SELECT worker, events_published FROM outbox.worker_metrics")
        pg.sql("ALTER EXTENSION outbox UPDATE TO '0.4.0'", dbname=db)
        assert pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname=db) == "0.4.0"
        columns = [c for c, _ in pg.sql(VIEW_COLUMNS_SQL, ("outbox.worker_metrics",), dbname=db)]
        assert columns[-3:] == ["events_resent", "ring_oldest_sealed_age_seconds", "ring_retention_stalls"]
        for role in (READER, "pg_monitor"):
            assert pg.value("SELECT has_table_privilege(%s, 'outbox.worker_metrics', 'SELECT') AND "
                            "has_function_privilege(%s, 'outbox.worker_metrics()', 'EXECUTE') AND "
                            "has_function_privilege(%s, 'outbox.worker_metrics_v2()', 'EXECUTE')",
                            (role, role, role), dbname=db)
        assert not pg.value("SELECT has_table_privilege('public', 'outbox.worker_metrics', 'SELECT') OR "
                            "has_function_privilege('public', 'outbox.worker_metrics()', 'EXECUTE') OR "
                            "has_function_privilege('public', 'outbox.worker_metrics_v2()', 'EXECUTE')", dbname=db)
        with connect(pg, db, user=READER) as c:
            assert c.execute("SELECT count(*) FROM outbox.worker_metrics").fetchone()[0] == 0  # no worker here
            assert c.execute("SELECT count(*) FROM outbox.worker_metrics()").fetchone()[0] == 0  # 0.3.0's columns
        with connect(pg, db, user=dash) as c:
            assert c.execute(f"SELECT count(*) FROM {dash}.relay_published").fetchone()[0] == 0
            assert c.execute("SELECT count(*) FROM outbox.worker_metrics").fetchone()[0] == 0
    finally:
        pg.sql(f"DROP DATABASE {db}")
        pg.sql(f"DROP ROLE {dash}")


def test_drop_extension_leaves_nothing(pg):
    db = fresh_database(pg, "0.4.0")
    pg.sql("SELECT outbox.enqueue('t', 'k', 'x'::text)", dbname=db)
    pg.sql("DROP EXTENSION outbox", dbname=db)
    assert pg.value("SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'", dbname=db) == 0
    pg.sql(f"DROP DATABASE {db}")


def test_a_dump_keeps_which_ids_are_callers_and_the_rebase_keeps_dedup(pg, tmp_path):
    """pg_dump of a 0.4.1 database writes the members' caller_event_id (they are config-dumped), so
    a restore into 0.4.1 keeps each row's choice: a caller's id indexed and deduplicated, a
    generated one not (the stamp trigger takes the restored false for an id with enqueue's mark). The re-base
    of the restored cursor copies every unpublished row into event_state, after which a caller's id
    is still a duplicate. A 0.4.0 dump restored into 0.4.1 (no such column) gives every row true
    (its generated id is indexed, as it was on 0.4.0). Without the column in the dump the 0.4.1
    case would restore its generated id true: the first assertion tells."""
    for version in (None, "0.4.0"):
        src, dst = fresh_database(pg, version), "r" + uuid.uuid4().hex[:10]
        given = uuid.uuid4()
        with connect(pg, src) as c:
            generated = c.execute("SELECT outbox.enqueue('dump', 'k', 'g'::text)").fetchone()[0]
            c.execute("SELECT outbox.enqueue('dump', 'k', 'c'::text, event_id => %s)", (given,))
            # A relay's cursor of this system: restored elsewhere it is a foreign one (H6).
            c.execute("INSERT INTO outbox.cursors (n_workers, worker, order_lsn, id, system_identifier, updated_at) "
                      "SELECT 1, 0, r.order_lsn, 0, s.system_identifier, now() "
                      "FROM outbox.ring_start r, pg_control_system() s")
        dump = tmp_path / f"{src}.dump"
        subprocess.run(["pg_dump", "-h", pg.tmp, "-p", str(pg.port), "-U", "postgres", "-Fc", "-f", str(dump), src],
                       check=True)
        pg.sql(f"CREATE DATABASE {dst}")
        pg.sql("CREATE EXTENSION outbox", dbname=dst)  # the default, 0.4.1, whatever the dump's version
        subprocess.run(["pg_restore", "-h", pg.tmp, "-p", str(pg.port), "-U", "postgres", "-d", dst,
                        "--data-only", "--exit-on-error", str(dump)], check=True)
        want = [(generated, version is not None), (given, True)]  # a 0.4.0 dump's rows: true
        with connect(pg, dst) as c:
            assert c.execute("SELECT event_id, caller_event_id FROM outbox.events_0 ORDER BY id").fetchall() == want
            assert index_entries(c) == (2 if version else 1)
            c.execute("UPDATE outbox.cursors SET system_identifier = system_identifier + 1")
            assert c.execute("SELECT rebased, copied FROM outbox.ring_rebase()").fetchone() == (1, 2)
            assert c.execute("SELECT outbox.enqueue('dump', 'k', 'again'::text, event_id => %s)",
                             (given,)).fetchone()[0] is None
        for db in (src, dst):
            pg.sql(f"DROP DATABASE {db}")
