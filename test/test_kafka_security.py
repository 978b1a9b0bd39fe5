"""TLS, SASL/SCRAM-SHA-512, mutual TLS and compression against a real Apache Kafka broker.

One broker for the module (KafkaBroker(secure=True)): a throwaway CA made with openssl, a
broker certificate for localhost/127.0.0.1, SCRAM users made by the broker's own
`kafka-storage format --add-scram`, and four listeners: SCRAM (SASL_SSL), MTLS (SSL with
ssl.client.auth=required), EXPIRED (SASL_SSL with an expired certificate) and PLAINTEXT.
It runs Kafka 4.1.1 when the relay's librdkafka (the one the installed extension loads, see
harness/librdkafka.py; test/run's second pass builds it against 2.8.0) is 2.6.1 or later, and
Kafka 3.9 otherwise: librdkafka before 2.6.1 (Debian 12 has 2.0.2) cannot log in to Kafka 4.x
with SCRAM (librdkafka#4895); test_scram_against_kafka_4_says_why_it_fails shows what the
relay reports then.

Each test sweeps everywhere a secret could leak (the server log, outbox.workers, pg_settings,
SHOW and current_setting as a non-superuser, pg_stat_activity, the error texts it got).
"""

import os
import re
import subprocess
import uuid

import psycopg
import pytest
from confluent_kafka import libversion

from harness.kafka_broker import KafkaBroker
from harness.kafka_reader import read_topic
from harness.librdkafka import SCRAM_ON_KAFKA_4, extension_librdkafka, relay_scrams_on_kafka_4
from harness.tls_certs import ThrowawayCa
from harness.wait import wait_until

RELAY_USER = "outbox-relay"
RELAY_PASSWORD = "Tq8-relay-scram-secret-4f1c"     # the right one
WRONG_PASSWORD = "Wx3-not-the-relay-password-9d2e"
KEY_PASSWORD = "Kp5-client-key-passphrase-7b3a"    # of the relay's private key (mutual TLS)
SECRETS = (RELAY_PASSWORD, WRONG_PASSWORD, KEY_PASSWORD)
TOPIC = "billing.secure"


@pytest.fixture(scope="module")
def broker():
    release = "4.1" if relay_scrams_on_kafka_4() else "3.9"
    with KafkaBroker(secure=True, scram_users={RELAY_USER: RELAY_PASSWORD}, release=release) as kb:
        kb.create_topic(TOPIC, partitions=3)
        yield kb


@pytest.fixture
def secrets_dir(tmp_path):
    os.chmod(tmp_path, 0o700)
    return tmp_path


def properties_file(directory, lines, name="kafka.secret.properties"):
    """outbox.kafka_properties_file: only its owner may read it (the worker refuses it else)."""
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("# librdkafka secrets of the relay\n" + "".join(f"{line}\n" for line in lines))
    os.chmod(path, 0o600)
    return path


def scram_properties(ca_pem):
    """What goes in outbox.kafka_properties for SASL_SSL: nothing secret."""
    return (f"security.protocol=SASL_SSL;sasl.mechanism=SCRAM-SHA-512;sasl.username={RELAY_USER};"
            f"ssl.ca.location={ca_pem}")


def scram_relay(make_relay, broker, secrets_dir, password=RELAY_PASSWORD, listener="SCRAM", ca_pem=None,
                bootstrap=None, **settings):
    pg = make_relay(bootstrap or broker.secure_bootstrap[listener],
                    kafka_properties=scram_properties(ca_pem or broker.ca.cert_pem),
                    kafka_properties_file=properties_file(secrets_dir, [f"sasl.password={password}"]),
                    **settings)
    pg.wait_workers_running(1)
    return pg


def read_back(broker, count):
    """What a real consumer reads of TOPIC: over the SCRAM listener as the relay's user where the
    tests' own librdkafka (Debian's, in confluent_kafka) can log in there, else over PLAINTEXT."""
    if broker.release == "4.1" and libversion()[1] < SCRAM_ON_KAFKA_4:
        return read_topic(broker.bootstrap, TOPIC, count)
    return read_topic(broker.secure_bootstrap["SCRAM"], TOPIC, count, config=reader_config(broker))


