"""Hostile roles against the relay: a non-superuser owner of the relay's database, an
application role with exactly docs/privileges.md's grants (EXECUTE on enqueue and event_id), and a role
with nothing but CONNECT. Each tries to make the relay run its code, stop it, read payloads or
secrets, or publish where it should not; each fails. Where practical a test also shows that the
attack works where the defence is missing (a plain superuser session, a role that may signal),
so that a lost defence makes it fail. (Look-alike tables, the relay role's own checks, DROP
DATABASE and dump/restore: test_safety.py.)"""

import os
import re
import uuid

import psycopg
import pytest

from harness.grants import PUBLIC_GRANTS_SQL
from harness.kafka_reader import read_topic
from harness.wait import wait_until

SECRET = "s3cretHunter2"
ALLOWED = "billing,orders.*"

# Settings a database owner may attach to its database (ALTER DATABASE ... SET) that would
# wedge or subvert a session that took them: the relay pins each (docs/privileges.md).
# Values as SQL (search_path unquoted: a quoted list would be one schema name).
HOSTILE_DATABASE_SETTINGS = {
    "statement_timeout": "'1ms'",
    "lock_timeout": "'1ms'",
    "idle_in_transaction_session_timeout": "'1ms'",
    "default_transaction_read_only": "on",
    "default_transaction_isolation": "'serializable'",
    "transform_null_equals": "on",
    "search_path": "evil, public",
    "jit": "on",
    "plan_cache_mode": "force_generic_plan",
    "synchronous_commit": "off",
}

# Our own superuser sessions in a database carrying those settings override them per connection.
NEUTRAL = ("-c statement_timeout=0 -c lock_timeout=0 -c idle_in_transaction_session_timeout=0 "
           "-c default_transaction_read_only=off -c default_transaction_isolation=read\\ committed "
           "-c search_path=pg_catalog -c role=none")

# Code planted by the database owner under names the relay's SQL uses (pg_catalog names, and
# better-matching overloads of them). Anything that runs it leaves a row in planted_ran and
# tries to make mallory a superuser; it returns what the real function would, so a relay that
# ran it would carry on and the trace is the only sign.
PLANTED = r"""
CREATE SCHEMA evil;
CREATE TABLE public.planted_ran (who text, what text, was_super boolean);
GRANT SELECT, INSERT ON public.planted_ran TO PUBLIC;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
CREATE FUNCTION public.planted(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.planted_ran
	SELECT current_user, what, r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;
	BEGIN
		ALTER ROLE mallory SUPERUSER;
	EXCEPTION WHEN OTHERS THEN NULL;
	END;
END $$;
"""

# (signature, return type, body returning the real value) planted in both evil and public.
SHADOW_FUNCTIONS = [
    ("now()", "timestamptz", "RETURN pg_catalog.now();"),
    ("random()", "float8", "RETURN pg_catalog.random();"),
    ("octet_length(bytea)", "integer", "RETURN pg_catalog.octet_length($1);"),
    ("power(float8, float8)", "float8", "RETURN pg_catalog.power($1, $2);"),
    ("make_interval(secs float8)", "interval", "RETURN pg_catalog.make_interval(secs => secs);"),
    ("jsonb_each_text(jsonb, OUT key text, OUT value text)", "SETOF record",
     "RETURN QUERY SELECT * FROM pg_catalog.jsonb_each_text($1);"),
    ("minus_numeric_int8(numeric, bigint)", "numeric", "RETURN $1 OPERATOR(pg_catalog.-) $2::numeric;"),
    ("less_numeric_int8(numeric, bigint)", "boolean", "RETURN $1 OPERATOR(pg_catalog.<) $2::numeric;"),
    ("texteq(text, text)", "boolean", "RETURN $1 OPERATOR(pg_catalog.=) $2;"),
    ("first_value_step(text, text)", "text", "RETURN coalesce($1, $2);"),
]
SHADOW_OPERATORS = [("-", "numeric", "bigint", "minus_numeric_int8"),
                    ("<", "numeric", "bigint", "less_numeric_int8"),
                    ("=", "text", "text", "texteq")]


def planted_sql():
    sql = [PLANTED]
    for schema in ("evil", "public"):
        for signature, returns, body in SHADOW_FUNCTIONS:
            name = signature.split("(")[0]
            sql.append(f"CREATE FUNCTION {schema}.{signature} RETURNS {returns} LANGUAGE plpgsql AS $$ "
                       f"BEGIN PERFORM public.planted('{schema}.{name}'); {body} END $$;")
        for op, left, right, function in SHADOW_OPERATORS:
            sql.append(f"CREATE OPERATOR {schema}.{op} (LEFTARG = {left}, RIGHTARG = {right}, "
                       f"FUNCTION = {schema}.{function});")
        # first_value(anyelement) is polymorphic: an aggregate on text is a better match.
        sql.append(f"CREATE AGGREGATE {schema}.first_value(text) (SFUNC = {schema}.first_value_step, STYPE = text);")
    return "\n".join(sql)


