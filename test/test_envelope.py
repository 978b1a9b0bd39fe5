"""Envelopes (docs/envelopes.md): CloudEvents read back from a real broker with
the CloudEvents SDKs for Python and Java, W3C trace context headers, explicit partitions, the
record's timestamp; a partition the topic lacks on the mock cluster."""

import base64
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from cloudevents.kafka import KafkaMessage, from_binary
from confluent_kafka import TIMESTAMP_CREATE_TIME

from harness.cloudevents_java import read_with_java_sdk
from harness.kafka_broker import KafkaBroker
from harness.kafka_reader import read_topic
from harness.wait import wait_until

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
OTHER_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
SOURCE = "https://billing.example.com/outbox"


@pytest.fixture(scope="module")
def kafka():
    with KafkaBroker() as kb:
        for topic in ("env.ce.invoices", "env.plain", "env.trace", "env.partition", "env.time-commit",
                      "env.time-publish", "env.java.events", "env.java.setting"):
            kb.create_topic(topic, partitions=3)
        yield kb


def by_event_id(records):
    return {r.event_id: r for r in records}


def cloudevent(record, data_unmarshaller=None):
    """The record as the SDK reads a binary-mode CloudEvent."""
    message = KafkaMessage(headers=dict(record.raw_headers), key=record.key, value=record.value)
    return from_binary(message, data_unmarshaller=data_unmarshaller)


def created_at(pg, event_id):
    return pg.value("SELECT created_at FROM outbox.events WHERE event_id = %s", (event_id,))


def test_cloudevents_binary_mode_read_back_with_the_sdk(kafka, make_relay):
    pg = make_relay(kafka.bootstrap, cloudevents_topics="env.ce.*", cloudevents_source=SOURCE)
    pg.wait_workers_running(1)
    with pg.connect(autocommit=False) as c:
        def enqueue(sql, params):
            return c.execute(f"SELECT outbox.enqueue({sql})::text", params).fetchone()[0]
        # Per topic (outbox.cloudevents_topics): ce_type is the topic, ce_source the setting.
        by_topic = enqueue("'env.ce.invoices', 'sub-1', %s::jsonb, '{\"tenant\": \"acme\"}'",
                           ('{"invoice": 42, "status": "paid"}',))
        # Per event, on a topic that is not listed, with its own type and source.
        per_event = enqueue("'env.plain', 'sub-1', %s::jsonb, cloudevents => true, event_type => 'invoice.paid', "
                            "event_source => 'urn:billing:invoices'", ('{"invoice": 43}',))
        text_event = enqueue("'env.ce.invoices', 'sub-2', 'hello'::text", ())
        bytes_event = enqueue("'env.ce.invoices', 'sub-3', '\\x00ff10'::bytea", ())
        # Opted out on a listed topic, and a plain event: no envelope.
        opted_out = enqueue("'env.ce.invoices', 'sub-4', '{}'::jsonb, cloudevents => false", ())
        plain = enqueue("'env.plain', 'sub-5', '{}'::jsonb", ())
        c.commit()
    pg.wait_published(6, timeout=120)
    records = by_event_id(read_topic(kafka.bootstrap, "env.ce.invoices", 4)
                          + read_topic(kafka.bootstrap, "env.plain", 2))

    def check(event_id, type_, source, content_type, data, unmarshaller=None, own_headers=None):
        record = records[event_id]
        ce = cloudevent(record, unmarshaller)
        attributes = dict(ce.get_attributes())
        # ce_time is the event's created_at (its enqueuing transaction's start), in RFC 3339 UTC.
        time = created_at(pg, event_id).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert attributes == {"specversion": "1.0", "id": event_id, "source": source, "type": type_,
                              "time": time, "datacontenttype": content_type, "partitionkey": record.key}
        assert ce.get_data() == data
        # Besides the envelope, the record keeps the event_id header and the event's own headers.
        others = {k: v for k, v in record.headers.items() if not k.startswith("ce_") and k != "content-type"}
        assert others == {"event_id": event_id, **(own_headers or {})}

    check(by_topic, "env.ce.invoices", SOURCE, "application/json", {"invoice": 42, "status": "paid"},
          own_headers={"tenant": "acme"})
    check(per_event, "invoice.paid", "urn:billing:invoices", "application/json", {"invoice": 43})
    identity = lambda value: value  # noqa: E731
    check(text_event, "env.ce.invoices", SOURCE, "text/plain; charset=utf-8", b"hello", identity)
    check(bytes_event, "env.ce.invoices", SOURCE, "application/octet-stream", b"\x00\xff\x10", identity)
    for eid in (opted_out, plain):
        assert records[eid].headers == {"event_id": eid}