def reader_config(broker):
    """A real consumer over the SCRAM listener, as the relay's user."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": RELAY_USER,
            "sasl.password": RELAY_PASSWORD, "ssl.ca.location": broker.ca.cert_pem}


def enqueue(pg, n, topic=TOPIC, prefix="inv"):
    ids = []
    for i in range(n):
        ids.append(pg.value("SELECT outbox.enqueue(%s, %s, jsonb_build_object('invoice', %s::text))::text",
                            (topic, f"sub-{i % 3}", f"{prefix}-{i}")))
    return ids


def worker(pg):
    row = pg.sql("SELECT pid, state, last_error, last_error_at, published FROM outbox.workers WHERE worker = 0")[0]
    return dict(zip(("pid", "state", "last_error", "last_error_at", "published"), row))


# -- where a secret could show ----------------------------------------------------------------

def connect_as(pg, user):
    return psycopg.connect(host=pg.tmp, port=pg.port, user=user, dbname=pg.database, autocommit=True)


def create_hostile_roles(pg):
    """mallory: a login with the monitoring rights of docs/privileges.md; watcher: the same
    plus pg_monitor (which includes pg_read_all_settings)."""
    if not pg.value("SELECT count(*) FROM pg_roles WHERE rolname = 'mallory'"):
        for role in ("mallory", "watcher"):
            pg.sql(f"CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA outbox TO {role}; "
                   f"GRANT SELECT ON outbox.backlog, outbox.failed, outbox.workers TO {role}; "
                   f"GRANT EXECUTE ON FUNCTION outbox.worker_status() TO {role}")
        pg.sql("GRANT pg_monitor TO watcher")


def visible_to(pg, role):
    """Everything `role` can read where a setting's value could show, and the error texts it
    gets when it tries to read the properties."""
    seen = []
    with connect_as(pg, role) as c:
        for sql in ("SELECT * FROM outbox.workers", "SELECT * FROM outbox.worker_status()",
                    "SELECT * FROM pg_stat_activity", "SELECT * FROM pg_settings WHERE name LIKE 'outbox.%'",
                    "SHOW ALL", "SHOW outbox.kafka_properties", "SHOW outbox.kafka_properties_file",
                    "SELECT current_setting('outbox.kafka_properties')",
                    "SELECT current_setting('outbox.kafka_properties', true)",
                    "SELECT * FROM pg_file_settings", "SELECT pg_read_file('postgresql.auto.conf')"):
            try:
                seen.append(repr(c.execute(sql).fetchall()))
            except psycopg.Error as e:
                seen.append(f"{e.sqlstate} {e} {e.diag.message_detail} {e.diag.message_hint}")
    return "\n".join(seen)


def assert_no_secret_anywhere(pg, roles=("mallory", "watcher"), superuser=True):
    """No secret (nor its first 10 characters: a masked value is ***, never a prefix of it) in
    the server log, outbox.workers, pg_stat_activity, nor in what the hostile `roles` can read
    or are told in errors; with superuser=True (the password is in the file, never in a
    setting) not in the superuser's pg_settings, SHOW ALL and pg_file_settings either."""
    create_hostile_roles(pg)
    seen = [pg.log()]
    for sql in ("SELECT * FROM outbox.workers", "SELECT * FROM pg_stat_activity") + (
            ("SELECT name, setting, reset_val, boot_val FROM pg_settings", "SELECT * FROM pg_file_settings",
             "SHOW ALL") if superuser else ()):
        seen.append(repr(pg.sql(sql)))
    seen += [visible_to(pg, role) for role in roles]
    text = "\n".join(seen)
    for secret in SECRETS:
        assert secret[:10] not in text


def relay_lines(pg):
    return [line for line in pg.log().splitlines() if "outbox relay 0" in line]


# -- TLS + SASL/SCRAM -------------------------------------------------------------------------

def test_publishes_over_tls_with_scram_password_from_a_file(broker, make_relay, secrets_dir):
    pg = scram_relay(make_relay, broker, secrets_dir)
    ids = enqueue(pg, 30)
    pg.wait_published(30, timeout=90)
    records = read_back(broker, 30)
    assert set(ids) <= {r.event_id for r in records}
    assert worker(pg)["state"] in ("idle", "claiming", "publishing", "recording")
    assert worker(pg)["last_error"] is None
    assert_no_secret_anywhere(pg)


