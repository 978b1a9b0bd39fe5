"""Property-based tests (Hypothesis) of what goes into the outbox, against librdkafka's mock
cluster, one cluster per test function:

- generated outbox.enqueue() calls (topics, keys, payloads of the three types and many sizes,
  headers of every JSON shape, invalid UTF-8): each returns an id (NULL for a duplicate caller
  event_id) or raises one of a few fitting SQLSTATEs, never breaks the connection, and a raised
  call inserts nothing; every accepted event ends published (and is in Kafka) or failed with a
  reason;
- generated rows written straight into outbox.events, every column at and past its edges: the
  INSERT is refused with a data or constraint error (the table unchanged), or the row is
  accepted and then, if it is due, ends published or failed with a reason, while rows written
  as published/failed stay untouched; good enqueued events interleaved with them are all
  published;
- the same in a SQL_ASCII database, where text can hold invalid UTF-8: enqueue refuses it
  (22021), the relay quarantines such rows written directly (failed, never published as is).

Throughout, the relay workers keep their pids (no crash restart; the suite's crash watch reads
the server log too) and the log shows no ERROR loop.

Examples per test: OUTBOX_PROPERTY_EXAMPLES (default 400, up to 25 inputs each, a few minutes
per test); a longer run:
    OUTBOX_PROPERTY_EXAMPLES=1000 python3 -m pytest test/test_properties.py -p no:cacheprovider
A failure prints the falsifying example and a @reproduce_failure blob."""

import json
import os
import random
import re
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from harness.wait import wait_until

# 0.3.0's table, written and broken directly (0.4.0's view takes only pending rows).
pytestmark = pytest.mark.schema("0.3.0")

EXAMPLES = int(os.environ.get("OUTBOX_PROPERTY_EXAMPLES", "400"))
MAX_PAYLOAD = 64 * 1024  # outbox.max_payload_bytes in these tests: its edge is cheap to cross
ENQUEUE_SQLSTATES = {
    "22023",  # invalid_parameter_value: topic name, headers shape, reserved header
    "22004",  # null_value_not_allowed: NULL topic, keyless tombstone
    "54000",  # program_limit_exceeded: over outbox.max_payload_bytes
    "22021",  # character_not_in_repertoire: invalid UTF-8
    "42501",  # insufficient_privilege: topic not allowed
}
GOOD_TOPIC = "prop.good"
TOPICS = ["prop.a", "prop_b", "prop-c", GOOD_TOPIC]
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
# The relay's state carries over from one example to the next (a wedged worker fails every later
# example), so shrinking would chase that state, at a settle deadline per try: the failing
# example is reported as drawn (at most 20 rows).
RELAY_SETTINGS = settings(SETTINGS, phases=[Phase.explicit, Phase.generate])

# --- strategies ------------------------------------------------------------------------------

CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
INVALID_UTF8 = [b"\xff", b"\xc3", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80", b"\xe2\x82"]


def utf8(s):
    return s.encode()


# The functions given to .map() below are named, never lambdas: this Hypothesis (Debian 12's
# 6.67) notes each mapped value for the failure report by the function's description, and for a
# lambda that is a parse of its source file on every draw, a fifth of the generation time.
def invalid_utf8_text(t):
    return utf8(t[0]) + t[1] + utf8(t[2])


def repeated_text(t):
    return utf8(t[0] * t[1])


def hex_text(b):
    return b.hex().encode()


def random_hex_text(t):
    """t = (n, seed): 2n hex digits of n random bytes (incompressible)."""
    n, seed = t
    return random.Random(seed).randbytes(n).hex().encode()


# Text as the bytes sent (the tests pass every text through convert_from, so a SQL_ASCII
# database receives them as they are).
valid_text = st.text(CHARS, max_size=40).map(utf8)
invalid_text = st.tuples(st.text(CHARS, max_size=10), st.sampled_from(INVALID_UTF8), st.text(CHARS, max_size=5)) \
    .map(invalid_utf8_text)
long_text = st.tuples(st.sampled_from(["k", "é", "鍵"]), st.integers(1, 3000)).map(repeated_text)
# Long incompressible keys, drawn as a length and a seed. Drawn as st.binary(min_size=3000), each
# byte is one of Hypothesis's draws: the example overruns its 8 KiB buffer and is thrown away, so
# such a key (almost) never reached the server, and the failed draws cost more time than the rest
# of the enqueue tests.
random_long_text = st.tuples(st.integers(3000, 6000), st.integers(0, 2**32 - 1)).map(random_hex_text)
# The rows written directly still draw them the old way, which (almost) never gets one to the
# server: drawn as above, they do, and without the table's checks the relay wedges on such a row
# when it must record it failed (a quarantined topic): its UPDATE puts the row into
# events_waiting_idx (topic, key, ...), whose entry is over btree's 2704 bytes, so the record
# fails, the worker backs off and retries it for ever. A known gap until the relay copes.
unreached_random_long_text = st.binary(min_size=3000, max_size=6000).map(hex_text)

topic_names = st.one_of(
    st.sampled_from(TOPICS).map(utf8),
    valid_text, invalid_text, st.none(),
    st.sampled_from(["", ".", "..", "a" * 249, "a" * 250, ".hidden", "has space", "x/y", "ünï", "a\tb"]).map(utf8))
keys = st.one_of(st.none(), valid_text, invalid_text, long_text, random_long_text)
row_keys = st.one_of(st.none(), valid_text, invalid_text, long_text, unreached_random_long_text)

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(CHARS, max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(CHARS, max_size=8), inner, max_size=4)), max_leaves=12)
header_objects = st.one_of(
    st.none(),
    st.dictionaries(st.text(CHARS, max_size=12), st.text(CHARS, max_size=30), max_size=5),  # the legal shape
    st.dictionaries(st.text(CHARS, max_size=12), json_values, max_size=4),
    json_values,
    st.sampled_from([{"trace": None}, {"event_id": "mine"}, {"n": 1}, {"nested": {"a": "b"}}, {"": ""},
                     {"a": "x" * (MAX_PAYLOAD + 1)}, [], "s", 0]))
payload_sizes = st.one_of(st.integers(0, 300), st.sampled_from([MAX_PAYLOAD - 20, MAX_PAYLOAD, MAX_PAYLOAD + 1,
                                                               4 * MAX_PAYLOAD]))


def padded_object(n):
    return {"pad": "p" * n}


def text_of_size(n):
    return b"t" * n