def test_trace_context_header_is_what_the_session_set(kafka, make_relay):
    pg = make_relay(kafka.bootstrap)
    pg.wait_workers_running(1)
    with pg.connect(autocommit=False) as c:
        # What an application's OpenTelemetry instrumentation does once per transaction.
        c.execute("SELECT set_config('outbox.traceparent', %s, true), set_config('outbox.tracestate', %s, true)",
                  (TRACEPARENT, TRACESTATE))
        from_session = [c.execute("SELECT outbox.enqueue('env.trace', %s, '{}'::jsonb, '{\"h\": \"v\"}')::text",
                                  (f"k{i}",)).fetchone()[0] for i in range(3)]
        from_argument = c.execute("SELECT outbox.enqueue('env.trace', 'k0', '{}'::jsonb, traceparent => %s)::text",
                                  (OTHER_TRACEPARENT,)).fetchone()[0]
        c.commit()
        # The next transaction has none.
        untraced = c.execute("SELECT outbox.enqueue('env.trace', 'k1', '{}'::jsonb)::text").fetchone()[0]
        c.commit()
    pg.wait_published(5, timeout=120)
    records = by_event_id(read_topic(kafka.bootstrap, "env.trace", 5))
    for eid in from_session:
        assert records[eid].headers == {"event_id": eid, "h": "v", "traceparent": TRACEPARENT,
                                        "tracestate": TRACESTATE}
    assert records[from_argument].headers == {"event_id": from_argument, "traceparent": OTHER_TRACEPARENT}
    assert records[untraced].headers == {"event_id": untraced}


def test_explicit_partition_places_the_event(kafka, make_relay):
    pg = make_relay(kafka.bootstrap)
    pg.wait_workers_running(1)
    with pg.connect(autocommit=False) as c:
        placed = {c.execute("SELECT outbox.enqueue('env.partition', %s, '{}'::jsonb, partition => %s)::text",
                            (f"placed-{i}", i % 3)).fetchone()[0]: i % 3 for i in range(9)}
        c.commit()
    pg.wait_published(len(placed), timeout=120)
    records = by_event_id(read_topic(kafka.bootstrap, "env.partition", len(placed)))
    for eid, partition in placed.items():
        assert records[eid].partition == partition
    recorded = dict(pg.sql("SELECT event_id::text, kafka_partition FROM outbox.events WHERE key LIKE 'placed-%'"))
    assert recorded == placed


def hand_written_event(pg, topic, key, age):
    """A row written by hand (docs/sql-api.md "The table") whose created_at lies `age` in the past."""
    return pg.value("INSERT INTO outbox.events (event_id, topic, key, lane, payload, created_at) "
                    "SELECT id, %s, %s, outbox.lane_of(%s, id), convert_to('{}', 'UTF8'), now() - %s "
                    "FROM gen_random_uuid() id RETURNING event_id::text", (topic, key, key, age))


@pytest.mark.parametrize("mode", ["commit", "publish"])
def test_record_timestamp_follows_outbox_message_timestamp(kafka, make_relay, mode):
    pg = make_relay(kafka.bootstrap, message_timestamp=mode)
    pg.wait_workers_running(1)
    topic = f"env.time-{mode}"
    # An hour old: the publish time cannot be mistaken for it.
    eid = hand_written_event(pg, topic, "k", timedelta(hours=1))
    enqueued_at = created_at(pg, eid)
    pg.wait_published(1, timeout=120)
    published_at = pg.value("SELECT published_at FROM outbox.events WHERE event_id = %s", (eid,))
    (record,) = read_topic(kafka.bootstrap, topic, 1)
    kind, ms = record.timestamp
    assert kind == TIMESTAMP_CREATE_TIME
    stamped = datetime.fromtimestamp(ms / 1000, timezone.utc)
    if mode == "commit":
        assert ms == (enqueued_at - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)
    else:
        # Handed to the producer after the claim, acknowledged before published_at.
        assert enqueued_at + timedelta(minutes=30) < stamped <= published_at