@pytest.mark.skipif(not relay_scrams_on_kafka_4(), reason="librdkafka before 2.6.1 cannot log in to Kafka 4.x "
                                                         "with SCRAM (test_scram_against_kafka_4_says_why_it_fails)")
def test_scram_sha_512_to_kafka_4_1_1_with_a_current_librdkafka(broker, make_relay, secrets_dir):
    with open(broker.log_path) as f:
        assert "Kafka version: 4.1.1" in f.read()
    pg = scram_relay(make_relay, broker, secrets_dir)
    ids = enqueue(pg, 10, prefix="kafka4")
    pg.wait_published(10, timeout=90)
    assert set(ids) <= {r.event_id for r in read_back(broker, len(ids))}
    assert worker(pg)["last_error"] is None
    assert_no_secret_anywhere(pg)


# A relay whose broker refuses it, in every failure test: the state and last_error it shows,
# retries with backoff (each retry stamps last_error_at) in one worker process, a few log
# lines, not one per retry, and events that wait without using up attempts.
FAILING = dict(backoff_base="100ms", backoff_max="500ms")


def assert_refused_sanely(pg, state, error_start, retries=5):
    pid = worker(pg)["pid"]
    ids = enqueue(pg, 3, prefix=f"refused-{uuid.uuid4().hex[:6]}")
    wait_until(lambda: (worker(pg)["last_error"] or "").startswith(error_start), 60, f"last_error {error_start!r}")
    w = worker(pg)
    assert w["state"] == state, w
    start = len(relay_lines(pg))
    stamps = set()
    wait_until(lambda: stamps.add(worker(pg)["last_error_at"]) or len(stamps) >= retries, 120, f"{retries} retries")
    lines = relay_lines(pg)[start:]
    ours = [line for line in lines if "Kafka refused the connection" in line or "Kafka unavailable" in line]
    assert len(ours) <= 3, "\n".join(lines)
    assert len(lines) <= 15, "\n".join(lines)  # librdkafka's own lines are capped at 10 a minute
    assert any(w["last_error"][:60] in line for line in pg.log().splitlines()), "no log line says why"
    w = worker(pg)
    assert w["pid"] == pid and w["state"] == state and w["published"] == 0, w
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status = 'pending' AND attempts = 0 "
                    "AND event_id = ANY(%s::uuid[])", (ids,)) == len(ids)
    assert_no_secret_anywhere(pg)
    return ids, w["last_error"]


def test_wrong_password_is_misconfigured_without_a_crash_loop_until_fixed(broker, make_relay, secrets_dir):
    pg = scram_relay(make_relay, broker, secrets_dir, password=WRONG_PASSWORD, **FAILING)
    ids, error = assert_refused_sanely(pg, "misconfigured", "SASL authentication failed (check sasl.username/password): ")
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in error
    assert broker.secure_bootstrap["SCRAM"] in error
    # The fix: the file, then a reload. The events waited for it and go now.
    pid = worker(pg)["pid"]
    properties_file(secrets_dir, [f"sasl.password={RELAY_PASSWORD}"])
    pg.reload()
    pg.wait_published(len(ids), timeout=90)
    assert worker(pg)["pid"] == pid
    records = read_back(broker, len(ids))
    assert set(ids) <= {r.event_id for r in records}
    assert_no_secret_anywhere(pg)


def test_unknown_ca_is_misconfigured(broker, make_relay, secrets_dir):
    other_ca = ThrowawayCa(os.path.join(secrets_dir, "other-ca"))
    pg = scram_relay(make_relay, broker, secrets_dir, ca_pem=other_ca.cert_pem, **FAILING)
    # OpenSSL's verdict: the broker sends its chain up to its CA, which the relay does not trust.
    assert_refused_sanely(pg, "misconfigured", "TLS: the broker's certificate was not accepted: self-signed "
                                               "certificate in certificate chain (check ssl.ca.location")


def test_expired_broker_certificate_is_misconfigured(broker, make_relay, secrets_dir):
    pg = scram_relay(make_relay, broker, secrets_dir, listener="EXPIRED", **FAILING)
    assert_refused_sanely(pg, "misconfigured", "TLS: the broker's certificate was not accepted: certificate has "
                                               "expired")


