"""The relay is safe inside the database it lives in: repeated ERRORs, rows not written by
enqueue, look-alike objects of a database owner, unprivileged DROP DATABASE and pg_dump of the
queue. Each test here reproduces a defect of an earlier version (the safety issue) and fails
there. (Hostile roles: test_hostile_roles.py; every step's error path: test_error_paths.py.)"""

import os
import subprocess
import time
import uuid

import psycopg
import pytest

from harness.kafka_reader import read_topic
from harness.record_wait import drop_record_wait, make_record_wait
from harness.wait import wait_until

# 0.3.0's table: rows made unclaimable, locked or broken by hand (0.4.0's members refuse UPDATE
# and DELETE; the ring's own cases are in test_ring_*.py).
pytestmark = pytest.mark.schema("0.3.0")

INVALID_RECORD = 87  # the broker refuses the record batch (mock: produce_errors)


def lane_of(key, event_id):
    """The relay's lane (32-bit FNV-1a of the key's bytes, or of the event id's 16 bytes) % 1024."""
    data = key.encode() if key is not None else uuid.UUID(event_id).bytes
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h % 1024


def enqueue_many(pg, topic, n, key_prefix="k", keys=10, dbname=None):
    with pg.connect(dbname, autocommit=False) as c:
        ids = [c.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)::text",
                         (topic, f"{key_prefix}{i % keys}", f'{{"seq": {i}}}')).fetchone()[0] for i in range(n)]
        c.commit()
    return ids


def count_in_log(pg, text):
    return pg.log().count(text)


def worker_pid(pg, index=0):
    return pg.value("SELECT pid FROM outbox.workers WHERE worker = %s", (index,))


def wait_idle(pg, timeout=60):
    wait_until(lambda: pg.value("SELECT state FROM outbox.workers WHERE worker = 0") == "idle", timeout,
               "worker idle")