def test_partition_the_topic_lacks_fails_at_once_and_holds_its_key(mock_cluster, make_relay):
    # max_attempts 10 and a 1 s base backoff: failing after attempts would take over 8 minutes.
    pg = make_relay(mock_cluster.bootstrap, max_attempts=10, backoff_base="1s")
    pg.wait_workers_running(1)
    with pg.connect(autocommit=False) as c:
        bad = c.execute("SELECT outbox.enqueue('billing', 'k', 'x'::text, partition => 4)::text").fetchone()[0]
        behind = c.execute("SELECT outbox.enqueue('billing', 'k', 'y'::text)::text").fetchone()[0]
        good = c.execute("SELECT outbox.enqueue('billing', 'other', 'z'::text, partition => 3)::text").fetchone()[0]
        c.commit()

    def status(eid):
        return pg.sql("SELECT status, attempts, last_error, kafka_partition FROM outbox.events WHERE event_id = %s",
                      (eid,))[0]

    wait_until(lambda: status(bad)[0] == "failed" and status(good)[0] == "published", 30,
               "the bad partition failed and the good one published")
    state, attempts, last_error, _ = status(bad)
    assert attempts == 0
    assert last_error.startswith("partition 4 does not exist in the event's topic") and "UNKNOWN_PARTITION" in last_error
    assert status(good)[3] == 3
    # on_failed_event = block_key: the key's next event waits behind the failed one.
    assert status(behind)[0] == "pending"
    assert pg.value("SELECT count(*) FROM outbox.failed WHERE event_id = %s", (bad,)) == 1


def test_the_default_source_is_fixed_at_enqueue(mock_cluster, make_relay):
    """outbox.cloudevents_source changes between enqueue and publish: the event keeps the source
    it was enqueued with (its (source, id) is what consumers deduplicate on, and what enqueue
    sized against outbox.max_payload_bytes). Only a row written by hand without a ce_source gets
    the relay's setting at publish time."""
    from test_safety import insert_row
    pg = make_relay(mock_cluster.bootstrap, workers=0, cloudevents_source="urn:outbox:before")
    enqueued = pg.value("SELECT outbox.enqueue('billing', 'k1', '{}'::jsonb, cloudevents => true)::text")
    assert pg.value("SELECT ce_source FROM outbox.events WHERE event_id = %s", (enqueued,)) == "urn:outbox:before"
    _, by_hand = insert_row(pg, key="k2", ce_content_type="application/json")
    pg.set(cloudevents_source="urn:outbox:after", workers=1)
    pg.restart()  # the relay starts with the new setting for sure
    pg.wait_workers_running(1)
    pg.wait_published(2, timeout=60)
    records = by_event_id(read_topic(mock_cluster.bootstrap, "billing", 2, settle=True))
    assert {e: records[e].headers["ce_source"] for e in (enqueued, by_hand)} == {
        enqueued: "urn:outbox:before", by_hand: "urn:outbox:after"}