def test_broker_that_drops_tls_backs_off_and_never_sends_plaintext(broker, make_relay, secrets_dir):
    # The relay expects TLS on an address where the broker speaks plaintext (its PLAINTEXT
    # listener): the other side cuts the handshake off. That can be a listener going away as
    # well as a misconfiguration, so the worker backs off and retries; it never falls back to
    # plaintext, so nothing is published.
    pg = scram_relay(make_relay, broker, secrets_dir, bootstrap=broker.bootstrap, **FAILING)
    _, error = assert_refused_sanely(pg, "backing off", "TLS handshake failed (is the listener TLS?")
    assert broker.bootstrap in error


def test_password_in_postgresql_conf_is_hidden_from_non_superusers(broker, make_relay):
    # The other place for the password: outbox.kafka_properties in postgresql.conf (superuser-
    # only and hidden). Superusers and pg_read_all_settings (pg_monitor) can read it there.
    pg = make_relay(broker.secure_bootstrap["SCRAM"],
                    kafka_properties=scram_properties(broker.ca.cert_pem) + f";sasl.password={RELAY_PASSWORD}")
    pg.wait_workers_running(1)
    enqueue(pg, 3, prefix="conf")
    pg.wait_published(3, timeout=90)
    assert_no_secret_anywhere(pg, roles=("mallory",), superuser=False)
    assert RELAY_PASSWORD in visible_to(pg, "watcher")  # the trade-off docs/security.md names
    assert RELAY_PASSWORD in pg.value("SHOW outbox.kafka_properties")


# -- mutual TLS -------------------------------------------------------------------------------

def test_mutual_tls_with_an_encrypted_key_whose_password_is_in_the_file(broker, make_relay, secrets_dir):
    client = broker.ca.issue(f"relay-{uuid.uuid4().hex[:6]}", client=True, key_password=KEY_PASSWORD)
    os.chmod(client.key_pem, 0o600)
    pg = make_relay(broker.secure_bootstrap["MTLS"],
                    kafka_properties=f"security.protocol=SSL;ssl.ca.location={broker.ca.cert_pem};"
                                     f"ssl.certificate.location={client.cert_pem};"
                                     f"ssl.key.location={client.key_pem}",
                    kafka_properties_file=properties_file(secrets_dir, [f"ssl.key.password={KEY_PASSWORD}"]))
    pg.wait_workers_running(1)
    ids = enqueue(pg, 10, prefix="mtls")
    pg.wait_published(10, timeout=90)
    records = read_back(broker, 10)
    assert set(ids) <= {r.event_id for r in records}
    assert_no_secret_anywhere(pg)


def test_mutual_tls_without_a_client_certificate_is_misconfigured(broker, make_relay):
    pg = make_relay(broker.secure_bootstrap["MTLS"],
                    kafka_properties=f"security.protocol=SSL;ssl.ca.location={broker.ca.cert_pem}", **FAILING)
    pg.wait_workers_running(1)
    assert_refused_sanely(pg, "misconfigured", "TLS: the broker refused the relay's certificate")


def test_wrong_key_password_is_misconfigured_and_not_shown(broker, make_relay, secrets_dir):
    client = broker.ca.issue(f"relay-{uuid.uuid4().hex[:6]}", client=True, key_password=KEY_PASSWORD)
    pg = make_relay(broker.secure_bootstrap["MTLS"],
                    kafka_properties=f"security.protocol=SSL;ssl.ca.location={broker.ca.cert_pem};"
                                     f"ssl.certificate.location={client.cert_pem};"
                                     f"ssl.key.location={client.key_pem}",
                    kafka_properties_file=properties_file(secrets_dir, [f"ssl.key.password={WRONG_PASSWORD}"]))
    wait_until(lambda: pg.workers() and pg.workers()[0][2] == "misconfigured", 60, "misconfigured")
    assert "could not create the Kafka producer" in worker(pg)["last_error"], worker(pg)
    assert_no_secret_anywhere(pg)


# -- librdkafka 2.0.2 and Kafka 4.x -----------------------------------------------------------