def fast_stop_completes(pg):
    """pg_ctl stop -m fast returns (bounded by pg_ctl's own wait) and the server is down."""
    res = subprocess.run(["pg_ctl", "-D", pg.datadir, "-m", "fast", "-w", "-t", "60", "stop"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pg.started = False
    assert res.returncode == 0, res.stdout
    assert not os.path.exists(os.path.join(pg.datadir, "postmaster.pid"))


# --- 1. a second ERROR in the relay ----------------------------------------------------------

def test_repeated_lock_timeouts_inside_a_relay_statement_recover(mock_cluster, make_relay):
    """The record statement waits (in a superuser's trigger) for a lock a session holds: lock
    timeout after lock timeout, ERROR after ERROR. The worker recovers each time (it crashed with
    signal 11 once the error context stack dangled)."""
    pg = make_relay(mock_cluster.bootstrap, lock_timeout="300ms", publish_timeout="2s")
    pg.wait_workers_running(1)
    pid = worker_pid(pg)
    holder = make_record_wait(pg)
    try:
        ids = enqueue_many(pg, "billing", 20)
        wait_until(lambda: count_in_log(pg, "canceling statement due to lock timeout") >= 3, 60,
                   "three lock timeouts in a row")
        assert worker_pid(pg) == pid
    finally:
        drop_record_wait(pg, holder)
    pg.wait_published(20, timeout=90)
    records = read_topic(mock_cluster.bootstrap, "billing", 20, settle=True)
    assert {r.event_id for r in records} == set(ids)  # each ended record sent its batch again
    assert worker_pid(pg) == pid
    assert pg.value("SELECT 1") == 1
    fast_stop_completes(pg)


def test_a_failed_event_after_an_error_inside_a_statement_is_logged_without_a_crash(mock_cluster, make_relay):
    """The 'moved to failed' LOG line after an ERROR raised inside a relay statement (it
    segfaulted a worker: the ERROR left the error context stack pointing into the dead frame of
    the PL/pgSQL function that raised it, and the next report walked it)."""
    pg = make_relay(mock_cluster.bootstrap, max_attempts=1)
    pg.wait_workers_running(1)
    pid = worker_pid(pg)
    enqueue_many(pg, "billing", 1, key_prefix="warm-up")
    pg.wait_published(1)
    # A superuser's trigger raises once, inside the record's UPDATE (a sequence counts calls
    # outside the transaction that the ERROR rolls back).
    pg.sql("""
        CREATE SEQUENCE public.records_seen;
        CREATE FUNCTION public.fail_first_record() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog AS $$
        BEGIN
            IF NEW.status = 'published' AND nextval('public.records_seen') = 1 THEN
                RAISE EXCEPTION 'injected by a trigger, inside the record';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER fail_first_record BEFORE UPDATE ON outbox.events FOR EACH ROW
        EXECUTE FUNCTION public.fail_first_record();
    """)
    enqueue_many(pg, "billing", 1, key_prefix="after-the-error")
    pg.wait_published(2)  # sent again after the ERROR
    mock_cluster.produce_errors(1, INVALID_RECORD)
    with pg.connect() as c:
        poison = c.execute("SELECT outbox.enqueue('billing', 'p', '{}'::jsonb)::text").fetchone()[0]
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status = 'failed'") == 1, 60,
               "poison event failed")
    assert pg.value("SELECT event_id::text FROM outbox.events WHERE status = 'failed'") == poison
    assert count_in_log(pg, "injected by a trigger, inside the record") == 1
    assert worker_pid(pg) == pid


# Backoff after a step's ERROR (issue 15 item 7): outbox.backoff_base 2 s, full jitter in [d/2, d],
# and at least the 1 s pause: the tries after the first failed record come at least 1, 2, 4, 8 s
# apart, so a 12 s window holds at most 3 of them (1 + 2 + 4 <= 12 < 1 + 2 + 4 + 8). Without the
# backoff each came a 1 s pause after the last: about 10 in the window.
RESEND_WINDOW_S = 12
MOST_RESENDS_IN_WINDOW = 3
BATCH_EVENTS = 3


def test_a_record_step_that_keeps_failing_backs_off_and_counts_each_resend(mock_cluster, make_relay, unique_topic):
    """A superuser's BEFORE UPDATE trigger raises in every record: the batch went to Kafka at each
    try, about once a second, duplicates without bound while the trigger stayed. The tries now
    back off like broker trouble, and events_resent counts every acknowledged event sent again."""
    pg = make_relay(mock_cluster.bootstrap, backoff_base="2s", backoff_max="5min")
    pg.wait_workers_running(1)
    pg.sql("""
        CREATE FUNCTION public.refuse_every_record() RETURNS trigger LANGUAGE plpgsql
        SET search_path = pg_catalog AS $$
        BEGIN
            IF NEW.status = 'published' THEN
                RAISE EXCEPTION 'injected by a trigger, in every record';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_every_record BEFORE UPDATE ON outbox.events FOR EACH ROW
        EXECUTE FUNCTION public.refuse_every_record();
    """)
    with pg.connect(autocommit=False) as c:  # one batch
        for i in range(BATCH_EVENTS):
            c.execute("SELECT outbox.enqueue(%s, 'k', %s::text)", (unique_topic, f"event {i}"))
        c.commit()

    def resent():
        return pg.value("SELECT events_resent FROM outbox.worker_metrics WHERE worker = 0")

    wait_until(lambda: resent() >= BATCH_EVENTS, 60, "the first record refused")
    first = resent()
    assert first == BATCH_EVENTS  # every acknowledged event of the batch, once
    # Observe a fixed window (a rate is measured, no condition awaited): tries in it stay within
    # what the backoff allows, and the worker shows it backs off.
    states = set()
    deadline = time.monotonic() + RESEND_WINDOW_S
    while time.monotonic() < deadline:
        states.add(pg.value("SELECT state FROM outbox.workers WHERE worker = 0"))
        time.sleep(0.2)  # a polling interval, not a stand-in for a condition
    tries = (resent() - first) // BATCH_EVENTS
    assert 1 <= tries <= MOST_RESENDS_IN_WINDOW, tries
    assert "backing off" in states
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'") == 0
    assert count_in_log(pg, "3 events reached Kafka but their outcome could not be recorded") >= 1 + tries

    # The cause goes: the next try records the batch. Every copy Kafka got is counted, but the
    # last (recorded) one.
    pg.sql("DROP TRIGGER refuse_every_record ON outbox.events")
    pg.wait_published(BATCH_EVENTS, timeout=120)
    counted = resent()
    records = read_topic(mock_cluster.bootstrap, unique_topic, counted + BATCH_EVENTS, settle=True)
    assert len(records) == counted + BATCH_EVENTS
    assert counted % BATCH_EVENTS == 0 and counted >= BATCH_EVENTS * (1 + tries)


# --- 3 and 7: rows not written by enqueue -------------------------------------------------------

def drop_row_checks(pg):
    """Takes the table's row rules away, as a superuser can: they are one CHECK (events_row_check,
    src/enqueue/row_check.cpp), so a test that needs a row past one rule goes past all of them. Status and
    published_at stay consistent (0.1.0's own checks, back as plain CHECKs)."""
    pg.sql("ALTER TABLE outbox.events DROP CONSTRAINT IF EXISTS events_row_check, "
           "DROP CONSTRAINT IF EXISTS events_status_check, DROP CONSTRAINT IF EXISTS events_published_check, "
           "ADD CONSTRAINT events_status_check CHECK (status IN ('pending', 'in_flight', 'published', 'failed')), "
           "ADD CONSTRAINT events_published_check CHECK ((status = 'published') = (published_at IS NOT NULL))")


def insert_row(pg, topic="billing", key="k", payload=b"{}", headers=None, **columns):
    """A row written by hand, with the lane enqueue would give it."""
    event_id = str(uuid.uuid4())
    cols = ["event_id", "topic", "key", "lane", "payload", "headers"] + list(columns)
    values = ["%s"] * 5 + ["%s::jsonb"] + ["%s"] * len(columns)
    with pg.connect() as c:
        return c.execute(f"INSERT INTO outbox.events ({', '.join(cols)}) VALUES ({', '.join(values)}) "
                         "RETURNING id, event_id::text",
                         [event_id, topic, key, lane_of(key, event_id), payload, headers]
                         + list(columns.values())).fetchone()


@pytest.fixture
def unchecked_relay(mock_cluster, make_relay):
    """A relay whose table has lost the checks that would refuse the rows below: the relay's
    own defences must hold without them (a superuser can drop a constraint)."""
    pg = make_relay(mock_cluster.bootstrap, max_attempts=2)
    pg.wait_workers_running(1)
    drop_row_checks(pg)
    return pg


def test_json_null_header_row_is_quarantined_not_a_crash_loop(unchecked_relay, mock_cluster):
    pg = unchecked_relay
    pid = worker_pid(pg)
    drop_row_checks(pg)
    before = enqueue_many(pg, "billing", 5, key_prefix="before")
    _, bad = insert_row(pg, key="bad", headers='{"trace": null}')
    after = enqueue_many(pg, "billing", 5, key_prefix="after")
    pg.wait_published(10, timeout=60)
    wait_until(lambda: pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (bad,)) == "failed", 30,
               "the bad row quarantined")
    assert "quarantined" in pg.value("SELECT last_error FROM outbox.events WHERE event_id = %s", (bad,))
    records = read_topic(mock_cluster.bootstrap, "billing", 10, settle=True)
    assert {r.event_id for r in records} == set(before + after)
    assert worker_pid(pg) == pid