def bytes_of_size(n):
    return b"\x00\xff" * (n // 2)


payloads = st.one_of(
    st.tuples(st.just("jsonb"), json_values),
    st.tuples(st.just("jsonb"), payload_sizes.map(padded_object)),
    st.tuples(st.just("text"), st.one_of(valid_text, invalid_text, payload_sizes.map(text_of_size))),
    st.tuples(st.just("bytea"), st.one_of(st.binary(max_size=300), payload_sizes.map(bytes_of_size))),
    st.tuples(st.sampled_from(["jsonb", "text", "bytea"]), st.none()))
EVENT_IDS = [str(uuid.UUID(int=i + 1, version=4)) for i in range(8)]
enqueue_calls = st.fixed_dictionaries({
    "topic": topic_names, "key": keys, "payload": payloads, "headers": header_objects,
    "event_id": st.one_of(st.none(), st.sampled_from(EVENT_IDS))})

# Direct rows: every column as the text the server parses (or left to its default), at and past
# its edges. Keys never collide with the good events' keys.
TIMESTAMPS = ["infinity", "-infinity", "now", "epoch", "4713-01-01 00:00 BC", "294276-12-31 23:59:59",
              "1900-01-01", "3000-01-01", "2000-02-30", "not a time", "now() - 1 hour"]
ints = lambda lo, hi: st.one_of(st.integers(lo, hi).map(str), st.sampled_from(  # noqa: E731
    [str(lo), str(hi), str(lo - 1), str(hi + 1), "0", "-1", "1e3", "abc", ""]))


def not_a_good_key(k):
    return k if k is None or not k.startswith(b"good-") else b"x" + k


def payload_of_size(n):
    return b"P" * n


def json_text(h):
    return json.dumps(h, ensure_ascii=False).encode()


def header_with_text(b):
    return b'{"h": "' + b.replace(b'"', b"").replace(b"\\", b"") + b'"}'


row_columns = {
    "event_id": st.one_of(st.uuids().map(str), st.sampled_from(EVENT_IDS + ["not-a-uuid", ""])),
    "topic": topic_names,
    "key": row_keys.map(not_a_good_key),
    "lane": st.one_of(ints(-32768, 32767), st.integers(0, 1023).map(str)),
    "payload": st.one_of(st.none(), st.binary(max_size=200),
                         st.sampled_from([2 * 1024 * 1024, 1024 * 1024 + 1, 1000 * 1000]).map(payload_of_size)),
    "headers": st.one_of(st.none(), header_objects.map(json_text), invalid_text.map(header_with_text),
                         st.sampled_from([b'{"a":', b"not json", b'{"trace": null}', b'{"a": "\\u0000"}'])),
    "status": st.one_of(st.sampled_from(["pending", "in_flight", "published", "failed", "PENDING", "", " pending"]),
                        st.text(CHARS, max_size=10)),
    "attempts": ints(-2**31, 2**31 - 1),
    "next_attempt_at": st.sampled_from(TIMESTAMPS),
    "created_at": st.sampled_from(TIMESTAMPS),
    "last_error": st.one_of(st.none(), st.text(CHARS, max_size=20)),
    "claimed_at": st.one_of(st.none(), st.sampled_from(TIMESTAMPS)),
    "published_at": st.one_of(st.none(), st.sampled_from(TIMESTAMPS)),
    "kafka_partition": st.one_of(st.none(), ints(-2**31, 2**31 - 1)),
    "kafka_offset": st.one_of(st.none(), ints(-2**63, 2**63 - 1)),
}
TYPES = {"event_id": "uuid", "lane": "smallint", "payload": "bytea", "headers": "jsonb", "attempts": "integer",
         "next_attempt_at": "timestamptz", "created_at": "timestamptz", "claimed_at": "timestamptz",
         "published_at": "timestamptz", "kafka_partition": "integer", "kafka_offset": "bigint"}
TEXT_COLUMNS = {"topic", "key", "headers"}  # passed as bytes (see text_sql)
# Each column is given (possibly NULL) or left out (its default); the table's NOT NULLs and
# CHECKs decide.
REQUIRED = ("event_id", "topic", "lane")  # mostly given: the other columns' edges are the point
direct_rows = st.fixed_dictionaries({k: row_columns[k] for k in REQUIRED},
                                    optional={k: v for k, v in row_columns.items() if k not in REQUIRED})

# --- helpers ---------------------------------------------------------------------------------


def make_property_relay(mock_cluster, make_relay, database="postgres", encoding=None):
    settings_ = dict(workers=2, max_attempts=2, backoff_base="50ms", backoff_max="200ms", publish_timeout="1s",
                     poll_interval="100ms", on_failed_event="skip", max_payload_bytes=str(MAX_PAYLOAD),
                     retention="0")  # purge would delete rows written as long published
    if encoding is None:
        pg = make_relay(mock_cluster.bootstrap, database=database, **settings_)
    else:
        pg = make_relay(mock_cluster.bootstrap, database=database, create_extension=False, **settings_)
        pg.sql(f"CREATE DATABASE {database} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
               dbname="postgres")
        pg.restart()  # workers that found no database wait; a restart lets them connect now
        pg.sql("CREATE EXTENSION outbox VERSION '0.3.0'")
    pg.wait_workers_running(2)
    for topic in TOPICS:
        mock_cluster.create_topic(topic, 3)
    return pg


def connect(pg):
    # Text the server cannot convert must not break the client: results that may hold such text
    # are read as bytes (convert_to), error messages are decoded leniently by psycopg.
    c = pg.connect()
    c.execute("SET client_encoding = 'UTF8'")  # psycopg returns bytes for SQL_ASCII text
    return c


def text_sql(value_present):
    """SQL for one text argument passed as bytes, converted as is in a SQL_ASCII database."""
    return "convert_from(%s::bytea, current_setting('server_encoding'))" if value_present else "NULL::text"


def sqlstate_of(c, error):
    """The error's SQLSTATE; a broken connection (the server crashed) is never a fitting answer."""
    if error.sqlstate is None or c.broken:
        raise AssertionError(f"the connection broke (server crash?): {error}") from error
    return error.sqlstate


def enqueue(c, call):
    """Runs one generated call. Returns ("ok", uuid or None) or ("error", sqlstate)."""
    kind, payload = call["payload"]
    params, args = [], []
    for name in ("topic", "key"):
        args.append(text_sql(call[name] is not None))
        if call[name] is not None:
            params.append(call[name])
    if payload is None:
        args.append(f"NULL::{kind}")
    elif kind == "jsonb":
        args.append("%s::jsonb")
        params.append(Jsonb(payload))
    elif kind == "text":
        args.append(text_sql(True))
        params.append(payload)
    else:
        args.append("%s::bytea")
        params.append(payload)
    args.append("%s::jsonb")
    params.append(None if call["headers"] is None else Jsonb(call["headers"]))
    args.append("%s::uuid")
    params.append(call["event_id"])
    try:
        return "ok", c.execute(f"SELECT outbox.enqueue({', '.join(args)})::text", params).fetchone()[0]
    except psycopg.errors.Error as e:
        return "error", sqlstate_of(c, e)


def insert_row(c, row):
    """INSERT of one generated row as superuser. Returns ("ok", id) or ("error", sqlstate)."""
    columns, values, params = [], [], []
    for name, value in row.items():
        columns.append(name)
        if value is None:
            values.append("NULL")
        elif name in TEXT_COLUMNS:
            values.append(text_sql(True) + ("::jsonb" if name == "headers" else ""))
            params.append(value)
        elif name == "last_error" or name == "status":
            values.append("%s::text")
            params.append(value)
        elif name == "payload":
            values.append("%s::bytea")
            params.append(value)
        else:
            values.append(f"%s::{TYPES[name]}")
            params.append(value)
    sql = (f"INSERT INTO outbox.events ({', '.join(columns)}) VALUES ({', '.join(values)}) RETURNING id"
           if columns else "INSERT INTO outbox.events DEFAULT VALUES RETURNING id")
    try:
        return "ok", c.execute(sql, params).fetchone()[0]
    except psycopg.errors.Error as e:
        return "error", sqlstate_of(c, e)


def table_fingerprint(c):
    # The relay updates rows meanwhile but never inserts or deletes (retention is off here).
    return c.execute("SELECT count(*), coalesce(max(id), 0) FROM outbox.events").fetchone()


def row_states(c, ids):
    """{id: (status, last_error is not null, md5 of the whole row)}."""
    rows = c.execute("SELECT id, status, last_error IS NOT NULL, md5(e::text) FROM outbox.events e "
                     "WHERE id = ANY(%s)", (list(ids),)).fetchall()
    return {r[0]: r[1:] for r in rows}


def enqueue_good(c, n, tag):
    ids = []
    for i in range(n):
        ids.append(c.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)::text",
                             (GOOD_TOPIC, f"good-{tag}-{i}", Jsonb({"good": i}))).fetchone()[0])
    return ids