# -- connections and helpers ---------------------------------------------------------------

def connect(pg, user="postgres", dbname=None, options=None, autocommit=True):
    return psycopg.connect(host=pg.tmp, port=pg.port, user=user, dbname=dbname or pg.database,
                           autocommit=autocommit, options=options or "")


def query(pg, sql, params=None, user="postgres", dbname=None, options=NEUTRAL):
    with connect(pg, user, dbname, options) as c:
        cur = c.execute(sql, params)
        return cur.fetchall() if cur.description else None


def value(pg, sql, params=None, **kw):
    rows = query(pg, sql, params, **kw)
    return rows[0][0] if rows else None


def refused(pg, user, sql, params=None, dbname=None, sqlstates=("42501",)):
    """Runs `sql` as `user` and returns the error, which must have one of `sqlstates`."""
    with connect(pg, user, dbname, NEUTRAL) as c:
        with pytest.raises(psycopg.Error) as err:
            c.execute(sql, params)
    assert err.value.sqlstate in sqlstates, f"{sql}: {err.value.sqlstate} {err.value}"
    return err.value


def worker_pid(pg):
    return value(pg, "SELECT pid FROM outbox.workers WHERE worker = 0")


def wait_worker(pg, timeout=60):
    return wait_until(lambda: worker_pid(pg), timeout, "relay worker running")


def enqueue(pg, topic, key, payload, user="postgres", headers=None, event_id=None, kind="jsonb"):
    return value(pg, f"SELECT outbox.enqueue(%s, %s, %s::{kind}, %s::jsonb, %s::uuid)::text",
                 (topic, key, payload, headers, event_id), user=user)


def wait_status(pg, event_ids, status="published", timeout=60):
    wait_until(lambda: value(pg, "SELECT count(*) FROM outbox.events WHERE event_id = ANY(%s::uuid[]) "
                                 "AND status = %s", (list(event_ids), status)) == len(event_ids),
               timeout, f"{len(event_ids)} events {status}")


def is_superuser(pg, role):
    return value(pg, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,))


def create_login(pg, role, attributes=""):
    query(pg, f"CREATE ROLE {role} LOGIN {attributes}", dbname="postgres")


def grant_readme_app_rights(pg, role):
    """docs/privileges.md, the application role, verbatim."""
    query(pg, f"""
        GRANT USAGE ON SCHEMA outbox TO {role};
        GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, jsonb, uuid, integer, text, text, boolean, text, text),
                                  outbox.enqueue(text, text, text, jsonb, uuid, integer, text, text, boolean, text, text),
                                  outbox.enqueue(text, text, bytea, jsonb, uuid, integer, text, text, boolean, text, text),
                                  outbox.event_id(text, text),
                                  outbox.event_id(uuid, text)
              TO {role}""")


def assert_cannot_signal_the_worker(pg, role, pid, dbname=None):
    for fn in ("pg_cancel_backend", "pg_terminate_backend"):
        refused(pg, role, f"SELECT {fn}(%s)", (pid,), dbname=dbname)
    assert worker_pid(pg) == pid


def relay_sql(name):
    """A statement of the relay verbatim from src/relay/relay_sql.cpp (for the control experiments)."""
    path = os.path.join(os.path.dirname(__file__), "..", "src", "relay", "relay_sql.cpp")
    with open(path) as f:
        source = f.read()
    return re.search(r'const char \*const ' + name + r' = R"SQL\((.*?)\)SQL"', source, re.S).group(1)


RELOAD_MESSAGE = 'parameter "outbox.kafka_properties" changed to'


def relay_log(pg):
    """The server log without PostgreSQL's own reload message for the setting (its own test)."""
    return "".join(line for line in pg.log().splitlines(True) if RELOAD_MESSAGE not in line)


def assert_not_in_any(secret, rows):
    for row in rows:
        assert not any(secret in str(v) for v in row), row


# -- 1. a non-superuser database owner -------------------------------------------------------

@pytest.fixture
def owned_relay(mock_cluster, make_relay):
    """The relay on database shop, owned by the non-superuser mallory (who has CREATE there)."""
    pg = make_relay(mock_cluster.bootstrap, database="shop", poll_interval="200ms",
                    kafka_properties=f"sasl.password={SECRET}")
    wait_worker(pg)
    create_login(pg, "mallory")
    query(pg, 'ALTER DATABASE "shop" OWNER TO mallory', dbname="postgres")
    assert value(pg, "SELECT has_database_privilege('mallory', 'shop', 'CREATE')")
    return pg