def test_infinite_next_attempt_at_makes_no_error_loop(unchecked_relay, mock_cluster):
    pg = unchecked_relay
    pid = worker_pid(pg)
    drop_row_checks(pg)
    # Waiting for a retry forever: the idle loop's next-retry wait must stay computable.
    insert_row(pg, key="forever", next_attempt_at="infinity")
    insert_row(pg, key="never", next_attempt_at="-infinity")
    ids = enqueue_many(pg, "billing", 10)
    pg.wait_published(11, timeout=60)  # the -infinity row is simply due
    wait_idle(pg)
    errors_now = count_in_log(pg, "ERROR:")
    # Several idle rounds (each computes the next retry): no new ERROR.
    with pg.connect() as c:
        for _ in range(5):
            c.execute("SELECT outbox.enqueue('billing', 'wake', '{}'::jsonb)")
    pg.wait_published(16, timeout=60)
    wait_idle(pg)
    assert count_in_log(pg, "ERROR:") == errors_now
    assert set(ids) <= {r.event_id for r in read_topic(mock_cluster.bootstrap, "billing", 16)}
    assert worker_pid(pg) == pid
    fast_stop_completes(pg)


def test_headers_that_are_not_an_object_are_quarantined_not_a_claim_error_loop(unchecked_relay, mock_cluster):
    pg = unchecked_relay
    pid = worker_pid(pg)
    drop_row_checks(pg)
    _, array_headers = insert_row(pg, key="bad", headers='["a"]')
    _, scalar_headers = insert_row(pg, key="bad2", headers='"a"')
    good = enqueue_many(pg, "billing", 5)
    pg.wait_published(5, timeout=60)
    for bad in (array_headers, scalar_headers):
        wait_until(lambda: pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (bad,)) == "failed", 30,
                   "the bad row quarantined")
        assert "not a JSON object" in pg.value("SELECT last_error FROM outbox.events WHERE event_id = %s", (bad,))
    assert count_in_log(pg, "cannot call jsonb_each_text") == 0
    assert set(good) <= {r.event_id for r in read_topic(mock_cluster.bootstrap, "billing", 5)}
    assert worker_pid(pg) == pid