@pytest.mark.schema("0.3.0")  # rows written past the checks into 0.3.0's table
def test_hand_written_cloudevent_rows_the_envelope_cannot_state_are_quarantined(mock_cluster, make_relay):
    """Rows past the table's checks (dropped by the owner): an empty attribute, a header of their
    own named ce_*/content-type (a second, conflicting ce_id on the record), a created_at that
    ce_time cannot write in RFC 3339. Each goes to failed with a reason, never to Kafka malformed;
    the others publish and the worker does not restart."""
    from test_safety import drop_row_checks, insert_row, worker_pid
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    drop_row_checks(pg)
    pid = worker_pid(pg)
    json_type = "application/json"
    bad = {
        "forged ce_id": insert_row(pg, key="a", headers='{"ce_id": "forged"}', ce_content_type=json_type),
        "own content-type": insert_row(pg, key="b", headers='{"content-type": "x/y"}', ce_content_type=json_type),
        "empty type": insert_row(pg, key="c", ce_content_type=json_type, ce_type=""),
        "empty source": insert_row(pg, key="d", ce_content_type=json_type, ce_source=""),
        "empty content type": insert_row(pg, key="e", ce_content_type=""),
        "infinity": insert_row(pg, key="f", ce_content_type=json_type, created_at="infinity"),
        "year 20000": insert_row(pg, key="g", ce_content_type=json_type, created_at="20000-01-01 00:00+00"),
        "BC": insert_row(pg, key="h", ce_content_type=json_type, created_at="0044-03-15 00:00+00 BC"),
    }
    good = {
        "year 9999": insert_row(pg, key="i", ce_content_type=json_type, created_at="9999-12-31 23:59:59.999999+00"),
        "year 1": insert_row(pg, key="j", ce_content_type=json_type, created_at="0001-01-01 00:00+00"),
        "plain, infinite": insert_row(pg, key="k", created_at="infinity"),
    }

    def status(row):
        return pg.sql("SELECT status, last_error FROM outbox.events WHERE id = %s", (row[0],))[0]

    wait_until(lambda: all(status(r)[0] != "pending" for r in [*bad.values(), *good.values()]), 60, "all settled")
    for what, row in bad.items():
        state, reason = status(row)
        assert state == "failed" and reason.startswith("quarantined: "), (what, state, reason)
    assert {what: status(row)[0] for what, row in good.items()} == dict.fromkeys(good, "published")
    records = by_event_id(read_topic(mock_cluster.bootstrap, "billing", len(good), settle=True))
    assert set(records) == {row[1] for row in good.values()}
    ce_times = {what: dict(records[row[1]].raw_headers).get("ce_time") for what, row in good.items()}
    assert ce_times == {"year 9999": b"9999-12-31T23:59:59.999999Z", "year 1": b"0001-01-01T00:00:00.000000Z",
                        "plain, infinite": None}
    assert records[good["plain, infinite"][1]].timestamp[1] > 0  # the producer's clock
    assert worker_pid(pg) == pid


# Every character class a database name may hold that a URI path segment cannot: a space, '/',
# '%', '#', '?', a non-ASCII letter.
ODD_DATABASE = "billing eu/ü%#?"
ODD_DATABASE_SOURCE = "/outbox/billing%20eu%2F%C3%BC%25%23%3F"
SETTING_SOURCE = "https://billing.example.com/outbox?region=eu#relay"
NON_ASCII_TYPE = "rechnung.bezahlt.\u00fc.\u20ac.\U0001f600"