def test_database_owner_settings_and_planted_code_change_nothing(owned_relay, mock_cluster):
    pg = owned_relay
    with connect(pg, "mallory") as c:
        c.execute(planted_sql())
        for name, setting in HOSTILE_DATABASE_SETTINGS.items():
            c.execute(f"ALTER DATABASE shop SET {name} = {setting}")
    # Settings only a superuser or the server's configuration may set are refused.
    for name, setting in (("session_replication_role", "replica"), ("outbox.allowed_topics", "x"),
                          ("outbox.relay_role", "mallory"), ("outbox.kafka_properties", "debug=all"),
                          ("outbox.max_payload_bytes", "1"), ("outbox.kafka_connections", "16")):
        refused(pg, "mallory", f"ALTER DATABASE shop SET {name} = '{setting}'", sqlstates=("42501", "55P02"))
    # Nor in a session (each of a worker's connections is its threads and a producer id on the broker).
    refused(pg, "mallory", "SET outbox.kafka_connections = 16", sqlstates=("55P02",))
    refused(pg, "mallory", "ALTER ROLE mallory SET outbox.kafka_connections = 16", sqlstates=("42501", "55P02"))
    # A cast between built-in types would be global: only their owner may create one.
    refused(pg, "mallory", "CREATE FUNCTION evil.to_int(smallint) RETURNS integer LANGUAGE sql "
                           "AS 'SELECT 0'; CREATE CAST (smallint AS integer) WITH FUNCTION evil.to_int(smallint)")

    # The worker takes database settings when it connects.
    pg.restart()
    pid = wait_worker(pg)
    # They bite an ordinary session of this database.
    with connect(pg) as plain:
        with pytest.raises(psycopg.errors.QueryCanceled):
            plain.execute("SELECT pg_sleep(0.2)")
        plain.execute("SET statement_timeout = 0")
        assert plain.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
        assert plain.execute("SHOW search_path").fetchone()[0] == "evil, public"

    ids = [enqueue(pg, "billing", f"k{i % 3}", f'{{"seq": {i}}}', headers='{"h": "v"}') for i in range(12)]
    wait_status(pg, ids)
    assert {r.event_id for r in read_topic(mock_cluster.bootstrap, "billing", 12)} == set(ids)
    assert worker_pid(pg) == pid
    assert query(pg, "SELECT * FROM public.planted_ran") == []
    assert not is_superuser(pg, "mallory")

    # Control: in a superuser session with the database's search_path, a statement in the shape
    # of 0.1.0's claim (a running sum of sizes minus a bigint: numeric - bigint, which the planted
    # operator matches better than pg_catalog's) runs the planted code as that superuser. The
    # relay's own candidates statement, run the same way, finds its rows and runs none of it:
    # every operator it uses matches pg_catalog exactly. (Rolled back.)
    options = NEUTRAL.replace("-c search_path=pg_catalog ", "")
    with connect(pg, options=options, autocommit=False) as c:
        assert c.execute("SHOW search_path").fetchone()[0] == "evil, public"
        for i in range(3):
            c.execute("SELECT outbox.enqueue('billing', 'control', %s::jsonb)", (f'{{"c": {i}}}',))
        if c.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox'").fetchone()[0] == "0.3.0":
            # (0.4.0's claim is built from macros in ring_claim.cpp: its run above is the proof.)
            c.execute("PREPARE claim(integer, integer, integer, boolean, text[], text[]) AS "
                      + relay_sql("kCandidatesSql"))
            assert len(c.execute("EXECUTE claim(1, 0, 100, true, NULL, NULL)").fetchall()) == 3
            assert c.execute("SELECT count(*) FROM public.planted_ran").fetchone()[0] == 0
        c.execute("SELECT sum(octet_length(payload)::bigint) OVER (ORDER BY id) - id FROM outbox.events "
                  "WHERE status = 'pending'").fetchall()
        ran = {what for who, what, was_super in c.execute("SELECT * FROM public.planted_ran").fetchall()
               if who == "postgres" and was_super}
        print("planted code run by the control:", sorted(ran))
        assert ran, "the control ran no planted code: the test no longer proves anything"
        assert c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'").fetchone()[0]
        c.rollback()
    assert not is_superuser(pg, "mallory")


