"""Attacks on schema 0.4.0, the preview of the insert-only queue (DESIGN.md "The insert-only
queue"): what the upgrade does with rights passed on WITH GRANT OPTION, what the relay role may
change, and event ids that outlive the member their event was written into. Without the relay
(outbox.workers = 0): the relay's outcomes and cursors are written by hand, as the relay writes
them (src/relay/ring_claim.cpp)."""

import uuid

import psycopg
import pytest

from harness.grants import PUBLIC_GRANTS_SQL
from harness.pg_cluster import PgCluster


@pytest.fixture(scope="module")
def pg():
    with PgCluster(settings={"outbox.workers": "0"}, create_extension=False) as cluster:
        yield cluster


def fresh_database(pg, version=None):
    db = "a" + uuid.uuid4().hex[:10]
    pg.sql(f"CREATE DATABASE {db}")
    pg.sql("CREATE EXTENSION outbox" + (f" VERSION '{version}'" if version else ""), dbname=db)
    return db


def connect(pg, db, user="postgres"):
    return psycopg.connect(host=pg.tmp, port=pg.port, user=user, dbname=db, autocommit=True)


def refusal(conn, statement, params=None):
    """(sqlstate, hint) of a statement that must fail."""
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, params)
    return caught.value.sqlstate, caught.value.diag.message_hint or ""


def rights(pg, db, role, table):
    return pg.value("SELECT string_agg(p, ',' ORDER BY p) FROM unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE',"
                    "'TRUNCATE','REFERENCES','TRIGGER']) p WHERE has_table_privilege(%s, %s, p)",
                    (role, table), dbname=db)


def test_update_keeps_rights_passed_on_with_grant_option(pg):
    """A role with a right WITH GRANT OPTION on 0.3.0's table that passed it on (table and
    column rights): the upgrade neither fails on the dependent grants nor leaves any of them on
    the member; both roles have their rights on the view."""
    db = fresh_database(pg, "0.3.0")
    tag = uuid.uuid4().hex[:6]
    lead, member = f"lead_{tag}", f"dev_{tag}"
    for role in (lead, member):
        pg.sql(f"CREATE ROLE {role}")
        pg.sql(f"GRANT USAGE ON SCHEMA outbox TO {role}", dbname=db)
    pg.sql(f"GRANT SELECT, INSERT ON outbox.events TO {lead} WITH GRANT OPTION", dbname=db)
    pg.sql(f"GRANT SELECT (topic) ON outbox.events TO {lead} WITH GRANT OPTION", dbname=db)
    with connect(pg, db) as c:
        c.execute(f"SET ROLE {lead}")
        c.execute(f"GRANT SELECT ON outbox.events TO {member}")
        c.execute(f"GRANT SELECT (topic) ON outbox.events TO {member}")
        c.execute("RESET ROLE")
        c.execute("ALTER EXTENSION outbox UPDATE TO '0.4.0'")
    assert pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname=db) == "0.4.0"
    assert rights(pg, db, lead, "outbox.events") == "INSERT,SELECT"
    assert pg.value("SELECT has_table_privilege(%s, 'outbox.events', 'SELECT WITH GRANT OPTION')", (lead,), dbname=db)
    assert rights(pg, db, member, "outbox.events") == "SELECT"
    assert pg.value("SELECT has_column_privilege(%s, 'outbox.events', 'topic', 'SELECT')", (member,), dbname=db)
    for role in (lead, member):
        assert rights(pg, db, role, "outbox.events_0") is None, role
        assert not pg.value("SELECT has_any_column_privilege(%s, 'outbox.events_0', 'SELECT')", (role,), dbname=db)
    pg.sql(f"DROP DATABASE {db}")
    for role in (member, lead):
        pg.sql(f"DROP ROLE {role}")


def test_relay_role_may_not_delete_cursors_or_landed_rows(pg):
    """The relay moves its cursors forward and inserts landed rows; deleting them (which would
    let the retention empty a member whose events were never sent, or hide where events
    landed) is the retention's, as the owner."""
    for db in (fresh_database(pg, "0.4.0"), fresh_database(pg, "0.3.0")):
        pg.sql("ALTER EXTENSION outbox UPDATE TO '0.4.0'", dbname=db)  # no-op for the first
        assert rights(pg, db, "outbox_relay", "outbox.cursors") == "INSERT,SELECT,UPDATE"
        assert rights(pg, db, "outbox_relay", "outbox.landed") == "INSERT"
        assert rights(pg, db, "outbox_relay", "outbox.event_state") == "DELETE,INSERT,SELECT,UPDATE"
        pg.sql(f"DROP DATABASE {db}")