@pytest.mark.skipif(relay_scrams_on_kafka_4(), reason="the relay's librdkafka (2.6.1 or later) logs in to Kafka 4.x")
def test_scram_against_kafka_4_says_why_it_fails(make_relay, secrets_dir):
    with KafkaBroker(secure=True, scram_users={RELAY_USER: RELAY_PASSWORD}) as kb4:
        pg = scram_relay(make_relay, kb4, secrets_dir)
        wait_until(lambda: worker(pg)["state"] == "misconfigured", 60, "misconfigured")
        error = worker(pg)["last_error"]
        assert error.startswith("SASL authentication failed"), error
        assert error.endswith("; Kafka 4.x needs librdkafka >= 2.6.1 for SCRAM"), error
        assert_no_secret_anywhere(pg)


# -- compression through outbox.kafka_properties ----------------------------------------------

def dump_log_codecs(broker, topic):
    """The codecs of the record batches of `topic` partition 0, as the broker's own log dump
    tool (kafka-dump-log, kafka.tools.DumpLogSegments) reads them from its segment files."""
    directory = os.path.join(broker.tmpdir, "data", f"{topic}-0")
    segments = sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".log"))
    cmd = broker._jvm("128m", os.path.join(broker.tmpdir, "dump-log.log"), "kafka.tools.DumpLogSegments",
                      "--files", ",".join(segments))
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                         check=True).stdout
    return [c.lower() for c in re.findall(r"compresscodec: (\w+)", out)]


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compression_reaches_the_broker_and_a_consumer_reads_it(broker, make_relay, codec):
    topic = f"compressed.{codec}"
    broker.create_topic(topic, partitions=1)
    pg = make_relay(broker.bootstrap, kafka_properties=f"compression.type={codec}")
    pg.wait_workers_running(1)
    payloads = {}
    for i in range(200):
        payload = '{"invoice": "%d", "lines": "%s"}' % (i, "paid " * 40)
        payloads[pg.value("SELECT outbox.enqueue(%s, 'k', %s::jsonb)::text", (topic, payload))] = payload
    pg.wait_published(200, timeout=90)
    records = read_topic(broker.bootstrap, topic, 200)
    got = {r.event_id: r.value.decode() for r in records}
    assert set(got) == set(payloads)
    for event_id, payload in payloads.items():
        assert got[event_id] == pg.value("SELECT (%s::jsonb)::text", (payload,))
    codecs = dump_log_codecs(broker, topic)
    assert codecs and set(codecs) == {codec}, codecs


# -- a secret that librdkafka quotes only in part ---------------------------------------------

def test_oauthbearer_config_quoted_in_part_is_masked(make_relay, secrets_dir):
    # librdkafka's builtin unsecured-JWT token refuses a sasl.oauthbearer.config it cannot parse
    # with "Unrecognized sasl.oauthbearer.config beginning at: <the rest of the value>": a part
    # of a secret property, which masking the whole value would miss. No broker is needed: the
    # token fails before any connection (the address is one nobody listens on).
    secret = "Zq9-extension-value-61c"
    pg = make_relay("127.0.0.1:1",
                    kafka_properties="security.protocol=SASL_PLAINTEXT;sasl.mechanism=OAUTHBEARER;"
                                     "enable.sasl.oauthbearer.unsecure.jwt=true",
                    kafka_properties_file=properties_file(
                        secrets_dir, [f"sasl.oauthbearer.config=principal=relay unparsable extension_t={secret}"]),
                    **FAILING)
    pg.wait_workers_running(1)
    wait_until(lambda: "sasl.oauthbearer.config" in (worker(pg)["last_error"] or ""), 60, "the token's failure")
    w = worker(pg)
    assert w["state"] == "misconfigured", w
    assert w["last_error"].startswith("SASL authentication failed (check sasl.oauthbearer.*): "), w
    wait_until(lambda: any("sasl.oauthbearer.config" in line for line in relay_lines(pg)), 30, "a log line")
    create_hostile_roles(pg)
    text = "\n".join([pg.log(), repr(pg.sql("SELECT * FROM outbox.workers")), visible_to(pg, "mallory")])
    for part in (secret, secret[-8:], "unparsable", "extension_t"):
        assert part not in text
    # librdkafka 2.0.2 crashes its main thread when it retries the failed token (10 s on): the
    # relay gets a producer without it before then, or the crash watch would fail the test.
    pg.sql("ALTER SYSTEM SET outbox.kafka_properties = ''")
    pg.reload()
    wait_until(lambda: "OAUTHBEARER" not in (worker(pg)["last_error"] or "OAUTHBEARER"), 30, "a new producer")