def test_database_owner_cannot_change_the_extensions_objects(owned_relay):
    pg = owned_relay
    with connect(pg, "mallory") as c:
        c.execute("CREATE TABLE public.events (id bigint)")
        c.execute("CREATE FUNCTION public.f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$")
    attempts = [
        "CREATE TABLE outbox.mine (id int)",
        "CREATE FUNCTION outbox.lane_of(text) RETURNS smallint LANGUAGE sql AS 'SELECT 0::smallint'",
        "ALTER TABLE public.events SET SCHEMA outbox",
        "ALTER TABLE outbox.events ADD COLUMN x int",
        "ALTER TABLE outbox.events DROP CONSTRAINT events_row_check",
        "ALTER TABLE outbox.events ENABLE ROW LEVEL SECURITY",
        "ALTER TABLE outbox.events OWNER TO mallory",
        "CREATE TRIGGER t BEFORE UPDATE ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.f()",
        "CREATE RULE r AS ON UPDATE TO outbox.events DO INSTEAD NOTHING",
        "CREATE INDEX ON outbox.events (topic)",
        "TRUNCATE outbox.events",
        "DROP TABLE outbox.events",
        "DROP SCHEMA outbox CASCADE",
        "ALTER SCHEMA outbox RENAME TO old_outbox",
        "DROP EXTENSION outbox",
        "ALTER EXTENSION outbox ADD TABLE public.events",
        "ALTER EXTENSION outbox UPDATE",
        "GRANT SELECT ON outbox.events TO mallory",
        "ALTER SYSTEM SET outbox.allowed_topics = ''",
        "ALTER ROLE outbox_relay SET search_path = public",
        "GRANT outbox_relay TO mallory",
        "SET ROLE outbox_relay",
    ]
    # 0.4.0's ring: its members' guard and stamp triggers, its cursors.
    attempts += ["ALTER TABLE outbox.events_0 DISABLE TRIGGER ALL", "TRUNCATE outbox.events_0",
                 "CREATE TRIGGER t BEFORE INSERT ON outbox.events_0 FOR EACH ROW EXECUTE FUNCTION public.f()",
                 "DELETE FROM outbox.cursors", "UPDATE outbox.ring SET is_current = false"]
    triggers = "SELECT count(*) FROM pg_trigger WHERE tgrelid::regclass::text LIKE 'outbox.%' AND tgenabled <> 'D'"
    before = value(pg, triggers)
    for sql in attempts:
        refused(pg, "mallory", sql)
    # The owner of the database cannot rename it (nor hide it) while the relay is connected.
    refused(pg, "mallory", 'ALTER DATABASE shop RENAME TO shop2', dbname="postgres", sqlstates=("42501", "55006"))
    assert value(pg, triggers) == before
    assert value(pg, "SELECT relowner::regrole::text FROM pg_class WHERE oid = 'outbox.events'::regclass") == "postgres"
    eid = enqueue(pg, "billing", "k", '{"after": true}')
    wait_status(pg, [eid])


def test_database_owner_cannot_signal_the_relay_or_read_its_secret(owned_relay, mock_cluster):
    pg = owned_relay
    pid = worker_pid(pg)
    # Even with pg_signal_backend, which lets it signal any other non-superuser's backend.
    query(pg, "GRANT pg_signal_backend TO mallory; CREATE ROLE victim LOGIN")
    assert_cannot_signal_the_worker(pg, "mallory", pid)
    with connect(pg, "victim") as victim:
        victim_pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert value(pg, "SELECT pg_cancel_backend(%s)", (victim_pid,), user="mallory", options="") is True

    # The secret: not readable, not listed, not in any view or error text mallory can reach.
    for sql in ("SHOW outbox.kafka_properties", "SELECT current_setting('outbox.kafka_properties')",
                "SELECT * FROM pg_file_settings", "SELECT pg_read_file('postgresql.auto.conf')",
                "SELECT current_setting('outbox.kafka_properties', true)", "SELECT * FROM outbox.workers"):
        err = refused(pg, "mallory", sql)
        assert SECRET not in str(err) and SECRET not in str(err.diag.message_detail)
    assert query(pg, "SELECT * FROM pg_settings WHERE name = 'outbox.kafka_properties'", user="mallory",
                 options="") == []
    assert_not_in_any(SECRET, query(pg, "SELECT * FROM pg_settings", user="mallory", options=""))
    assert_not_in_any(SECRET, query(pg, "SELECT * FROM pg_stat_activity", user="mallory", options=""))
    # The superuser's views and the log do not hold it either (the relay publishes with it set).
    eid = enqueue(pg, "billing", "k", '{}')
    wait_status(pg, [eid])
    assert value(pg, "SHOW outbox.kafka_properties") == f"sasl.password={SECRET}"
    assert_not_in_any(SECRET, query(pg, "SELECT * FROM outbox.workers"))
    assert_not_in_any(SECRET, query(pg, "SELECT * FROM pg_stat_activity"))
    assert SECRET not in pg.log()
    assert worker_pid(pg) == pid



def inject_claim_error(pg):
    pg.set(test_fail_step="claim:1")  # one ERROR in the next claim step
    # Seen in outbox.workers once recovered from; in the log only as a FATAL (log_min_messages
    # = log ranks ERROR below LOG).
    wait_until(lambda: "injected failure of step claim" in pg.log() + str(pg.sql("SELECT last_error FROM "
               "outbox.workers", dbname="shop")), 30, "the injected ERROR")
    pg.set(test_fail_step="")  # a restarted worker would take the setting afresh and fail again