def test_huge_attempts_count_fails_the_event_instead_of_looping(unchecked_relay, mock_cluster):
    """attempts >= 1024 overflowed the backoff (power(2, attempts)) in the record statement:
    the batch was resent every second forever."""
    pg = unchecked_relay
    pid = worker_pid(pg)
    enqueue_many(pg, "billing", 1, key_prefix="warm-up")
    pg.wait_published(1)
    mock_cluster.produce_errors(1, INVALID_RECORD)
    drop_row_checks(pg)  # and past the table's bound: no integer overflow either
    _, bad = insert_row(pg, key="p", attempts=2147483647)
    wait_until(lambda: pg.value("SELECT status FROM outbox.events WHERE event_id = %s", (bad,)) == "failed", 60,
               "the event failed")
    assert pg.value("SELECT attempts FROM outbox.events WHERE event_id = %s", (bad,)) == 1000000
    assert count_in_log(pg, "out of range") == 0
    assert worker_pid(pg) == pid


def test_wrong_lane_is_refused_by_the_table(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, workers=2)
    with pytest.raises(psycopg.errors.CheckViolation):
        pg.sql("INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
               "VALUES (gen_random_uuid(), 'billing', 'k', %s, '\\x00')", ((lane_of("k", None) + 1) % 1024,))
    assert pg.value("SELECT count(*) FROM outbox.events") == 0


