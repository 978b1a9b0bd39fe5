"""Attacks on issue 15 item 6 (every CloudEvents attribute the relay writes is one the SDKs read):
as the least-privileged role that reaches each path (EXECUTE on enqueue only; INSERT on
outbox.events; ALTER SYSTEM on outbox.cloudevents_source only), try to get a record published that
the CloudEvents Java SDK (CloudEventDeserializer, test/cloudevents-java) or the Python SDK refuses:
one such record stops every Java consumer of its partition at that offset. Each attack is held
when the input is refused (22023 at enqueue or SET, the table's CHECK) or the row quarantined, or
when both SDKs read what was published; a test fails when an SDK refuses a published record."""

import os
import uuid

import psycopg
import pytest
from cloudevents.kafka import KafkaMessage, from_binary

from harness.cloudevents_java import read_with_java_sdk
from harness.kafka_broker import KafkaBroker
from harness.kafka_reader import read_topic
from harness.wait import wait_until
from test_safety import lane_of, worker_pid

ENQUEUE_JSONB = "outbox.enqueue(text, text, jsonb, jsonb, uuid, integer, text, text, boolean, text, text)"
TOPICS = ("atk.enqueue", "atk.hand", "atk.ipv6-port", "atk.setting", "atk.structured", "atk.conf")


@pytest.fixture(scope="module")
def kafka():
    with KafkaBroker() as kb:
        for topic in TOPICS:
            kb.create_topic(topic, partitions=1)
        yield kb


def create_enqueuer(pg, role):
    """Only what the application role needs to enqueue a JSON event."""
    pg.sql(f"CREATE ROLE {role} LOGIN")
    pg.sql(f"GRANT USAGE ON SCHEMA outbox TO {role}; GRANT EXECUTE ON FUNCTION {ENQUEUE_JSONB} TO {role}")


def create_hand_writer(pg, role):
    """Only what writing rows by hand takes (docs/sql-api.md "The table")."""
    pg.sql(f"CREATE ROLE {role} LOGIN")
    pg.sql(f"GRANT USAGE ON SCHEMA outbox TO {role}; GRANT INSERT ON outbox.events TO {role}; "
           f"GRANT EXECUTE ON FUNCTION outbox.events_row_check TO {role}")


def enqueue_as(pg, role, topic, headers=None, **arguments):
    """outbox.enqueue of a CloudEvent as `role`: its event_id, or the SQLSTATE it was refused with."""
    names = "".join(f", {name} => %s" for name in arguments)
    try:
        with psycopg.connect(host=pg.tmp, port=pg.port, user=role, dbname=pg.database) as c:
            return c.execute(f"SELECT outbox.enqueue(%s, 'k', '{{}}'::jsonb, %s::jsonb, cloudevents => true{names})"
                             "::text", [topic, headers, *arguments.values()]).fetchone()[0]
    except psycopg.Error as e:
        return e.sqlstate


def write_as(pg, role, topic, key, headers=None, **columns):
    """A row written by hand as `role`: its event_id, or the SQLSTATE the table refused it with."""
    event_id = str(uuid.uuid4())
    names = ["event_id", "topic", "key", "lane", "payload", "headers", *columns]
    try:
        with psycopg.connect(host=pg.tmp, port=pg.port, user=role, dbname=pg.database) as c:
            c.execute(f"INSERT INTO outbox.events ({', '.join(names)}) VALUES (%s, %s, %s, %s, %s, "
                      f"%s::jsonb{', %s' * len(columns)})",
                      [event_id, topic, key, lane_of(key, event_id), b"{}", headers, *columns.values()])
    except psycopg.Error as e:
        return e.sqlstate
    return event_id


def settled(pg, event_ids, timeout=90):
    """Waits until no event is pending; returns {event_id: (status, last_error)}."""
    def states():
        rows = pg.sql("SELECT event_id::text, status, last_error FROM outbox.events WHERE event_id = ANY(%s::uuid[])",
                      (list(event_ids),))
        return {e: (s, err) for e, s, err in rows}
    wait_until(lambda: all(s != "pending" for s, _ in states().values()), timeout, "every event settled")
    return states()


def sdk_refusals(kafka, topic, count):
    """Every record of `topic` the Java SDK or the Python SDK refuses: {(sdk, offset): error}."""
    refused = {}
    for r in read_with_java_sdk(kafka.bootstrap, topic, count):
        if "error" in r:
            refused[("java", r["offset"])] = r["error"]
    for record in read_topic(kafka.bootstrap, topic, count):
        try:
            from_binary(KafkaMessage(headers=dict(record.raw_headers), key=record.key, value=record.value))
        except Exception as e:  # any refusal of the SDK, whatever its class
            refused[("python", record.offset)] = repr(e)
    return refused