@pytest.mark.parametrize("setting, then", [
    # The session's current role: a superuser's session may become any role, so the relay's
    # session takes it at connect, and each step begins as that role.
    pytest.param("role = mallory", None, id="role"),
    # The session user itself. A client session takes its user from the login, above any
    # database setting; a background worker connected without a user name does not, so the
    # relay's session user would become the owner's role (the worker pins it back).
    pytest.param("session_authorization = mallory", None, id="session_authorization"),
    # Turns every ERROR into FATAL: the relay recovers from an ERROR in place, and must not be
    # made to exit (losing its producer, counters and batch) instead.
    pytest.param("exit_on_error = on", inject_claim_error, id="exit_on_error"),
])
def test_database_owner_setting_does_not_stop_the_relay(owned_relay, setting, then):
    pg = owned_relay
    with connect(pg, "mallory") as c:
        c.execute(f"ALTER DATABASE shop SET {setting}")
    pg.restart()
    pid = wait_worker(pg)
    name = setting.split()[0]
    if name != "session_authorization":  # (a client session's login user wins over it, see above)
        with connect(pg) as plain:  # the setting reaches a superuser's session of the database
            assert plain.execute(f"SHOW {name}").fetchone()[0] == setting.split()[-1]
    if then:
        then(pg)
    eid = enqueue(pg, "billing", "k", '{}')
    try:
        wait_status(pg, [eid], timeout=20)
    except AssertionError:
        raise AssertionError(f"ALTER DATABASE SET {setting} stopped the relay: {query(pg, 'SELECT * FROM outbox.workers')}")
    assert worker_pid(pg) == pid, f"the relay exited: ALTER DATABASE SET {setting} reached it"


def test_database_owner_disallowing_connections_does_not_stop_the_relay(owned_relay, mock_cluster):
    """The owner of the relay's database may ALTER DATABASE ... ALLOW_CONNECTIONS false (from
    another database). The running worker keeps its connection; after the next server restart
    the relay must still publish the events that wait in the table."""
    pg = owned_relay
    for b in (1, 2, 3):
        mock_cluster.down(b)
    ids = [enqueue(pg, "billing", "k", f'{{"n": {i}}}') for i in range(3)]
    with connect(pg, "mallory", dbname="postgres") as c:
        c.execute("ALTER DATABASE shop WITH ALLOW_CONNECTIONS false")
    for b in (1, 2, 3):
        mock_cluster.up(b)
    log_before = len(pg.log())
    pg.restart()
    refusal, started = "is not currently accepting connections", 'outbox relay 0 started for database "shop"'
    outcome = wait_until(lambda: [w for w in (refusal, started) if w in pg.log()[log_before:]], 30,
                         "the relay's connection at start-up")
    assert outcome == [started], "a database owner's ALLOW_CONNECTIONS false kept the relay out of its database"
    query(pg, "ALTER DATABASE shop WITH ALLOW_CONNECTIONS true", dbname="postgres")  # for us to look
    wait_status(pg, ids)


# -- 2. an application role with EXECUTE on enqueue -----------------------------------------

@pytest.fixture
def app_relay(mock_cluster, make_relay):
    mock_cluster.create_topic("orders.x", 2)
    mock_cluster.create_topic("secret", 1)
    mock_cluster.create_topic("orders.private", 1)
    pg = make_relay(mock_cluster.bootstrap, allowed_topics=ALLOWED, poll_interval="200ms",
                    kafka_properties=f"sasl.password={SECRET}")
    wait_worker(pg)
    create_login(pg, "app")
    grant_readme_app_rights(pg, "app")
    return pg


def test_app_role_publishes_only_to_allowed_topics(app_relay, mock_cluster):
    pg = app_relay
    ok = [enqueue(pg, "billing", "a", '{"to": "billing"}', user="app"),
          enqueue(pg, "orders.x", "a", '{"to": "orders.x"}', user="app")]
    assert all(ok)
    for topic in ("secret", "orders", "ordersx", "Billing", "billing.x", "poison"):
        err = refused(pg, "app", "SELECT outbox.enqueue(%s, 'k', '{}'::jsonb)", (topic,))
        assert "outbox.allowed_topics" in str(err)
    # The allow-list is the server's: a session cannot widen it.
    with connect(pg, "app") as c:
        for sql in ("SET outbox.allowed_topics = ''", "SELECT set_config('outbox.allowed_topics', '', false)"):
            with pytest.raises(psycopg.errors.CantChangeRuntimeParam):
                c.execute(sql)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT outbox.enqueue('secret', 'k', '{}'::jsonb)")
    assert value(pg, "SELECT count(*) FROM outbox.events") == 2
    wait_status(pg, ok)

    # A row naming a disallowed topic that a superuser wrote by hand is quarantined, not sent.
    bad = value(pg, "INSERT INTO outbox.events (event_id, topic, key, lane, payload) "
                    "SELECT id, 'secret', 'k', outbox.lane_of('k', id), '\\x7b7d' FROM gen_random_uuid() id "
                    "RETURNING event_id::text")
    wait_status(pg, [bad], "failed")
    assert "allowed_topics" in value(pg, "SELECT last_error FROM outbox.events WHERE event_id = %s", (bad,))
    assert read_topic(mock_cluster.bootstrap, "secret", 0, timeout=10, settle=True) == []
    later = enqueue(pg, "billing", "after-bad", '{}', user="app")
    wait_status(pg, [later])