def empty_member_zero_with_one_failed_event(pg, db, event_id):
    """Event `event_id` enqueued into events_0, failed by hand in event_state as the relay's
    quarantine writes it, a cursor past it, and events_0 sealed and emptied by outbox.purge():
    the event is known by its event_state row alone."""
    pg.sql("SELECT outbox.enqueue('dedup', 'k', 'x'::text, NULL, %s)", (event_id,), dbname=db)
    pg.sql("INSERT INTO outbox.event_state (id, member, event_id, topic, key, lane, payload, headers, created_at, "
           "order_lsn, member_lsn, writer, status, attempts, last_error) "
           "SELECT id, 0, event_id, topic, key, lane, payload, headers, created_at, order_lsn, order_lsn, writer, 'failed', 1, "
           "'poison' FROM outbox.events_0", dbname=db)
    pg.sql("INSERT INTO outbox.cursors VALUES (1, 0, pg_current_wal_insert_lsn(), 0, "
           "(SELECT system_identifier FROM pg_control_system()), now())", dbname=db)
    pg.value("SELECT outbox.purge(interval '0')", dbname=db)
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 0
    assert pg.sql("SELECT event_id::text, status FROM outbox.events", dbname=db) == [(event_id, "failed")]


def test_an_event_id_whose_member_was_emptied_is_still_deduplicated(pg):
    db = fresh_database(pg, "0.4.0")
    event_id = str(uuid.uuid4())
    empty_member_zero_with_one_failed_event(pg, db, event_id)
    # enqueue() reports the duplicate (NULL) and writes nothing.
    assert pg.value("SELECT outbox.enqueue('dedup', 'k', 'again'::text, NULL, %s)", (event_id,), dbname=db) is None
    with connect(pg, db) as c:
        state, hint = refusal(c, "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                                 "VALUES (%s, 'dedup', 'k', outbox.lane_of('k', NULL), 'again')", (event_id,))
        assert state == "23505" and "enqueue()" in hint
    assert pg.value("SELECT count(*) FROM outbox.events WHERE event_id = %s", (event_id,), dbname=db) == 1
    assert pg.value("SELECT count(*) FROM outbox.events_1", dbname=db) == 0
    # retry() of it puts that one row back.
    assert pg.value("SELECT outbox.retry(%s)", (event_id,), dbname=db) == 1
    assert pg.sql("SELECT status, attempts FROM outbox.event_state", dbname=db) == [("pending", 0)]
    pg.sql(f"DROP DATABASE {db}")


def test_a_duplicate_into_another_member_by_hand_is_refused(pg):
    db = fresh_database(pg, "0.4.0")
    event_id = str(uuid.uuid4())
    pg.sql("SELECT outbox.enqueue('dedup', 'k', 'x'::text, NULL, %s)", (event_id,), dbname=db)
    pg.value("SELECT outbox.purge(interval '0')", dbname=db)  # rotates: events_1 is current, events_0 kept
    assert pg.value("SELECT member FROM outbox.ring WHERE is_current", dbname=db) == 1
    with connect(pg, db) as c:
        state, _ = refusal(c, "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                              "VALUES (%s, 'dedup', 'k', outbox.lane_of('k', NULL), 'again')", (event_id,))
        assert state == "23505"
    assert pg.value("SELECT outbox.enqueue('dedup', 'k', 'again'::text, NULL, %s)", (event_id,), dbname=db) is None
    assert pg.value("SELECT count(*) FROM outbox.events WHERE event_id = %s", (event_id,), dbname=db) == 1
    pg.sql(f"DROP DATABASE {db}")


def test_retry_puts_back_only_the_failed_row_of_an_event_id(pg):
    """Two rows of one event_id in event_state (two enqueues of one caller id around a rotation
    can both commit, DESIGN.md "Retention"): retry() resets the failed one and leaves the
    attempts and retry time of the other."""
    db = fresh_database(pg, "0.4.0")
    event_id = str(uuid.uuid4())
    empty_member_zero_with_one_failed_event(pg, db, event_id)
    pg.sql("INSERT INTO outbox.event_state (id, member, event_id, topic, key, lane, payload, created_at, order_lsn, "
           "member_lsn, writer, status, attempts, next_attempt_at, last_error) "
           "SELECT nextval('outbox.events_id_seq'), 1, event_id, topic, key, lane, payload, created_at, order_lsn, "
           "member_lsn, writer, 'pending', 3, now() + interval '1 hour', 'broker down' FROM outbox.event_state", dbname=db)
    assert pg.value("SELECT outbox.retry(%s)", (event_id,), dbname=db) == 1
    assert pg.sql("SELECT status, attempts, next_attempt_at IS NULL FROM outbox.event_state ORDER BY id",
                  dbname=db) == [("pending", 0, True), ("pending", 3, False)]
    with connect(pg, db) as c:
        state, _ = refusal(c, "SELECT outbox.retry(%s)", (event_id,))  # nothing failed any more
        assert state == "55000"
    pg.sql(f"DROP DATABASE {db}")


def test_retry_returns_how_many_rows_of_an_event_id_it_put_back(pg):
    """Two failed rows of one event_id (forged by hand, as two enqueues of one caller id around
    a rotation can leave them): retry() puts both back and says 2, not 1."""
    db = fresh_database(pg, "0.4.0")
    event_id = str(uuid.uuid4())
    empty_member_zero_with_one_failed_event(pg, db, event_id)
    pg.sql("INSERT INTO outbox.event_state (id, member, event_id, topic, key, lane, payload, created_at, order_lsn, "
           "member_lsn, writer, status, attempts, next_attempt_at, last_error) "
           "SELECT nextval('outbox.events_id_seq'), 1, event_id, topic, key, lane, payload, created_at, order_lsn, "
           "member_lsn, writer, 'failed', 5, NULL, 'broker down' FROM outbox.event_state", dbname=db)
    assert pg.value("SELECT outbox.retry(%s)", (event_id,), dbname=db) == 2
    assert pg.sql("SELECT status, attempts FROM outbox.event_state ORDER BY id", dbname=db) == [
        ("pending", 0), ("pending", 0)]
    pg.sql(f"DROP DATABASE {db}")


def test_a_row_by_hand_follows_a_rotation_under_repeatable_read(pg):
    """A REPEATABLE READ transaction whose snapshot predates a rotation writes into the member that
    is current now, as enqueue does, not into the one its snapshot shows current; and its rows by
    hand and by enqueue go into one member."""
    db = fresh_database(pg, "0.4.0")
    pg.sql("SELECT outbox.enqueue('rr', 'k', 'first'::text)", dbname=db)
    with connect(pg, db) as writer:
        writer.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert writer.execute("SELECT member FROM outbox.ring WHERE is_current").fetchone() == (0,)  # the snapshot
        pg.value("SELECT outbox.purge(interval '0')", dbname=db)  # seals events_0, events_1 current
        writer.execute("INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                       "VALUES (gen_random_uuid(), 'rr', 'k', outbox.lane_of('k', NULL), 'by hand')")
        writer.execute("SELECT outbox.enqueue('rr', 'k', 'enqueued'::text)")
        writer.execute("COMMIT")
    assert pg.sql("SELECT convert_from(payload, 'UTF8') FROM outbox.events_1 ORDER BY id", dbname=db) == [
        ("by hand",), ("enqueued",)]
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 1
    with connect(pg, db, user="postgres") as c:
        c.execute(f"CREATE ROLE caller_{db}")
        c.execute(f"GRANT USAGE ON SCHEMA outbox TO caller_{db}")
        c.execute(f"SET ROLE caller_{db}")
        state, _ = refusal(c, "SELECT outbox.current_ring_member()")
        assert state == "42501"
        c.execute("RESET ROLE")
    pg.sql(f"DROP DATABASE {db}")
    pg.sql(f"DROP ROLE caller_{db}")


def test_an_enqueue_after_a_rolled_back_savepoint_follows_a_rotation(pg):
    """The member lock taken inside a savepoint goes with ROLLBACK TO SAVEPOINT; the retention may
    then empty that member and move the current pointer: the next enqueue of the transaction goes
    into the current member, not the emptied one."""
    db = fresh_database(pg, "0.4.0")
    with connect(pg, db) as writer:
        writer.execute("BEGIN")
        writer.execute("SAVEPOINT a")
        writer.execute("SELECT outbox.enqueue('sp', 'k', 'rolled back'::text)")
        writer.execute("ROLLBACK TO SAVEPOINT a")
        pg.sql("SELECT outbox.enqueue('sp', 'k', 'committed'::text)", dbname=db)
        pg.sql("INSERT INTO outbox.cursors VALUES (1, 0, pg_current_wal_insert_lsn(), 0, "
               "(SELECT system_identifier FROM pg_control_system()), now())", dbname=db)
        pg.value("SELECT outbox.purge(interval '0')", dbname=db)  # seals events_0 and empties it
        assert pg.sql("SELECT member, is_current FROM outbox.ring WHERE member < 2 ORDER BY member", dbname=db) == [
            (0, False), (1, True)]
        assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 0
        writer.execute("SELECT outbox.enqueue('sp', 'k', 'after'::text)")
        writer.execute("COMMIT")
    assert pg.value("SELECT count(*) FROM outbox.events_0", dbname=db) == 0
    assert pg.sql("SELECT convert_from(payload, 'UTF8') FROM outbox.events_1", dbname=db) == [("after",)]
    pg.sql(f"DROP DATABASE {db}")


@pytest.mark.parametrize("path", ["enqueue", "view"])
@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_an_id_committed_after_the_snapshot_into_another_member_is_not_duplicated(pg, path, isolation):
    """Under REPEATABLE READ or SERIALIZABLE, an id another transaction committed after this one's
    snapshot, in a member since sealed: 40001 (0.3.0's unique index gave the same), nothing
    written; retried, the transaction sees the event and enqueue() returns NULL."""
    db = fresh_database(pg, "0.4.0")
    event_id = str(uuid.uuid4())
    statement = {"enqueue": "SELECT outbox.enqueue('rr', 'k', 'second'::text, NULL, %s)",
                 "view": "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                         "VALUES (%s, 'rr', 'k', outbox.lane_of('k', NULL), 'second')"}[path]
    with connect(pg, db) as c:
        c.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        c.execute("SELECT 1")  # the snapshot
        pg.sql("SELECT outbox.enqueue('rr', 'k', 'first'::text, NULL, %s)", (event_id,), dbname=db)
        pg.value("SELECT outbox.purge(interval '0')", dbname=db)  # events_0 sealed, kept; events_1 current
        state, _ = refusal(c, statement, (event_id,))
        assert state == "40001"
        c.execute("ROLLBACK")
        c.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        if path == "enqueue":
            assert c.execute(statement, (event_id,)).fetchone() == (None,)
        else:
            state, _ = refusal(c, statement, (event_id,))
            assert state == "23505"
        c.execute("ROLLBACK")
    assert pg.value("SELECT count(*) FROM outbox.events WHERE event_id = %s", (event_id,), dbname=db) == 1
    pg.sql(f"DROP DATABASE {db}")


def test_a_cursor_row_of_another_shape_is_refused(pg):
    db = fresh_database(pg, "0.4.0")
    with connect(pg, db) as c:
        for n_workers, worker in ((-2147483648, 0), (2147483647, 0), (0, 0), (2, 2), (2, -1)):
            state, _ = refusal(c, "INSERT INTO outbox.cursors VALUES (%s, %s, '0/0', 0, "
                                  "(SELECT system_identifier FROM pg_control_system()), now())", (n_workers, worker))
            assert state == "23514", (n_workers, worker)
    pg.sql(f"DROP DATABASE {db}")


# The ring's functions that only the extension's own code calls (the view's trigger, enqueue,
# the retention): neither PUBLIC nor the relay role may call them, a caller with USAGE on the
# schema and nothing else least of all.
RING_INTERNALS = ("SELECT outbox.ring_keeps_event_id(gen_random_uuid())", "SELECT outbox.ring_cursor_floor()",
                  "SELECT outbox.current_ring_member()", "SELECT outbox.truncate_ring_member(0::smallint)")


def test_nothing_of_the_ring_is_granted_to_public_and_a_plain_role_may_call_none_of_it(pg):
    for db in (fresh_database(pg, "0.4.0"), fresh_database(pg, "0.3.0")):
        pg.sql("ALTER EXTENSION outbox UPDATE TO '0.4.0'", dbname=db)  # no-op for the first
        assert pg.sql(PUBLIC_GRANTS_SQL, dbname=db) == []
        role = f"plain_{db}"
        with connect(pg, db) as c:
            c.execute(f"CREATE ROLE {role}")
            c.execute(f"GRANT USAGE ON SCHEMA outbox TO {role}")
            for who in (role, "outbox_relay"):
                c.execute(f"SET ROLE {who}")
                for statement in RING_INTERNALS + (() if who == "outbox_relay" else (
                        "SELECT outbox.ring_retention(interval '0')", "SELECT * FROM outbox.ring_status",
                        "SELECT * FROM outbox.ring_status(interval '0')", "SELECT * FROM outbox.cursors",
                        "SELECT * FROM outbox.landed", "SELECT * FROM outbox.event_state",
                        "SELECT * FROM outbox.ring", "SELECT * FROM outbox.events_0",
                        "SELECT nextval('outbox.events_id_seq')")):
                    state, _ = refusal(c, statement)
                    assert state == "42501", (who, statement)
                c.execute("RESET ROLE")
            # The check above can fail: a right given to PUBLIC shows.
            c.execute("GRANT EXECUTE ON FUNCTION outbox.ring_cursor_floor() TO PUBLIC")
            assert pg.sql(PUBLIC_GRANTS_SQL, dbname=db) == [("function", "outbox.ring_cursor_floor()", "EXECUTE")]
        pg.sql(f"DROP DATABASE {db}")
        pg.sql(f"DROP ROLE {role}")


def member_of(pg, db, payload):
    """The ring member that holds the one event with this payload."""
    rows = [m for m in range(4) if pg.value(f"SELECT count(*) FROM outbox.events_{m} "
                                            "WHERE convert_from(payload, 'UTF8') = %s", (payload,), dbname=db)]
    assert len(rows) == 1, rows
    return rows[0]


def test_a_session_that_keeps_the_current_member_sees_another_sessions_rotation_at_its_next_enqueue(pg):
    """enqueue keeps the current member between transactions (queue_target.cpp); a rotation that
    another session committed is seen by the next enqueue, in a new transaction and in one that
    began (REPEATABLE READ, its snapshot taken, the ring read) before the rotation."""
    db = fresh_database(pg, "0.4.0")
    with connect(pg, db) as writer:
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'a'::text)")
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'a2'::text)")  # the member kept, if ever
        assert member_of(pg, db, "a") == member_of(pg, db, "a2") == 0
        pg.value("SELECT outbox.purge(interval '0')", dbname=db)  # events_0 sealed (kept), events_1 current
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'b'::text)")
        assert member_of(pg, db, "b") == 1
        writer.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert writer.execute("SELECT member FROM outbox.ring WHERE is_current").fetchone() == (1,)
        pg.value("SELECT outbox.purge(interval '0')", dbname=db)  # events_1 sealed, events_2 current
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'c'::text)")
        writer.execute("COMMIT")
        assert member_of(pg, db, "c") == 2
    pg.sql(f"DROP DATABASE {db}")