def wait_settled(pg, ids, what, pids, timeout=30, c=None):
    """Every row of `ids` published, or failed with a reason. Ends at once if a relay worker was
    restarted meanwhile (a crash: the postmaster restarts every process). c: a connection to poll
    over (a new one per poll costs more than the rest of a generated example), else new ones."""
    def settled(c):
        n = c.execute("SELECT count(*) FROM outbox.events WHERE id = ANY(%s) AND (status = 'published' OR "
                      "(status = 'failed' AND last_error IS NOT NULL))", (list(ids),)).fetchone()[0]
        return "settled" if n == len(ids) else None

    def settled_or_restarted():
        if c is not None:
            try:
                return "restarted" if pg.worker_pids(c) != pids else settled(c)
            except psycopg.OperationalError:  # the server restarted: the kept connection is gone
                return "restarted"
        try:
            if pg.worker_pids() != pids:
                return "restarted"
        except psycopg.OperationalError:  # in crash recovery
            return "restarted"
        with connect(pg) as c_:
            return settled(c_)
    try:
        outcome = wait_until(settled_or_restarted, timeout, what)
    except AssertionError:
        with connect(pg) as c:
            left = c.execute("SELECT id, status, attempts, next_attempt_at, convert_to(coalesce(last_error, ''), "
                             "'SQL_ASCII') FROM outbox.events WHERE id = ANY(%s) AND status NOT IN "
                             "('published', 'failed') LIMIT 10", (list(ids),)).fetchall()
        raise AssertionError(f"{what}: not settled: {left}; workers {pg.workers()}") from None
    assert outcome == "settled", f"relay workers restarted (crash?) while waiting for {what}; see the server log"


VALID_TOPIC = re.compile(rb"[a-zA-Z0-9._-]{1,249}")