def test_app_role_cannot_read_change_or_stop_anything(app_relay):
    pg = app_relay
    eid = enqueue(pg, "billing", "k", '{"card": "4111"}', user="app")
    wait_status(pg, [eid])
    pid = worker_pid(pg)
    for sql in ("SELECT payload FROM outbox.events", "SELECT count(*) FROM outbox.events",
                "UPDATE outbox.events SET status = 'pending'", "DELETE FROM outbox.events",
                "INSERT INTO outbox.events (event_id, topic, key, lane) VALUES (gen_random_uuid(), 'x', 'k', 0)",
                "SELECT * FROM outbox.backlog", "SELECT * FROM outbox.failed",
                "SELECT * FROM outbox.workers", "SELECT * FROM outbox.worker_status()",
                "SELECT outbox.purge(interval '0')", "CALL outbox.purge_all(interval '0')",
                f"SELECT outbox.retry('{eid}')", "SELECT outbox.retry_failed()",
                # (to wake the relay in a loop: only the retry functions may)
                "SELECT outbox.wake_relay_at_commit()",
                "SELECT outbox.lane_of('k', NULL)", "SHOW outbox.kafka_properties",
                "SELECT current_setting('outbox.kafka_properties')", "SET outbox.max_payload_bytes = '100MB'",
                "SET ROLE outbox_relay", "SELECT nextval('outbox.events_id_seq')"):
        err = refused(pg, "app", sql)
        assert SECRET not in str(err)
    if value(pg, "SELECT extversion FROM pg_extension WHERE extname = 'outbox'") != "0.3.0":  # the ring (0.4.0 on)
        for sql in ("SELECT * FROM outbox.events_0", "TRUNCATE outbox.events_0", "SELECT * FROM outbox.landed",
                    "SELECT * FROM outbox.event_state", "SELECT * FROM outbox.cursors",
                    "SELECT * FROM outbox.ring_status", "SELECT outbox.ring_keeps_event_id(gen_random_uuid())"):
            refused(pg, "app", sql)
    # TRUNCATE of 0.4.0's view is refused before any right is asked (no view can be truncated).
    refused(pg, "app", "TRUNCATE outbox.events", sqlstates=("42501", "42809"))
    assert_cannot_signal_the_worker(pg, "app", pid)
    assert value(pg, "SELECT status FROM outbox.events WHERE event_id = %s", (eid,)) == "published"


def test_sql_looking_contents_are_published_verbatim(app_relay, mock_cluster):
    pg = app_relay
    key = "k'); ALTER ROLE app SUPERUSER; --"
    payload = "$$; SELECT pg_terminate_backend(pg_backend_pid()); DROP TABLE outbox.events; $$ \\' %s %%"
    headers = '{"x": "\'; ALTER ROLE app SUPERUSER; --", "y": "$1 $2 %s"}'
    pid = worker_pid(pg)
    eid = enqueue(pg, "billing", key, payload, user="app", headers=headers, kind="text")
    wait_status(pg, [eid])
    [record] = [r for r in read_topic(mock_cluster.bootstrap, "billing", 1) if r.event_id == eid]
    assert record.key == key.encode() and record.value == payload.encode()
    assert record.headers == {"x": "'; ALTER ROLE app SUPERUSER; --", "y": "$1 $2 %s", "event_id": eid}
    assert not is_superuser(pg, "app")
    assert worker_pid(pg) == pid


