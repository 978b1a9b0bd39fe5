"""enqueue's two ways into a 0.4.0 ring member (src/enqueue/member_insert.cpp): an event with a
generated id is written straight into the member, without an INSERT statement; one with the
caller's id (its dedup needs ON CONFLICT and the other members' probes) and any event into a
member of a shape the direct way does not know take the statement. pg_stat_statements with
track = all counts the statements enqueue runs, so it tells which way each event took; the rows
of both ways must be alike."""

import uuid

import psycopg
import pytest

from harness.pg_cluster import PgCluster

INSERT_LIKE = "INSERT INTO outbox.events_%"


@pytest.fixture(scope="module")
def pg():
    settings = {"outbox.workers": "0", "shared_preload_libraries": "'outbox,pg_stat_statements'",
                "pg_stat_statements.track": "all"}
    with PgCluster(settings=settings) as cluster:
        cluster.sql("CREATE EXTENSION pg_stat_statements")
        yield cluster


def member_statements(c):
    """How often enqueue ran its INSERT statement into a member."""
    return c.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE %s",
                     (INSERT_LIKE,)).fetchone()[0]


def lsn(text):
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def member_row(c, event_id):
    return c.execute("SELECT id, created_at = now() AS created_now, order_lsn, writer = pg_current_xact_id(), "
                     "lane = outbox.lane_of(key, event_id) FROM outbox.events_0 WHERE event_id = %s",
                     (event_id,)).fetchone()


def test_a_generated_id_goes_straight_in_a_callers_id_through_the_statement(pg):
    with psycopg.connect(host=pg.tmp, port=pg.port, user="postgres", dbname="postgres", autocommit=True) as c:
        c.execute("SELECT pg_stat_statements_reset()")
        c.execute("BEGIN")
        ids = [c.execute("SELECT outbox.enqueue('paths', %s, 'x'::text)", (key,)).fetchone()[0]
               for key in ("k1", "k2", None, "k1")]
        c.execute("SELECT outbox.enqueue('paths', 'k3', '{}'::jsonb, partition => 2, cloudevents => true)")
        assert member_statements(c) == 0, "an event with a generated id went through the INSERT statement"
        rows = [member_row(c, i) for i in ids]
        callers = [str(uuid.uuid4()) for _ in range(2)]
        for caller in callers:
            assert c.execute("SELECT outbox.enqueue('paths', 'k1', 'y'::text, NULL, %s)",
                             (caller,)).fetchone()[0] == uuid.UUID(caller)
        assert member_statements(c) == 2
        # The caller's id again: the statement's dedup, nothing written.
        assert c.execute("SELECT outbox.enqueue('paths', 'k1', 'z'::text, NULL, %s)", (callers[0],)).fetchone()[0] is None
        rows += [member_row(c, i) for i in callers]
        c.execute("COMMIT")
    # Both ways alike: ids and stamps rising in enqueue order, the transaction's time and id, the lane of the key.
    assert all(r is not None and r[1] and r[3] and r[4] for r in rows), rows
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    assert [lsn(r[2]) for r in rows] == sorted(lsn(r[2]) for r in rows)
    assert pg.value("SELECT count(*) FROM outbox.events WHERE topic = 'paths' AND status = 'pending'") == 7


def test_a_member_with_an_administrators_trigger_takes_the_statement(pg):
    pg.sql("CREATE TABLE public.seen (event_id uuid)")
    pg.sql("CREATE FUNCTION public.seen() RETURNS trigger LANGUAGE plpgsql AS "
           "$$ BEGIN INSERT INTO public.seen VALUES (NEW.event_id); RETURN NEW; END $$")
    member = pg.value("SELECT member FROM outbox.ring WHERE is_current")
    pg.sql(f"CREATE TRIGGER seen AFTER INSERT ON outbox.events_{member} FOR EACH ROW EXECUTE FUNCTION public.seen()")
    try:
        with psycopg.connect(host=pg.tmp, port=pg.port, user="postgres", dbname="postgres", autocommit=True) as c:
            c.execute("SELECT pg_stat_statements_reset()")
            event_id = c.execute("SELECT outbox.enqueue('paths', 'k', 'x'::text)").fetchone()[0]
            assert member_statements(c) == 1
    finally:
        pg.sql(f"DROP TRIGGER seen ON outbox.events_{member}")
    assert pg.value("SELECT array_agg(event_id) FROM public.seen") == [event_id]
    with psycopg.connect(host=pg.tmp, port=pg.port, user="postgres", dbname="postgres", autocommit=True) as c:
        c.execute("SELECT pg_stat_statements_reset()")
        c.execute("SELECT outbox.enqueue('paths', 'k', 'x'::text)")
        assert member_statements(c) == 0, "the trigger is gone: the direct way again"