def published_in_kafka(pg, mock_cluster, ids):
    """Every published row among `ids` is below its partition's high watermark in Kafka."""
    from confluent_kafka import Consumer, TopicPartition
    with connect(pg) as c:
        rows = c.execute("SELECT convert_to(topic, 'SQL_ASCII'), kafka_partition, max(kafka_offset) "
                         "FROM outbox.events WHERE id = ANY(%s) AND status = 'published' GROUP BY 1, 2",
                         (list(ids),)).fetchall()
    consumer = Consumer({"bootstrap.servers": mock_cluster.bootstrap, "group.id": "prop-check"})
    try:
        for topic, partition, offset in rows:
            if not VALID_TOPIC.fullmatch(bytes(topic)) or bytes(topic) in (b".", b".."):
                continue  # the mock cluster takes names a broker refuses; a consumer cannot ask for them
            assert partition is not None and offset is not None and offset >= 0, (topic, partition, offset)
            _, high = consumer.get_watermark_offsets(TopicPartition(topic.decode(), partition), timeout=10)
            assert offset < high, f"published row at {topic}[{partition}]@{offset} not in Kafka (high {high})"
    finally:
        consumer.close()


def assert_no_error_loop(pg):
    """The same relay ERROR line (a row's error names its event) more than a handful of times
    means the relay retries an error it cannot get past."""
    relay_errors = {}
    for line in pg.log().splitlines():
        m = re.search(r"\] outbox relay (?:ERROR|FATAL):\s+(.*)", line)
        if m:
            relay_errors[m.group(1)] = relay_errors.get(m.group(1), 0) + 1
    loops = {message: n for message, n in relay_errors.items() if n > 5}
    assert not loops, f"the relay repeats an error (error loop): {loops}"


# In a SQL_ASCII database jsonb's own input refuses \u escapes of non-ASCII characters
# ("unsupported Unicode escape sequence"), before enqueue sees its arguments.
SQL_ASCII_INPUT_SQLSTATES = {"0A000"}


def assert_enqueue_outcome(c, call, outcome, fingerprint_before, allowed=ENQUEUE_SQLSTATES):
    status, value = outcome
    if status == "error":
        assert value in allowed, f"enqueue raised SQLSTATE {value} for {call!r:.300}"
        assert table_fingerprint(c) == fingerprint_before, "a refused enqueue changed outbox.events"
        return None
    texts = [call["topic"], call["key"]] + ([call["payload"][1]] if call["payload"][0] == "text" else [])
    assert all(t is None or is_utf8(t) for t in texts), f"enqueue accepted invalid UTF-8: {call!r:.300}"
    if value is None:
        assert call["event_id"] is not None, "NULL returned without a caller event_id"
        assert c.execute("SELECT count(*) FROM outbox.events WHERE event_id = %s", (call["event_id"],)).fetchone()[0] == 1
        return None
    if call["event_id"] is not None:
        assert value == call["event_id"]
    row = c.execute("SELECT id, convert_to(topic, 'SQL_ASCII'), convert_to(key, 'SQL_ASCII'), payload "
                    "FROM outbox.events WHERE event_id = %s", (value,)).fetchone()
    assert row is not None, "enqueue returned an id but stored no row"
    assert row[1] == call["topic"] and row[2] == call["key"]
    kind, payload = call["payload"]
    if kind in ("text", "bytea") and payload is not None:
        assert bytes(row[3]) == payload, "stored payload differs from the bytes passed"
    return row[0]


# --- the properties --------------------------------------------------------------------------

def run_enqueue_property(pg, mock_cluster, allowed=ENQUEUE_SQLSTATES):
    accepted = []
    tried = [0]

    @SETTINGS
    @given(st.lists(enqueue_calls, min_size=1, max_size=25))
    def calls_get_an_id_or_a_fitting_error(calls):
        with connect(pg) as c:
            c.execute("DELETE FROM outbox.events WHERE event_id::text = ANY(%s)", (EVENT_IDS,))
            for call in calls:
                tried[0] += 1
                before = table_fingerprint(c)
                row_id = assert_enqueue_outcome(c, call, enqueue(c, call), before, allowed)
                if row_id is not None and call["event_id"] is None:
                    accepted.append(row_id)
                assert c.execute("SELECT 1").fetchone() == (1,)

    pids = pg.worker_pids()
    calls_get_an_id_or_a_fitting_error()
    print(f"enqueue calls: {tried[0]}, accepted {len(accepted)}")
    wait_settled(pg, accepted, "every accepted enqueue published or failed", pids)
    published_in_kafka(pg, mock_cluster, accepted)
    assert_no_error_loop(pg)
    return accepted