def test_duplicate_return_reveals_only_that_the_event_id_exists(app_relay):
    """docs/sql-api.md: a NULL return tells the caller that some event with that id exists, whoever
    enqueued it and whatever its topic. Nothing else: not its topic, key, payload or status,
    and the existing row is unchanged. On 0.4.1 (the default) dedup covers the ids callers give,
    and an id enqueue generated is refused as a caller's (22023) by its own bits (enqueue's mark),
    whether an event has it or not: probing one tells nothing, and writes nothing; on 0.3.0 and
    0.4.0 it is a duplicate like any other."""
    pg = app_relay
    theirs = enqueue(pg, "orders.private", "their-key", '{"salary": 123456}')  # a generated id
    wait_status(pg, [theirs])
    pending_theirs = value(pg, "SELECT outbox.enqueue('orders.private', 'p', '{}'::jsonb, NULL, "
                               "gen_random_uuid())::text")  # a caller's id; may be pending or published by now
    generated_refused = value(pg, "SELECT extversion FROM pg_extension WHERE extname = 'outbox'") not in (
        "0.3.0", "0.4.0")
    unused_generated = str(uuid.UUID(theirs[:19] + "8" + theirs[20:]))  # same mark and millisecond, no event
    if theirs[19] == "8":
        unused_generated = str(uuid.UUID(theirs[:19] + "9" + theirs[20:]))
    before = query(pg, "SELECT * FROM outbox.events ORDER BY id")
    with connect(pg, "app") as c:
        notices = []
        c.add_notice_handler(notices.append)
        for probe in (theirs, pending_theirs, unused_generated):
            for kind, payload in (("jsonb", '{"probe": 1}'), ("text", "probe"), ("bytea", "\\x00")):
                sql = f"SELECT outbox.enqueue('billing', 'probe', %s::{kind}, NULL, %s::uuid)"
                if probe != pending_theirs and generated_refused:
                    with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
                        c.execute(sql, (payload, probe))
                    assert str(err.value).splitlines()[0] == (
                        f"event_id {probe} was generated by outbox.enqueue() and cannot be given to another event")
                    assert "orders.private" not in str(err.value) and "their-key" not in str(err.value)
                    continue
                cur = c.execute(sql, (payload, probe))
                expected = None if probe != unused_generated else uuid.UUID(probe)
                if probe == unused_generated and kind != "jsonb":
                    expected = None  # the first probe (jsonb) wrote it: a caller's id on 0.3.0 / 0.4.0
                assert cur.fetchall() == [(expected,)] and len(cur.description) == 1
        # An id nobody used is enqueued: the contrast is the whole signal.
        fresh = c.execute("SELECT outbox.enqueue('billing', 'probe', '{}'::jsonb, NULL, "
                          "'00000000-0000-4000-8000-00000000abcd')::text").fetchone()[0]
        assert fresh == "00000000-0000-4000-8000-00000000abcd"
        # A topic outside the allow-list is refused before the id is looked at, existing or not.
        for probe in (theirs, "00000000-0000-4000-8000-00000000dcba"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
                c.execute("SELECT outbox.enqueue('secret', 'probe', '{}'::jsonb, NULL, %s::uuid)", (probe,))
            assert "orders.private" not in str(err.value) and "their-key" not in str(err.value)
        assert notices == []
    after = query(pg, "SELECT * FROM outbox.events WHERE event_id <> '00000000-0000-4000-8000-00000000abcd' "
                      "AND event_id <> %s ORDER BY id", (unused_generated,))
    # id, event_id, topic, key, lane, payload, headers (status may have moved on meanwhile)
    assert [r[:7] for r in after] == [r[:7] for r in before]


# -- secrets of outbox.kafka_properties in views and the log ------------------------------------

@pytest.mark.parametrize("properties", [
    pytest.param(f"security.protocol={SECRET}", id="invalid value"),
    pytest.param(f"sasl.username=u;sasl.password=pa;{SECRET}=ss", id="password containing ;"),
])
def test_a_bad_kafka_property_leaks_no_secret_to_the_monitoring_role(mock_cluster, make_relay, properties):
    pg = make_relay(mock_cluster.bootstrap)
    wait_worker(pg)
    create_login(pg, "monitoring")
    query(pg, "GRANT USAGE ON SCHEMA outbox TO monitoring; "
              "GRANT SELECT ON outbox.backlog, outbox.failed, outbox.workers TO monitoring; "
              "GRANT EXECUTE ON FUNCTION outbox.worker_status() TO monitoring")
    pg.set(kafka_properties=properties)
    wait_until(lambda: value(pg, "SELECT state FROM outbox.workers") == "misconfigured", 30, "misconfigured")
    rows = query(pg, "SELECT * FROM outbox.workers", user="monitoring")
    assert rows[0][5].startswith("outbox.kafka_properties entry"), rows[0][5]
    assert_not_in_any(SECRET, rows)
    assert SECRET not in relay_log(pg)


def test_librdkafka_debug_logging_keeps_the_password_out_of_the_log(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap)
    wait_worker(pg)
    query(pg, "ALTER SYSTEM SET log_min_messages = debug1")
    pg.set(kafka_properties=f"sasl.password={SECRET};debug=conf")
    eid = enqueue(pg, "billing", "k", '{}')
    wait_status(pg, [eid])
    wait_until(lambda: "sasl.password" in relay_log(pg), 30, "librdkafka's configuration dump in the log")
    assert SECRET not in relay_log(pg)


# A reload of outbox.kafka_properties makes the postmaster log the new value (PostgreSQL's own
# "parameter ... changed to" line, whatever the setting's flags): secrets go in
# outbox.kafka_properties_file, whose content never passes through a setting
# (test_kafka_faults.py: test_secrets_file_is_read_by_the_worker_and_never_logged).


# -- 3. a role with nothing --------------------------------------------------------------------

def test_role_with_nothing_can_do_nothing(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, poll_interval="200ms", kafka_properties=f"sasl.password={SECRET}")
    pid = wait_worker(pg)
    create_login(pg, "nobody")
    for sql in ("SELECT outbox.enqueue('billing', 'k', '{}'::jsonb)",
                "SELECT outbox.event_id('a', 'b')", "SELECT * FROM outbox.workers",
                "SELECT * FROM outbox.backlog", "SELECT * FROM outbox.failed", "SELECT * FROM outbox.worker_status()",
                "SELECT count(*) FROM outbox.events", "SET ROLE outbox_relay", "SHOW outbox.kafka_properties",
                "SELECT outbox.wake_relay_at_commit()"):
        refused(pg, "nobody", sql)
    assert_cannot_signal_the_worker(pg, "nobody", pid)
    # outbox_relay has no LOGIN: nobody can connect as it (nor without a password, with trust).
    with pytest.raises(psycopg.OperationalError, match="not permitted to log in"):
        connect(pg, "outbox_relay").close()
    # Nor restart it: statements that fail (in savepoints and EXCEPTION blocks, in a transaction
    # that commits) or that create nothing tell the launcher nothing (test_launcher.py has the rest).
    with connect(pg, "nobody", autocommit=False) as c:
        for sql in (f"ALTER DATABASE {pg.database} SET outbox.workers = 1",
                    "ALTER DATABASE no_such_database SET outbox.workers = 1", "CREATE EXTENSION outbox"):
            c.execute("SAVEPOINT s")
            with pytest.raises(psycopg.Error):
                c.execute(sql)
            c.execute("ROLLBACK TO SAVEPOINT s")
        c.execute("DO $$ BEGIN ALTER DATABASE no_such_database SET outbox.workers = 1; "
                  "EXCEPTION WHEN OTHERS THEN NULL; END $$")
        c.execute("CREATE EXTENSION IF NOT EXISTS outbox")
        c.commit()

    # While the relay publishes marked events, pg_stat_activity shows the nobody role the relay's
    # backend but never its statements' data; a superuser sees only the step's name.
    marker = "MARKER-7f3a"
    ids = []
    with connect(pg, "nobody") as c:
        for i in range(30):
            ids.append(enqueue(pg, "billing", f"{marker}-key-{i}", f'{{"m": "{marker}-payload-{i}"}}'))
            mine = c.execute("SELECT query, * FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall()
            assert len(mine) == 1 and mine[0][0] == "<insufficient privilege>"
            assert_not_in_any(marker, mine)
            assert_not_in_any(SECRET, mine)
            sup = query(pg, "SELECT query FROM pg_stat_activity WHERE backend_type = 'outbox relay'")
            assert_not_in_any(marker, sup)
    wait_status(pg, ids)
    assert worker_pid(pg) == pid


# -- grants: nothing for PUBLIC, exactly its rights for outbox_relay --------------------------

def test_nothing_in_schema_outbox_is_granted_to_public_and_relay_role_has_exactly_its_rights(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap)
    wait_worker(pg)
    public_grants = query(pg, PUBLIC_GRANTS_SQL)
    assert public_grants == []
    # The check sees a grant to PUBLIC when there is one.
    query(pg, "GRANT SELECT ON outbox.backlog TO PUBLIC")
    assert value(pg, "SELECT has_table_privilege('public', 'outbox.backlog', 'SELECT')")
    query(pg, "REVOKE SELECT ON outbox.backlog FROM PUBLIC")

    assert query(pg, "SELECT rolsuper, rolcanlogin, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication "
                     "FROM pg_roles WHERE rolname = 'outbox_relay'") == [(False, False, False, False, False, False)]
    assert query(pg, "SELECT roleid::regrole FROM pg_auth_members WHERE member = 'outbox_relay'::regrole") == []
    assert query(pg, "SELECT count(*) FROM pg_class WHERE relowner = 'outbox_relay'::regrole") == [(0,)]
    with connect(pg, options=NEUTRAL) as c:
        c.execute("SET ROLE outbox_relay")
        for sql in ("INSERT INTO outbox.events (event_id, topic, key, lane) "
                    "VALUES (gen_random_uuid(), 'billing', 'k', outbox.lane_of('k', NULL))",
                    "SELECT outbox.enqueue('billing', 'k', '{}'::jsonb)",
                    "SELECT outbox.purge(interval '0')", "SELECT outbox.retry_failed()",
                    "SELECT outbox.wake_relay_at_commit()", "SELECT * FROM outbox.backlog", "SELECT nextval('outbox.events_id_seq')",

                    "CREATE TABLE outbox.mine (id int)", "CREATE TABLE public.mine (id int)",
                    "SHOW outbox.kafka_properties"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                with c.transaction():
                    c.execute(sql)
        # What it needs, it has (test_ring_attack.py has 0.4.0's exact rights).
        c.execute("SELECT count(*) FROM outbox.events")
        if c.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox'").fetchone()[0] == "0.3.0":
            c.execute("UPDATE outbox.events SET status = status WHERE false")
            c.execute("DELETE FROM outbox.events WHERE false")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                with c.transaction():
                    c.execute("TRUNCATE outbox.events")
        else:  # 0.4.0: it reads the members, moves its cursors, writes where events landed and the rare outcomes
            for sql in ("TRUNCATE outbox.events_0", "DELETE FROM outbox.cursors", "DELETE FROM outbox.landed",
                        "INSERT INTO outbox.events_0 (event_id, topic, lane) VALUES (gen_random_uuid(), 'b', 0)",
                        "SELECT outbox.ring_cursor_floor()", "SELECT outbox.truncate_ring_member(0::smallint)"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    with c.transaction():
                        c.execute(sql)
            c.execute("SELECT count(*) FROM outbox.events_0")
            c.execute("UPDATE outbox.cursors SET updated_at = updated_at WHERE false")
            c.execute("INSERT INTO outbox.landed (member, topic, kafka_partition, first_offset, ids, published_at) "
                      "SELECT 0, 'x', 0, 0, '{}', now() WHERE false")
            c.execute("DELETE FROM outbox.event_state WHERE false")
    eid = enqueue(pg, "billing", "k", '{}')
    wait_status(pg, [eid])