def test_the_direct_way_stamps_under_session_replication_role_replica(pg):
    # The stamp trigger is ENABLE ALWAYS (a restore, logical replication): the direct way stamps too.
    with psycopg.connect(host=pg.tmp, port=pg.port, user="postgres", dbname="postgres", autocommit=True) as c:
        c.execute("SET session_replication_role = replica")
        c.execute("SELECT pg_stat_statements_reset()")
        c.execute("BEGIN")
        event_id = c.execute("SELECT outbox.enqueue('paths', 'r', 'x'::text)").fetchone()[0]
        assert member_statements(c) == 0
        assert c.execute("SELECT order_lsn > '0/0', writer = pg_current_xact_id() FROM outbox.events_0 "
                         "WHERE event_id = %s", (event_id,)).fetchone() == (True, True)
        c.execute("COMMIT")


STAMP = ('CREATE TRIGGER "~outbox_stamp" BEFORE INSERT ON outbox.events_0 FOR EACH ROW {when}'
         'EXECUTE FUNCTION outbox.generation_stamp(); '
         'ALTER TABLE outbox.events_0 ENABLE ALWAYS TRIGGER "~outbox_stamp"')
# Owner changes to the current member that the direct way does not make itself: each sends the
# event through the statement, whose executor does what the change asks; undone, the direct way
# again (what it learnt of the member was forgotten with the change).
SHAPES = {
    "rule": ("CREATE RULE also_notify AS ON INSERT TO outbox.events_0 DO ALSO NOTIFY member_insert",
             "DROP RULE also_notify ON outbox.events_0"),
    "check": ("ALTER TABLE outbox.events_0 ADD CONSTRAINT lane_small CHECK (lane < 2000)",
              "ALTER TABLE outbox.events_0 DROP CONSTRAINT lane_small"),
    "row level security": ("ALTER TABLE outbox.events_0 ENABLE ROW LEVEL SECURITY",
                           "ALTER TABLE outbox.events_0 DISABLE ROW LEVEL SECURITY"),
    "expression index": ("CREATE INDEX shape_idx ON outbox.events_0 (lower(topic))", "DROP INDEX outbox.shape_idx"),
    "partial index": ("CREATE INDEX shape_idx ON outbox.events_0 (topic) WHERE key IS NULL",
                      "DROP INDEX outbox.shape_idx"),
    "hash index": ("CREATE INDEX shape_idx ON outbox.events_0 USING hash (topic)", "DROP INDEX outbox.shape_idx"),
    "deferrable unique": ("ALTER TABLE outbox.events_0 ADD CONSTRAINT id_unique UNIQUE (id) DEFERRABLE",
                          "ALTER TABLE outbox.events_0 DROP CONSTRAINT id_unique"),
    "not null": ("ALTER TABLE outbox.events_0 ALTER COLUMN payload SET NOT NULL",
                 "ALTER TABLE outbox.events_0 ALTER COLUMN payload DROP NOT NULL"),
    "default": ("ALTER TABLE outbox.events_0 ALTER COLUMN target_partition SET DEFAULT 7",
                "ALTER TABLE outbox.events_0 ALTER COLUMN target_partition DROP DEFAULT"),
    "another column": ("ALTER TABLE outbox.events_0 ADD COLUMN note text", "ALTER TABLE outbox.events_0 DROP COLUMN note"),
    # Predicates other than exactly the event-id index's `WHERE caller_event_id`.
    "partial index, the column negated": ("CREATE INDEX shape_idx ON outbox.events_0 (topic) WHERE NOT caller_event_id",
                                          "DROP INDEX outbox.shape_idx"),
    "partial index, the column IS TRUE": ("CREATE INDEX shape_idx ON outbox.events_0 (topic) WHERE caller_event_id IS TRUE",
                                          "DROP INDEX outbox.shape_idx"),
    "partial index, the column and more": ("CREATE INDEX shape_idx ON outbox.events_0 (topic) "
                                           "WHERE caller_event_id AND key IS NULL", "DROP INDEX outbox.shape_idx"),
    "caller_event_id default false": ("ALTER TABLE outbox.events_0 ALTER COLUMN caller_event_id SET DEFAULT false",
                                      "ALTER TABLE outbox.events_0 ALTER COLUMN caller_event_id SET DEFAULT true"),
    "caller_event_id nullable": ("ALTER TABLE outbox.events_0 ALTER COLUMN caller_event_id DROP NOT NULL",
                                 "ALTER TABLE outbox.events_0 ALTER COLUMN caller_event_id SET NOT NULL"),
    "stamp with WHEN": ('DROP TRIGGER "~outbox_stamp" ON outbox.events_0; ' + STAMP.format(when="WHEN (true) "),
                        'DROP TRIGGER "~outbox_stamp" ON outbox.events_0; ' + STAMP.format(when="")),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_member_of_another_shape_takes_the_statement(pg, shape):
    change, undo = SHAPES[shape]
    assert pg.value("SELECT member FROM outbox.ring WHERE is_current") == 0
    with psycopg.connect(host=pg.tmp, port=pg.port, user="postgres", dbname="postgres", autocommit=True) as c:
        c.execute("SELECT outbox.enqueue('shapes', 'k', 'x'::text)")  # the member known before the change
        c.execute("SELECT pg_stat_statements_reset()")
        pg.sql(change)
        try:
            event_id = c.execute("SELECT outbox.enqueue('shapes', 'k', 'x'::text)").fetchone()[0]
            # (A rule's rewritten statements count under the INSERT's text too.)
            through_the_statement = member_statements(c)
            assert through_the_statement >= 1, f"with the {shape}, the event did not take the statement"
            if shape == "default":
                assert pg.value("SELECT target_partition FROM outbox.events_0 WHERE event_id = %s", (event_id,)) == 7
            # The statement says the id is enqueue's too (its default is for rows by hand).
            assert pg.value("SELECT caller_event_id FROM outbox.events_0 WHERE event_id = %s", (event_id,)) is False
        finally:
            pg.sql(undo)
        c.execute("SELECT outbox.enqueue('shapes', 'k', 'x'::text)")
        assert member_statements(c) == through_the_statement, "undone: the direct way again"


def test_the_members_indexes_hold_every_row_written_the_direct_way(pg):
    pg.sql("CREATE EXTENSION IF NOT EXISTS amcheck")
    pg.sql("SELECT outbox.enqueue('integrity', 'k' || (g % 50), repeat('x', g % 3000)::text) "
           "FROM generate_series(1, 3000) g")
    for index in pg.sql("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'outbox.events_0'::regclass"):
        pg.sql("SELECT bt_index_check(%s::regclass, true)", (index[0],))
    assert pg.value("SELECT count(*) FROM outbox.events_0 WHERE topic = 'integrity'") == 3000


# Per partial index (predicate `WHERE caller_event_id`) on outbox.events_0, a count only it can
# answer by an index scan, which does not check the predicate again: a row wrongly given an entry
# is counted.
ENTRIES = {
    "events_0_event_id_key": "SELECT count(event_id) FROM outbox.events_0 "
                             "WHERE caller_event_id AND event_id > '00000000-0000-0000-0000-000000000000'",
    "caller_topic_idx": "SELECT count(topic) FROM outbox.events_0 WHERE caller_event_id AND topic > ''",
}


def index_entries(c, index):
    c.execute("SET enable_seqscan = off")
    c.execute("SET enable_bitmapscan = off")
    try:
        plan = "\n".join(r[0] for r in c.execute("EXPLAIN " + ENTRIES[index]).fetchall())
        assert index in plan, plan
        return c.execute(ENTRIES[index]).fetchone()[0]
    finally:
        c.execute("RESET enable_seqscan")
        c.execute("RESET enable_bitmapscan")


def test_the_direct_way_gives_a_generated_id_no_entry_in_a_caller_id_index(pg):
    """The member's event-id index is partial (WHERE caller_event_id, schema 0.4.1): the direct way
    writes a generated id's row with caller_event_id false and inserts no entry for it, as the
    executor, evaluating the predicate, would not; so too for any other index with exactly that
    predicate. A caller's id (the statement) has its entries."""
    pg.sql("CREATE INDEX caller_topic_idx ON outbox.events_0 (topic) WHERE caller_event_id")
    try:
        with psycopg.connect(host=pg.tmp, port=pg.port, user="postgres", dbname="postgres", autocommit=True) as c:
            before = {index: index_entries(c, index) for index in ENTRIES}
            c.execute("SELECT pg_stat_statements_reset()")
            generated = [c.execute("SELECT outbox.enqueue('entries', 'k', 'x'::text)").fetchone()[0] for _ in range(50)]
            assert member_statements(c) == 0, "the member with the second partial index took the statement"
            caller = c.execute("SELECT outbox.enqueue('entries', 'k', 'x'::text, NULL, %s)",
                               (str(uuid.uuid4()),)).fetchone()[0]
            assert member_statements(c) == 1
            assert c.execute("SELECT caller_event_id, count(*) FROM outbox.events_0 WHERE event_id = ANY(%s) "
                             "GROUP BY 1 ORDER BY 1", (generated + [caller],)).fetchall() == [(False, 50), (True, 1)]
            for index, count in before.items():
                assert index_entries(c, index) == count + 1, index
    finally:
        pg.sql("DROP INDEX outbox.caller_topic_idx")