# Rows that must always be tried, whatever Hypothesis draws: a header with a JSON null value
# (it crashed the relay at d539db3), the timestamps' infinities.
KNOWN_BAD_ROWS = [
    [{"event_id": str(uuid.uuid4()), "topic": b"prop.a", "key": b"trace-null", "lane": "0",
      "headers": b'{"trace": null}'}],
    [{"event_id": str(uuid.uuid4()), "topic": b"prop.a", "key": b"inf", "lane": "1", "next_attempt_at": "-infinity",
      "created_at": "infinity"}],
    [{"event_id": str(uuid.uuid4()), "topic": b"prop.a", "key": b"nested", "lane": "2",
      "headers": b'{"a": {"b": "c"}, "n": 1, "l": [1]}'}],
]


def run_direct_rows_property(pg, mock_cluster, extra_check=None):
    good, all_accepted = [], []
    counts = {"refused": 0, "accepted": 0}

    def check_rows(rows):
        pg.wait_workers_running(2)  # after a crash in an earlier example, the restarted relay
        with connect(pg) as c:  # the example's one connection
            pids = pg.worker_pids(c)
            # A replay of this example (Hypothesis shrinking) must not meet its own earlier rows.
            ids = [r["event_id"] for r in rows if re.fullmatch(r"[0-9a-f-]{36}", r.get("event_id") or "")]
            c.execute("DELETE FROM outbox.events WHERE event_id = ANY(%s::uuid[])", (ids,))
            accepted = []
            for i, row in enumerate(rows):
                before = table_fingerprint(c)
                status, value = insert_row(c, row)
                if status == "error":
                    # Bad input (class 22), a constraint (23), an index row too large (54000), a
                    # generated column given (428C9): a clear error, and nothing changed.
                    assert value[:2] in ("22", "23") or value in ("54000", "428C9"), \
                        f"INSERT raised SQLSTATE {value} for {row!r:.300}"
                    assert table_fingerprint(c) == before
                    counts["refused"] += 1
                else:
                    accepted.append(value)
                    counts["accepted"] += 1
                if i % 4 == 0:
                    good.extend(enqueue_good(c, 1, uuid.uuid4().hex[:8]))
            # Due rows must settle unless an earlier pending row of their key is not due yet
            # (the relay keeps a key's order: that one goes first). on_failed_event = skip, so
            # failed rows do not hold their key.
            info = c.execute(
                "SELECT id, status, next_attempt_at <= now(), md5(e::text), EXISTS (SELECT 1 FROM outbox.events b "
                "WHERE b.key = e.key AND b.id < e.id AND b.status = 'pending' AND b.next_attempt_at > now()) "
                "FROM outbox.events e WHERE id = ANY(%s) ORDER BY id", (accepted,)).fetchall()
            # Rows written as published or failed are not the relay's: only the rest must be in Kafka.
            all_accepted.extend(r[0] for r in info if r[1] not in ("published", "failed"))
            due = [r[0] for r in info if r[1] == "pending" and r[2] and not r[4]]
            written_final = {r[0]: r[3] for r in info if r[1] in ("published", "failed")}
            good_ids = [g for g in good[-5:]]
            good_rows = [r[0] for r in c.execute("SELECT id FROM outbox.events WHERE event_id::text = ANY(%s)",
                                                 (good_ids,)).fetchall()]
            wait_settled(pg, due + good_rows, "every due accepted row and the good events settled", pids, c=c)
            now_states = row_states(c, list(written_final))
        for row_id, digest in written_final.items():
            assert now_states[row_id][2] == digest, f"the relay changed row {row_id}, written as {now_states[row_id][0]}"
        if extra_check:
            extra_check(pg, accepted)
        assert_no_error_loop(pg)

    rows_are_refused_or_settle = RELAY_SETTINGS(given(st.lists(direct_rows, min_size=1, max_size=20))(check_rows))
    for rows in KNOWN_BAD_ROWS:
        check_rows(rows)
    rows_are_refused_or_settle()
    with connect(pg) as c:
        not_published = c.execute("SELECT count(*) FROM outbox.events WHERE event_id::text = ANY(%s) "
                                  "AND status <> 'published'", (good,)).fetchone()[0]
    assert not_published == 0, f"{not_published} good events not published"
    published_in_kafka(pg, mock_cluster, all_accepted)
    from harness.kafka_reader import read_topic
    records = read_topic(mock_cluster.bootstrap, GOOD_TOPIC, len(good))
    assert set(good) <= {r.event_id for r in records}, "a good event is missing from Kafka"
    print(f"direct rows: {counts}, good events {len(good)}")