def test_the_java_sdk_reads_every_attribute_the_relay_writes(kafka, make_relay):
    """A Java consumer with the CloudEvents Java SDK's CloudEventDeserializer (Maven Central),
    on the real broker: the default source of a database whose name needs percent-encoding, a
    source per event and per setting, every payload kind and a tombstone. The SDK parses
    ce_source with java.net.URI and refuses the whole record if it fails, so one bad source
    would stop a Java consumer at that offset. A plain record on the same topic is refused by
    that deserializer (README: keep CloudEvents and plain records on separate topics)."""
    pg = make_relay(kafka.bootstrap, database=ODD_DATABASE, cloudevents_topics="env.java.*")
    with_setting = make_relay(kafka.bootstrap, cloudevents_topics="env.java.*", cloudevents_source=SETTING_SOURCE)
    pg.wait_workers_running(1)
    with_setting.wait_workers_running(1)
    with pg.connect(autocommit=False) as c:
        def enqueue(sql, params=()):
            return c.execute(f"SELECT outbox.enqueue({sql})::text", params).fetchone()[0]
        expected = {
            enqueue("'env.java.events', 'sub-1', %s::jsonb, '{\"tenant\": \"acme\"}', traceparent => %s",
                    ('{"invoice": 42}', TRACEPARENT)): ("env.java.events", ODD_DATABASE_SOURCE, "application/json"),
            enqueue("'env.java.events', 'sub-2', 'hello'::text, event_type => 'invoice.paid', "
                    "event_source => 'urn:billing:invoices'"): ("invoice.paid", "urn:billing:invoices",
                                                                "text/plain; charset=utf-8"),
            enqueue("'env.java.events', 'sub-3', '\\x00ff10'::bytea, event_source => %s",
                    ("https://user@[::1]:8443/a%20b?x=1",)): ("env.java.events", "https://user@[::1]:8443/a%20b?x=1",
                                                            "application/octet-stream"),
        }
        # Beyond ASCII (Latin-1, the BMP, a surrogate pair in Java's UTF-16): read back exactly,
        # whatever the locale the consumer runs in (the harness runs it under LC_ALL=C).
        expected[enqueue("'env.java.events', 'sub-6', '{}'::jsonb, event_type => %s", (NON_ASCII_TYPE,))] = (
            NON_ASCII_TYPE, ODD_DATABASE_SOURCE, "application/json")
        tombstone = enqueue("'env.java.events', 'sub-1', NULL::jsonb")
        plain = enqueue("'env.java.events', 'sub-4', '{}'::jsonb, cloudevents => false")
        c.commit()
    by_setting = with_setting.value("SELECT outbox.enqueue('env.java.setting', 'sub-5', '{\"a\": 1}'::jsonb)::text")
    pg.wait_published(len(expected) + 2, timeout=120)
    with_setting.wait_published(1, timeout=120)

    def position(event_id):
        return pg.sql("SELECT kafka_partition, kafka_offset FROM outbox.events WHERE event_id = %s", (event_id,))[0]

    read = read_with_java_sdk(kafka.bootstrap, "env.java.events", len(expected) + 2)
    by_position = {(r["partition"], r["offset"]): r for r in read}
    # The plain record is refused by the deserializer; a tombstone comes as a null value, no event.
    assert set(by_position[position(plain)]) == {"partition", "offset", "error"}
    assert by_position.pop(position(plain))["error"].startswith("io.cloudevents.rw.CloudEventRWException")
    assert by_position.pop(position(tombstone)) == {**dict(zip(("partition", "offset"), position(tombstone))),
                                                   "key": "sub-1", "cloudevent": None}
    # No CloudEvent is refused (a ce_source java.net.URI cannot parse would be).
    assert {at: r["error"] for at, r in by_position.items() if "error" in r} == {}
    events = {r["id"]: r for r in by_position.values()}
    assert set(events) == set(expected)
    (setting_event,) = read_with_java_sdk(kafka.bootstrap, "env.java.setting", 1)

    def check(cluster, ce, type_, source, content_type):
        event_id = ce["id"]
        key, payload, created, partition, offset = cluster.sql(
            "SELECT key, payload, created_at, kafka_partition, kafka_offset FROM outbox.events WHERE event_id = %s",
            (event_id,))[0]
        assert datetime.fromisoformat(ce.pop("time")) == created
        data = ce.pop("data")
        assert (base64.b64decode(data) if data is not None else None) == (bytes(payload) if payload else None)
        # The key is the record's key; the Java SDK exposes no partitionkey extension, and the
        # traceparent header (not ce_traceparent) is no extension either: no extensions at all.
        assert ce == {"partition": partition, "offset": offset, "key": key, "specversion": "1.0", "id": event_id,
                      "source": source, "type": type_, "datacontenttype": content_type, "dataschema": None,
                      "subject": None, "extensions": {}}

    for event_id, attributes in expected.items():
        check(pg, events[event_id], *attributes)
    check(with_setting, setting_event, "env.java.setting", SETTING_SOURCE, "application/json")


def create_hand_writer(pg, role):
    """A role with only what writing rows by hand takes (docs/sql-api.md "The table")."""
    pg.sql(f"CREATE ROLE {role} LOGIN")
    pg.sql(f"GRANT USAGE ON SCHEMA outbox TO {role}; GRANT INSERT ON outbox.events TO {role}; "
           f"GRANT EXECUTE ON FUNCTION outbox.events_row_check TO {role}")