def test_the_current_member_is_read_again_after_a_change_of_the_ring_in_the_session_itself(pg):
    """The session's own change of outbox.ring (by hand, as a superuser can) is seen by its next
    enqueue in that transaction, and forgotten when it rolls back (also back to a savepoint)."""
    db = fresh_database(pg, "0.4.0")
    move = "UPDATE outbox.ring SET is_current = (member = %s)"
    in_member = "SELECT count(*) FROM outbox.events_{} WHERE convert_from(payload, 'UTF8') = %s"
    with connect(pg, db) as writer:
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'a'::text)")
        writer.execute("BEGIN")
        writer.execute(move, (1,))
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'b'::text)")
        assert writer.execute(in_member.format(1), ("b",)).fetchone() == (1,)
        writer.execute("ROLLBACK")
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'c'::text)")
        writer.execute("BEGIN")
        writer.execute("SAVEPOINT s")
        writer.execute(move, (3,))
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'x'::text)")
        assert writer.execute(in_member.format(3), ("x",)).fetchone() == (1,)
        writer.execute("ROLLBACK TO SAVEPOINT s")
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'd'::text)")
        writer.execute("COMMIT")
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'e'::text)")
    assert [member_of(pg, db, p) for p in ("a", "c", "d", "e")] == [0, 0, 0, 0]
    assert pg.value("SELECT count(*) FROM outbox.events WHERE convert_from(payload, 'UTF8') IN ('b', 'x')",
                    dbname=db) == 0
    pg.sql(f"DROP DATABASE {db}")