def test_enqueue_any_input_gets_an_id_or_a_fitting_error(mock_cluster, make_relay):
    pg = make_property_relay(mock_cluster, make_relay)
    pids = pg.worker_pids()
    run_enqueue_property(pg, mock_cluster)
    assert pg.worker_pids() == pids


def test_rows_written_directly_are_refused_or_published_or_failed(mock_cluster, make_relay):
    pg = make_property_relay(mock_cluster, make_relay)
    run_direct_rows_property(pg, mock_cluster)


def test_rows_written_directly_without_the_tables_checks(mock_cluster, make_relay):
    """A superuser can drop the table's checks: then the relay's own defences (quarantine, clamps,
    headers read only when an object) must hold alone."""
    pg = make_property_relay(mock_cluster, make_relay)
    from test_safety import drop_row_checks
    assert pg.value("SELECT count(*) FROM pg_constraint WHERE conrelid = 'outbox.events'::regclass "
                    "AND conname = 'events_row_check'") == 1
    drop_row_checks(pg)
    run_direct_rows_property(pg, mock_cluster)


def quarantined_invalid_utf8(pg, ids):
    """In a SQL_ASCII database: no row whose topic, key or header values are not valid UTF-8 is
    published."""
    with connect(pg) as c:
        rows = c.execute("SELECT id, status, convert_to(topic, 'SQL_ASCII'), convert_to(coalesce(key, ''), 'SQL_ASCII'),"
                         " convert_to(coalesce(headers::text, ''), 'SQL_ASCII') FROM outbox.events "
                         "WHERE id = ANY(%s)", (list(ids),)).fetchall()
    for row_id, status, *texts in rows:
        invalid = any(not is_utf8(t) for t in texts)
        assert not (invalid and status == "published"), f"row {row_id} with invalid UTF-8 was published as is"


def is_utf8(b):
    try:
        bytes(b).decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_sql_ascii_database_enqueue_refuses_invalid_utf8(mock_cluster, make_relay):
    pg = make_property_relay(mock_cluster, make_relay, database="asciidb", encoding="SQL_ASCII")
    pids = pg.worker_pids()
    # Invalid UTF-8 in the key, a header value or a text payload is refused with 22021.
    not_refused = []
    with connect(pg) as c:
        for bad in INVALID_UTF8:
            for what, sql, params in (
                    ("key", "SELECT outbox.enqueue('prop.a', convert_from(%s::bytea, 'SQL_ASCII'), 'ok'::text)",
                     (b"k" + bad,)),
                    ("text payload", "SELECT outbox.enqueue('prop.a', 'k', convert_from(%s::bytea, 'SQL_ASCII'))",
                     (b"p" + bad,)),
                    ("header value", "SELECT outbox.enqueue('prop.a', 'k', 'ok'::text, "
                                     "convert_from(%s::bytea, 'SQL_ASCII')::jsonb)", (b'{"h": "' + bad + b'"}',))):
                before = table_fingerprint(c)
                try:
                    c.execute(sql, params)
                    outcome = "accepted"
                except psycopg.errors.Error as e:
                    outcome = e.sqlstate
                if outcome != "22021":
                    not_refused.append((what, bad, outcome))
                elif table_fingerprint(c) != before:
                    not_refused.append((what, bad, "refused but the table changed"))
    assert not not_refused, f"invalid UTF-8 not refused with 22021: {not_refused}"
    run_enqueue_property(pg, mock_cluster, ENQUEUE_SQLSTATES | SQL_ASCII_INPUT_SQLSTATES)
    assert pg.worker_pids() == pids


def test_sql_ascii_database_rows_with_invalid_utf8_are_quarantined(mock_cluster, make_relay):
    pg = make_property_relay(mock_cluster, make_relay, database="asciidb", encoding="SQL_ASCII")
    run_direct_rows_property(pg, mock_cluster, extra_check=quarantined_invalid_utf8)