# Sources the Java SDK's java.net.URI must parse if enqueue accepts them: percent-encoding edge
# cases, IPv6 forms (IPvFuture and zone ids are refused by java.net.URI), empty authorities,
# non-ASCII lookalikes, ports at the int limit with a reg-name host (java.net.URI falls back to a
# registry-based authority there), a long source.
HELD_SOURCES = [
    "/a%", "/a%4", "/a%4g", "/a%%41", "%41:b", "/a%C3%BC", "urn:%00", "urn:%FF",
    "http://[v1.x]/", "http://[fe80::1%25eth0]/", "http://[fe80::1%eth0]/", "http://[::1.2.3.4]/",
    "http://[::ffff:1.2.3.4]:80/", "http://[1:2:3:4:5:6:7:8:9]/", "http://[]/", "http://[::1]x/",
    "http://", "http:///x", "///x", "//?q", "//#f", "//@h", "//h:", "//u@h@i",
    "http://h:2147483648/", "http://1.2.3.4:99999999999999999999/",
    "urn:bücher", "urn:ｂ", "urn:a\u00a0b", "urn:a\u200bb", "/a\\b", "/a|b", "/a^b", "/a`b", "/a{b}", "/a<b>",
    "a:#f", ":a", "-a:b", "a:b#c#d", "urn:" + "a" * 4000,
]
HELD_TYPES = ["t\u2028x", "t\ufffe", "t\ufdd0", "t\u00adx", "t\u202ex", "\u0085", " ", "t" * 4000]
# Header names an SDK could read as an attribute: every case of ce_*, content-type, lookalikes.
HELD_HEADERS = ['{"Ce_Source": "urn:x"}', '{"cE_iD": "x"}', '{"CONTENT-TYPE": "text/xml"}', '{"CE_": "x"}',
                '{"ce_id": "a", "CE_ID": "b"}', '{"x": "1", "x": "2"}', '{"ce-source": "urn:x"}',
                '{"ce\u005fid": "x"}', '{"\u0441e_id": "x"}', '{"ce_\u0130d": "x"}', '{"Content-Type ": "x"}']


def test_enqueue_as_an_application_role_publishes_nothing_an_sdk_refuses(kafka, make_relay):
    """Role with EXECUTE on enqueue only: every source, type and header name is either refused
    with a clear error, or published as a record both SDKs read."""
    pg = make_relay(kafka.bootstrap)
    pg.wait_workers_running(1)
    create_enqueuer(pg, "app")
    outcomes = {("source", s): enqueue_as(pg, "app", "atk.enqueue", event_source=s) for s in HELD_SOURCES}
    outcomes.update({("type", t): enqueue_as(pg, "app", "atk.enqueue", event_type=t) for t in HELD_TYPES})
    outcomes.update({("headers", h): enqueue_as(pg, "app", "atk.enqueue", headers=h) for h in HELD_HEADERS})
    # Refusals are 22023 (a bad attribute, an envelope header) or 54000 (too long), never another error.
    refused = {what: code for what, code in outcomes.items() if len(code) == 5}
    assert set(refused.values()) <= {"22023", "54000"}, refused
    accepted = {what: e for what, e in outcomes.items() if len(e) != 5}
    states = settled(pg, accepted.values())
    # enqueue's checks and the relay's are the same: nothing it accepted is quarantined.
    assert {what: states[e] for what, e in accepted.items() if states[e][0] != "published"} == {}
    assert sdk_refusals(kafka, "atk.enqueue", len(accepted)) == {}


def test_hand_written_rows_publish_nothing_an_sdk_refuses(kafka, make_relay):
    """Role with INSERT on outbox.events: odd created_at values (BC, years past 9999, infinities,
    an offset that moves year 1 into year 0 in UTC), sources, types and header names. Each row is
    refused by the CHECK, quarantined, or published as a record both SDKs read; the worker lives.
    (The record's timestamp is the publish time: the broker refuses one more than
    log.message.timestamp.after.max.ms ahead, whatever ce_time says.)"""
    pg = make_relay(kafka.bootstrap, message_timestamp="publish")
    pg.wait_workers_running(1)
    pid = worker_pid(pg)
    create_hand_writer(pg, "writer")
    json_type = "application/json"
    rows = {}
    for t in ["0001-01-01 00:00:00+00", "0001-01-01 00:00:00+14", "0001-01-01 00:00:00 BC", "4713-01-01 00:00:00 BC",
              "9999-12-31 23:59:59.999999+00", "9999-12-31 23:59:59.999999-12", "10000-01-01 00:00:00+00",
              "294276-12-31 23:59:59+00", "infinity", "-infinity", "1969-12-31 23:59:59.999999+00",
              "2026-06-30 23:59:60+00", "2026-03-29 02:30:00 Europe/Berlin", "2026-01-01 00:00:00+15:59:59"]:
        rows[("created_at", t)] = write_as(pg, "writer", "atk.hand", f"k-{len(rows)}", created_at=t,
                                           ce_content_type=json_type)
    for s in HELD_SOURCES:
        rows[("source", s)] = write_as(pg, "writer", "atk.hand", f"k-{len(rows)}", ce_content_type=json_type,
                                       ce_source=s)
    for t in HELD_TYPES:
        rows[("type", t)] = write_as(pg, "writer", "atk.hand", f"k-{len(rows)}", ce_content_type=json_type, ce_type=t)
    for h in HELD_HEADERS:
        rows[("headers", h)] = write_as(pg, "writer", "atk.hand", f"k-{len(rows)}", headers=h,
                                        ce_content_type=json_type)
    for ct in ["application/json;", "text/plain; charset=\"a\\\"b\"", "a/b; c=\"\u00e9\"", "a/b ; c=d", "*/*",
               "a/b\t;c=d", "x/y; a=b; a=c"]:
        rows[("content type", ct)] = write_as(pg, "writer", "atk.hand", f"k-{len(rows)}", ce_content_type=ct)
    written = {what: e for what, e in rows.items() if len(e) != 5}
    states = settled(pg, written.values())
    published = [e for e in written.values() if states[e][0] == "published"]
    quarantined = {what: states[e] for what, e in written.items() if states[e][0] != "published"}
    assert {what: (s, err) for what, (s, err) in quarantined.items()
            if s != "failed" or not err.startswith("quarantined: ")} == {}
    assert sdk_refusals(kafka, "atk.hand", len(published)) == {}
    assert worker_pid(pg) == pid