def test_row_left_in_flight_by_hand_is_requeued_and_published(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    wait_idle(pg)
    _, orphan = insert_row(pg, key="orphan", status="in_flight")
    ids = enqueue_many(pg, "billing", 3, key_prefix="orphan", keys=1)
    pg.wait_published(4, timeout=60)
    records = read_topic(mock_cluster.bootstrap, "billing", 4)
    assert [r.event_id for r in records if r.key == b"orphan0"] == ids
    assert orphan in {r.event_id for r in records}


# --- 2. look-alike objects of a database owner -----------------------------------------------------

LOOKALIKE = """
CREATE SCHEMA outbox;
CREATE TABLE outbox.events (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id uuid NOT NULL UNIQUE, topic text NOT NULL,
	key text, lane smallint NOT NULL, payload bytea, headers jsonb, status text NOT NULL DEFAULT 'pending',
	attempts integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(), last_error text,
	created_at timestamptz NOT NULL DEFAULT now(), claimed_at timestamptz, published_at timestamptz,
	kafka_partition integer, kafka_offset bigint);
CREATE FUNCTION outbox.escalate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE mallory SUPERUSER;
	RETURN NEW;
END $$;
CREATE TRIGGER escalate BEFORE UPDATE OR DELETE ON outbox.events FOR EACH ROW EXECUTE FUNCTION outbox.escalate();
CREATE FUNCTION outbox.purge(interval, integer) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE mallory SUPERUSER;
	RETURN 0;
END $$;
INSERT INTO outbox.events (event_id, topic, key, lane) SELECT gen_random_uuid(), 'billing', 'k' || i, i % 1024
FROM generate_series(0, 1023) i;
"""


def mallory_owns(pg, dbname):
    pg.sql("CREATE ROLE mallory LOGIN", dbname="postgres")
    pg.sql(f'ALTER DATABASE "{dbname}" OWNER TO mallory', dbname="postgres")
    pg.sql(f'GRANT CREATE ON DATABASE "{dbname}" TO mallory', dbname="postgres")


def as_mallory(pg, dbname, sql):
    with psycopg.connect(host=pg.tmp, port=pg.port, user="mallory", dbname=dbname, autocommit=True) as c:
        c.execute(sql)


def is_superuser(pg, role):
    return pg.value("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,), dbname="postgres")


def relay_steps_after(pg, since, steps=2, timeout=60):
    """Waits until the relay worker has begun `steps` more steps after `since` (its activity's
    state_change moves on every step), so that it has certainly looked at the table since."""
    seen = []

    def moved():
        t = pg.value("SELECT max(state_change) FROM pg_stat_activity WHERE backend_type = 'outbox relay'",
                     dbname="postgres")
        if t is not None and t > since and (not seen or t > seen[-1]):
            seen.append(t)
        return len(seen) >= steps
    wait_until(moved, timeout, f"{steps} relay steps")


@pytest.mark.parametrize("when", ["before CREATE EXTENSION", "after DROP EXTENSION"])
def test_database_owner_lookalike_table_is_never_touched(mock_cluster, make_relay, when):
    """A non-superuser owning the relay's database creates outbox.events with a trigger (and an
    outbox.purge) that would make it superuser if the relay, a superuser session, touched them."""
    before = when == "before CREATE EXTENSION"
    # outbox.database set (deprecated): the worker stays in the database without the extension,
    # which is where it could be lured (without it, a worker leaves such a database at once).
    pg = make_relay(mock_cluster.bootstrap, database="shop", create_extension=not before, retention="1s",
                    poll_interval="200ms", single_database=True)
    if before:
        pg.sql('CREATE DATABASE "shop"', dbname="postgres")
        pg.restart()
    wait_until(lambda: pg.value("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay'",
                                dbname="postgres") == 1, 60, "the relay worker running")
    if not before:
        pg.sql("DROP EXTENSION outbox", dbname="shop")
    mallory_owns(pg, "shop")
    as_mallory(pg, "shop", LOOKALIKE)
    created = pg.value("SELECT now()", dbname="postgres")
    relay_steps_after(pg, created)
    assert not is_superuser(pg, "mallory")
    with psycopg.connect(host=pg.tmp, port=pg.port, user="mallory", dbname="shop", autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM outbox.events WHERE status <> 'pending'").fetchone()[0] == 0


def test_relay_statements_run_as_the_relay_role_not_a_superuser(mock_cluster, make_relay):
    """Even code that the relay cannot avoid (a trigger a superuser put on the table) runs as
    outbox_relay, which cannot change roles."""
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    pg.sql("""
        CREATE TABLE public.who_ran (usr text, is_super boolean, sec_restricted boolean);
        GRANT INSERT ON public.who_ran TO outbox_relay;
        CREATE FUNCTION public.record_who() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE restricted boolean := false;
        BEGIN
            BEGIN
                SET LOCAL ROLE NONE;
            EXCEPTION WHEN insufficient_privilege THEN restricted := true;
            END;
            INSERT INTO public.who_ran VALUES (current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), restricted);
            RETURN NEW;
        END $$;
        CREATE TRIGGER record_who BEFORE UPDATE ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.record_who();
    """)
    enqueue_many(pg, "billing", 3)
    pg.wait_published(3)
    rows = set(pg.sql("SELECT usr, is_super, sec_restricted FROM public.who_ran"))
    assert rows == {("outbox_relay", False, True)}


def test_relay_role_that_is_a_superuser_or_lacks_rights_is_refused(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    pg.sql("CREATE ROLE relay_super SUPERUSER; CREATE ROLE relay_login LOGIN; CREATE ROLE relay_bare")
    # Every right but EXECUTE on the table's row check, which each of its UPDATEs runs.
    pg.sql("CREATE ROLE relay_no_row_check; GRANT USAGE ON SCHEMA outbox TO relay_no_row_check; "
           "GRANT SELECT, UPDATE, DELETE ON outbox.events TO relay_no_row_check; "
           "GRANT EXECUTE ON FUNCTION outbox.lane_of(text, uuid) TO relay_no_row_check")
    for role, reason in (("relay_super", "has SUPERUSER"), ("relay_login", "has LOGIN"), ("relay_bare", "lacks"),
                         ("relay_no_row_check", '"relay_no_row_check" lacks'), ("no_such_role", "does not exist")):
        pg.set(relay_role=role)
        wait_until(lambda: reason in (pg.workers()[0][5] or ""), 30, f"{role} refused")
        assert pg.workers()[0][2] == "misconfigured"
    enqueue_many(pg, "billing", 2)
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status = 'pending'") == 2
    # The default role, but another role is a member of it (and so could act as it).
    pg.sql("CREATE ROLE sneaky; GRANT outbox_relay TO sneaky")
    pg.set(relay_role="outbox_relay")
    wait_until(lambda: "has members" in (pg.workers()[0][5] or ""), 30, "a role with members refused")
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status = 'pending'") == 2
    pg.sql("REVOKE outbox_relay FROM sneaky")
    pg.wait_published(2)


# --- 5. unprivileged DROP DATABASE --------------------------------------------------------------

def test_unprivileged_drop_database_does_not_stop_the_relay(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, database="shop")
    pg.wait_workers_running(1)
    pid = worker_pid(pg)
    pg.sql("CREATE ROLE eve LOGIN; CREATE ROLE shop_owner LOGIN", dbname="postgres")
    pg.sql('ALTER DATABASE "shop" OWNER TO shop_owner', dbname="postgres")

    def attempt(user, sql):
        with psycopg.connect(host=pg.tmp, port=pg.port, user=user, dbname="postgres", autocommit=True) as c:
            with pytest.raises(psycopg.Error):
                c.execute(sql)
        # The hook acts synchronously (it waits for the workers to exit before the drop runs):
        # had it acted, the worker would be gone by now.
        os.kill(pid, 0)
        assert worker_pid(pg) == pid

    attempt("eve", 'DROP DATABASE "shop"')  # must be owner
    attempt("eve", 'BEGIN; DROP DATABASE "shop"')  # inside a transaction block
    attempt("shop_owner", 'BEGIN; DROP DATABASE "shop"')  # the owner, but in a transaction block
    attempt("shop_owner", 'DO $$ BEGIN EXECUTE \'DROP DATABASE "shop"\'; END $$')  # from a function
    attempt("eve", 'DROP DATABASE "shop" WITH (FORCE)')
    assert count_in_log(pg, "stopping the relay workers for DROP DATABASE") == 0
    enqueue_many(pg, "billing", 3, dbname="shop")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'", dbname="shop") == 3,
               30, "published")


# --- 4. pg_dump keeps the queue -----------------------------------------------------------------

def test_dump_and_restore_keep_pending_and_failed_events(mock_cluster, make_relay, tmp_path):
    pg = make_relay(mock_cluster.bootstrap, database="shop")
    pg.wait_workers_running(1)
    for b in (1, 2, 3):
        mock_cluster.down(b)  # nothing gets published before the dump
    pending = enqueue_many(pg, "billing", 8, dbname="shop")
    with pg.connect("shop") as c:
        failed = [c.execute("SELECT outbox.enqueue('billing', 'f', %s::jsonb)::text", (f'{{"f": {i}}}',)).fetchone()[0]
                  for i in range(2)]
        c.execute("UPDATE outbox.events SET status = 'failed', attempts = 10, last_error = 'boom' "
                  "WHERE event_id = ANY(%s::uuid[])", (failed,))
    max_id = pg.value("SELECT max(id) FROM outbox.events", dbname="shop")
    dump = tmp_path / "shop.dump"
    subprocess.run(["pg_dump", "-h", pg.tmp, "-p", str(pg.port), "-U", "postgres", "-Fc", "-f", str(dump), "shop"],
                   check=True)
    table_only = subprocess.run(["pg_dump", "-h", pg.tmp, "-p", str(pg.port), "-U", "postgres", "-a",
                                 "-t", "outbox.events", "shop"], check=True, stdout=subprocess.PIPE, text=True).stdout
    assert all(e in table_only for e in pending + failed)

    # Restore into a new database and point the relay at it.
    # pg_dump writes CREATE EXTENSION without a version, and a restore would make the installed
    # default: the extension is created at the dumped version first (docs/upgrading.md).
    pg.sql('CREATE DATABASE "restored"', dbname="postgres")
    version = pg.value("SELECT extversion FROM pg_extension WHERE extname = 'outbox'", dbname="shop")
    pg.sql(f"CREATE EXTENSION outbox VERSION '{version}'", dbname="restored")
    subprocess.run(["pg_restore", "-h", pg.tmp, "-p", str(pg.port), "-U", "postgres", "-d", "restored", str(dump)],
                   check=True)
    pg.sql("ALTER SYSTEM SET outbox.database = 'restored'", dbname="postgres")
    for b in (1, 2, 3):
        mock_cluster.up(b)
    pg.restart()
    rows = dict(pg.sql("SELECT event_id::text, status FROM outbox.events", dbname="restored"))
    assert set(rows) == set(pending + failed)
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'",
                                dbname="restored") == 8, 60, "restored pending events published")
    assert {e for e, s in pg.sql("SELECT event_id::text, status FROM outbox.events WHERE status = 'failed'",
                                 dbname="restored")} == set(failed)
    # The sequence continues after the restored ids.
    with pg.connect("restored") as c:
        c.execute("SELECT outbox.enqueue('billing', 'new', '{}'::jsonb)")
        assert c.execute("SELECT max(id) FROM outbox.events").fetchone()[0] > max_id
    records = read_topic(mock_cluster.bootstrap, "billing", 9)
    assert set(pending) <= {r.event_id for r in records}


# --- found by attacking the relay -------------------------------------------------------------

def test_batch_byte_budget_counts_keys_and_headers(mock_cluster, make_relay):
    """An enqueue-only role filling headers (not payloads) must not push a claim past
    outbox.batch_max_bytes: the worker's memory is bounded by the whole event."""
    pg = make_relay(mock_cluster.bootstrap, batch_max_bytes="1MB", max_payload_bytes="1MB")
    pg.wait_workers_running(1)
    with pg.connect(autocommit=False) as c:
        c.execute("SELECT count(outbox.enqueue('billing', 'k' || g, NULL::bytea, "
                  "jsonb_build_object('h', repeat('x', 300000)))) FROM generate_series(1, 12) g")
        c.commit()
    pg.wait_published(12, timeout=90)
    # A claim takes events while fewer than 1 MB came before them: at most four 300 kB events,
    # so at least three batches, each recorded in a transaction of its own (counting payloads
    # only, all twelve went in one).
    assert pg.value("SELECT count(DISTINCT xmin::text) FROM outbox.events") >= 3


def test_pause_after_an_error_is_not_cut_short_by_commits(mock_cluster, make_relay):
    """Every committed enqueue sets the worker's latch; the pause after an ERROR must last anyway,
    or a repeating ERROR loops at the rate of commits. (Only a lower bound on time: a slow
    machine makes the gaps longer, never shorter.)"""
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    pg.set(test_fail_step="claim:3")
    with pg.connect() as c:
        for i in range(200):
            c.execute("SELECT outbox.enqueue('billing', %s, '{}'::jsonb)", (f"k{i}",))
    pg.wait_published(200, timeout=60)
    stamps = [line.split(" [")[0] for line in pg.log().splitlines()
              if "injected failure of step claim" in line and "ERROR" in line]
    assert len(stamps) == 3, stamps
    from datetime import datetime
    times = [datetime.strptime(t[:23], "%Y-%m-%d %H:%M:%S.%f") for t in stamps]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    assert all(g >= 0.9 for g in gaps), gaps


def test_fifo_as_properties_file_does_not_wedge_the_worker(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    fifo = os.path.join(pg.tmp, "secrets.fifo")
    os.mkfifo(fifo, 0o600)
    pg.set(kafka_properties_file=fifo)
    wait_until(lambda: "regular file" in (pg.workers()[0][5] or ""), 30, "a FIFO refused")
    assert pg.workers()[0][2] == "misconfigured"
    fast_stop_completes(pg)


def test_terminate_ends_a_relay_statement_waiting_on_a_lock(mock_cluster, make_relay):
    """SIGTERM only sets a flag; a relay statement waiting for a lock a session holds (here for up
    to a minute, in a superuser's trigger on the record) is cancelled after a short grace, so the
    worker exits."""
    pg = make_relay(mock_cluster.bootstrap, lock_timeout="60s", publish_timeout="2s")
    pg.wait_workers_running(1)
    pid = worker_pid(pg)
    holder = make_record_wait(pg)
    try:
        enqueue_many(pg, "billing", 5)
        wait_until(lambda: pg.value("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)) == "Lock",
                   30, "the record step waiting for the lock")
        pg.sql("SELECT pg_terminate_backend(%s)", (pid,))

        def gone():
            try:
                os.kill(pid, 0)
                return False
            except ProcessLookupError:
                return True
        wait_until(gone, 10, "the worker exited")
    finally:
        drop_record_wait(pg, holder)
    pg.wait_published(5, timeout=90)  # the restarted worker sends them again


def test_database_settings_do_not_reach_the_relays_statements(mock_cluster, make_relay):
    """A database owner's ALTER DATABASE ... SET of settings that only change plans (or anything
    else) would apply to the relay's session at connect; the relay runs with the built-in values."""
    pg = make_relay(mock_cluster.bootstrap, database="shop")
    pg.wait_workers_running(1)
    pg.sql("CREATE ROLE shop_owner LOGIN", dbname="postgres")
    pg.sql('ALTER DATABASE "shop" OWNER TO shop_owner', dbname="postgres")
    with psycopg.connect(host=pg.tmp, port=pg.port, user="shop_owner", dbname="postgres", autocommit=True) as c:
        for setting in ("enable_indexscan = off", "enable_hashjoin = off", "work_mem = '64kB'",
                        "random_page_cost = 1000", "default_transaction_isolation = 'serializable'"):
            c.execute(f'ALTER DATABASE "shop" SET {setting}')
    pg.restart()
    pg.wait_workers_running(1)
    pg.sql("""
        CREATE TABLE public.seen (work_mem text, enable_indexscan text, random_page_cost text, isolation text);
        GRANT INSERT ON public.seen TO outbox_relay;
        CREATE FUNCTION public.record_settings() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.seen VALUES (current_setting('work_mem'), current_setting('enable_indexscan'),
                                            current_setting('random_page_cost'), current_setting('transaction_isolation'));
            RETURN NEW;
        END $$;
        CREATE TRIGGER record_settings BEFORE UPDATE ON outbox.events FOR EACH ROW
        EXECUTE FUNCTION public.record_settings();
    """, dbname="shop")
    enqueue_many(pg, "billing", 2, dbname="shop")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'", dbname="shop") == 2,
               30, "published")
    assert set(pg.sql("SELECT * FROM public.seen", dbname="shop")) == {("4MB", "on", "4", "read committed")}


def test_drop_database_with_another_session_open_does_not_stop_the_relay(mock_cluster, make_relay):
    """DROP DATABASE fails while another session is connected; its owner looping it must not
    restart the relay every time."""
    pg = make_relay(mock_cluster.bootstrap, database="shop")
    pg.wait_workers_running(1)
    pid = worker_pid(pg)
    with pg.connect("shop") as session_in_shop:
        session_in_shop.execute("SELECT 1")
        for _ in range(2):
            with pytest.raises(psycopg.errors.ObjectInUse):
                pg.sql('DROP DATABASE "shop"', dbname="postgres")
            os.kill(pid, 0)
            assert worker_pid(pg) == pid
    assert count_in_log(pg, "stopping the relay workers for DROP DATABASE") == 0