@pytest.mark.parametrize("how", ["disabled", "origin", "dropped"])
def test_without_the_rings_trigger_every_transaction_reads_the_ring(pg, how):
    """The current member is kept only while outbox.ring's trigger ring_changed fires at every
    change (ENABLE ALWAYS): disabled, left to session_replication_role, or dropped, a change made
    with it silent is still seen by the next enqueue."""
    db = fresh_database(pg, "0.4.0")
    change = {"disabled": "ALTER TABLE outbox.ring DISABLE TRIGGER ring_changed",
              "origin": "ALTER TABLE outbox.ring ENABLE TRIGGER ring_changed",
              "dropped": "DROP TRIGGER ring_changed ON outbox.ring"}[how]
    with connect(pg, db) as writer:
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'a'::text)")
        pg.sql(change, dbname=db)
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'b'::text)")  # the ring read again, then kept?
        with connect(pg, db) as mover:
            mover.execute("SET session_replication_role = replica")  # no ENABLE (ORIGIN) trigger fires
            mover.execute("UPDATE outbox.ring SET is_current = (member = 2)")
        writer.execute("SELECT outbox.enqueue('keep', 'k', 'c'::text)")
    assert [member_of(pg, db, p) for p in ("a", "b", "c")] == [0, 0, 2]
    pg.sql(f"DROP DATABASE {db}")