def test_hand_written_cloudevent_rows_with_attributes_the_sdks_refuse_are_quarantined(mock_cluster, make_relay):
    """Rows a role with INSERT on outbox.events writes, past the table's CHECK (which does not
    look into the attributes' syntax): a ce_source that is not a URI-reference, a ce_type with a
    control character, a ce_content_type that is not a media type, a header of its own naming an
    attribute in another case (the Python SDK lowercases header names, the Java SDK the name
    after "ce_"). Each is quarantined, never published; the valid ones publish."""
    from test_safety import lane_of, worker_pid
    pg = make_relay(mock_cluster.bootstrap)
    pg.wait_workers_running(1)
    pid = worker_pid(pg)
    create_hand_writer(pg, "hand_writer")
    json_type = "application/json"

    def row(key, headers=None, **columns):
        event_id = str(uuid.uuid4())
        names = ["event_id", "topic", "key", "lane", "payload", "headers", *columns]
        with psycopg.connect(host=pg.tmp, port=pg.port, user="hand_writer", dbname=pg.database) as c:
            c.execute(f"INSERT INTO outbox.events ({', '.join(names)}) VALUES (%s, 'billing', %s, %s, %s, "
                      f"%s::jsonb{', %s' * len(columns)})",
                      [event_id, key, lane_of(key, event_id), b"{}", headers, *columns.values()])
        return event_id

    bad = {
        "source not a uri": row("a", ce_content_type=json_type, ce_source="not a uri"),
        "source with a space": row("b", ce_content_type=json_type, ce_source="/outbox/billing eu"),
        "source bad IPv6": row("c", ce_content_type=json_type, ce_source="https://[zz]/x"),
        "source scheme only": row("d", ce_content_type=json_type, ce_source="urn:"),
        "source bad escape": row("e", ce_content_type=json_type, ce_source="/a%zz"),
        "type with a newline": row("f", ce_content_type=json_type, ce_type="invoice\npaid"),
        "type with C1 control": row("g", ce_content_type=json_type, ce_type="invoice\u0085paid"),
        "content type without subtype": row("h", ce_content_type="json"),
        "content type bad parameter": row("i", ce_content_type="text/plain; charset"),
        "content type with a space": row("j", ce_content_type="text/plain utf-8"),
        "header CE_ID": row("k", headers='{"CE_ID": "forged"}', ce_content_type=json_type),
        "header Ce_Source": row("l", headers='{"Ce_Source": "urn:forged"}', ce_content_type=json_type),
        "header Content-Type": row("m", headers='{"Content-Type": "text/xml"}', ce_content_type=json_type),
        # Structured content mode's media types, in any case: the Java SDK would read the record
        # as structured mode (and refuse it, or read an event forged in the payload).
        "structured mode content type": row("s", ce_content_type='application/cloudevents+json; charset="utf-8"'),
        "structured batch, other case": row("t", ce_content_type="Application/CloudEvents-Batch+JSON"),
        "source port above 65535": row("u", ce_content_type=json_type, ce_source="https://h:65536/x"),
        "IPv6 source port beyond int": row("v", ce_content_type=json_type, ce_source="https://[::1]:2147483648/x"),
    }
    good = {
        "urn source": row("n", ce_content_type=json_type, ce_source="urn:billing:invoices"),
        "encoded source": row("o", ce_content_type=json_type, ce_source="/outbox/billing%20eu"),
        "parameters": row("p", ce_content_type='application/vnd.billing+json; charset="utf-8"; x=1'),
        "port 65535, leading zeros": row("w", ce_content_type=json_type, ce_source="https://[::1]:0065535/x"),
        "non-ASCII type": row("q", ce_content_type=json_type, ce_type="rechnung.bezahlt.ü"),
        "plain record, upper-case header": row("r", headers='{"CE_ID": "not a CloudEvent"}'),
    }

    def status(event_id):
        return pg.sql("SELECT status, last_error FROM outbox.events WHERE event_id = %s", (event_id,))[0]

    everything = [*bad.values(), *good.values()]
    wait_until(lambda: all(status(e)[0] != "pending" for e in everything), 60, "all settled")
    for what, event_id in bad.items():
        state, reason = status(event_id)
        assert state == "failed" and reason.startswith("quarantined: "), (what, state, reason)
    assert {what: status(e)[0] for what, e in good.items()} == dict.fromkeys(good, "published")
    records = by_event_id(read_topic(mock_cluster.bootstrap, "billing", len(good), settle=True))
    assert set(records) == set(good.values())
    assert worker_pid(pg) == pid