def test_a_bad_source_in_postgresql_conf_is_refused_at_reload_and_at_start(kafka, make_relay):
    """The file path of outbox.cloudevents_source, which no SQL check sees: at a reload the check
    hook logs the bad value and keeps the old one; at a start the value is dropped with a
    WARNING. Events published after either carry a source both SDKs read."""
    pg = make_relay(kafka.bootstrap, cloudevents_source="urn:outbox:good")
    pg.wait_workers_running(1)
    create_enqueuer(pg, "app")
    with open(os.path.join(pg.datadir, "postgresql.conf"), "a") as f:
        f.write("outbox.cloudevents_source = 'https://billing.example.com/out box'\n")
    pg.reload()
    wait_until(lambda: 'invalid value for parameter "outbox.cloudevents_source"' in pg.log(), 30, "the reload's LOG")
    assert pg.value("SHOW outbox.cloudevents_source") == "urn:outbox:good"
    after_reload = enqueue_as(pg, "app", "atk.conf")
    pg.restart()
    pg.wait_workers_running(1)
    after_start = enqueue_as(pg, "app", "atk.conf")
    states = settled(pg, [after_reload, after_start])
    assert {e: s for e, (s, _) in states.items()} == dict.fromkeys([after_reload, after_start], "published")
    assert sdk_refusals(kafka, "atk.conf", 2) == {}


def test_enqueue_source_ipv6_host_with_port_beyond_int(kafka, make_relay):
    pg = make_relay(kafka.bootstrap)
    pg.wait_workers_running(1)
    create_enqueuer(pg, "app")
    outcome = enqueue_as(pg, "app", "atk.ipv6-port", event_source="https://[::1]:2147483648/invoices")
    if outcome == "22023":
        return  # held: refused at enqueue
    assert settled(pg, [outcome])[outcome][0] == "published"
    assert sdk_refusals(kafka, "atk.ipv6-port", 1) == {}


def test_setting_source_ipv6_host_with_port_beyond_int(kafka, make_relay):
    """A role allowed ALTER SYSTEM on outbox.cloudevents_source only (PostgreSQL 15's GRANT ALTER
    SYSTEM ON PARAMETER): the setting it can give every event must be one the SDKs read."""
    pg = make_relay(kafka.bootstrap)
    pg.wait_workers_running(1)
    create_enqueuer(pg, "app")
    pg.sql("CREATE ROLE source_admin LOGIN; GRANT ALTER SYSTEM ON PARAMETER outbox.cloudevents_source TO source_admin")
    try:
        with psycopg.connect(host=pg.tmp, port=pg.port, user="source_admin", dbname=pg.database,
                             autocommit=True) as c:
            c.execute("ALTER SYSTEM SET outbox.cloudevents_source = 'https://[::1]:2147483648/outbox'")
    except psycopg.errors.InvalidParameterValue:
        return  # held: refused at SET
    pg.restart()  # the relay has the new setting for sure (a reload reaches the worker at its own pace)
    pg.wait_workers_running(1)
    event_id = enqueue_as(pg, "app", "atk.setting")
    assert settled(pg, [event_id])[event_id][0] == "published"
    assert sdk_refusals(kafka, "atk.setting", 1) == {}


def test_hand_written_structured_mode_content_type(kafka, make_relay):
    pg = make_relay(kafka.bootstrap)
    pg.wait_workers_running(1)
    create_hand_writer(pg, "writer")
    rows = [write_as(pg, "writer", "atk.structured", f"k-{i}", ce_content_type=ct)
            for i, ct in enumerate(["application/cloudevents+json", "application/cloudevents-batch+json; charset=utf-8"])]
    states = settled(pg, [e for e in rows if len(e) != 5])
    published = [e for e, (s, _) in states.items() if s == "published"]
    assert sdk_refusals(kafka, "atk.structured", len(published)) == {}