def whole_reads(plan, relation):
    """The scans of member `relation` in a plan (EXPLAIN FORMAT JSON) that read it whole: a Seq
    Scan, or an index scan bounded by neither leading column of its indexes (order_lsn of the
    order index, event_id), e.g. the order index walked for an id alone."""
    found = []
    def walk(node):
        cond = node.get("Index Cond", "")
        if node.get("Relation Name") == relation and "order_lsn" not in cond and "event_id" not in cond:
            found.append((node["Node Type"], cond))
        for child in node.get("Plans", []):
            walk(child)
    walk(plan[0]["Plan"])
    return found


def test_the_view_finds_a_failed_events_member_row_by_its_order_index_also_after_a_re_base(pg):
    """outbox.events matches an event_state row to its member row by the member row's stamp
    (member_lsn), a probe of the member's order index: a status lookup of a failed event reads
    no member whole, before and after a re-base renumbers event_state's order_lsn."""
    db = fresh_database(pg, "0.4.0")
    event_id = str(uuid.uuid4())
    pg.sql("SELECT outbox.enqueue('probe', 'k' || g, 'x'::text) FROM generate_series(1, 20000) g", dbname=db)
    pg.sql("SELECT outbox.enqueue('probe', 'poison', 'x'::text, NULL, %s)", (event_id,), dbname=db)
    pg.sql("INSERT INTO outbox.event_state (id, member, event_id, topic, key, lane, payload, headers, created_at, "
           "order_lsn, member_lsn, writer, status, attempts, last_error) "
           "SELECT id, 0, event_id, topic, key, lane, payload, headers, created_at, order_lsn, order_lsn, writer, "
           "'failed', 1, 'poison' FROM outbox.events_0 WHERE event_id = %s", (event_id,), dbname=db)
    query = "EXPLAIN (FORMAT JSON) SELECT status FROM outbox.events WHERE event_id = %s"
    pg.sql("ANALYZE", dbname=db)
    assert whole_reads(pg.value(query, (event_id,), dbname=db), "events_0") == []
    # A cursor of another system: the re-base renumbers every event_state row's order_lsn.
    pg.sql("INSERT INTO outbox.cursors VALUES (1, 0, pg_current_wal_insert_lsn(), 0, 1, now())", dbname=db)
    assert pg.sql("SELECT * FROM outbox.ring_rebase()", dbname=db)[0][0] == 1
    assert pg.value("SELECT order_lsn < '0/100000' FROM outbox.event_state WHERE event_id = %s",
                    (event_id,), dbname=db) is True
    pg.sql("ANALYZE", dbname=db)
    assert whole_reads(pg.value(query, (event_id,), dbname=db), "events_0") == []
    assert pg.sql("SELECT status FROM outbox.events WHERE event_id = %s", (event_id,), dbname=db) == [("failed",)]
    pg.sql(f"DROP DATABASE {db}")
