"""SASL/OAUTHBEARER with OpenID Connect (client credentials), as managed Kafka services log in,
against a real Kafka 4.1 broker: the relay's librdkafka (sasl.oauthbearer.method=oidc) gets a
token from a token endpoint this test serves (harness/oidc_provider.py), and the broker's own
OAuthBearerValidatorCallbackHandler checks its signature against the provider's JWKS, its
issuer and audience. The client secret lives in outbox.kafka_properties_file like the other
secrets and shows nowhere (the sweep of test_kafka_security.py, plus its Basic-auth form).

librdkafka needs libcurl for OIDC: Debian 12's 2.0.2 is built without it (its builtin.features
lack "oidc"), the 2.8.0 of test/librdkafka/build.sh with it; test/run's second pass runs this
file on that one.
"""

import base64
import uuid

import pytest

from harness.kafka_broker import KafkaBroker
from harness.kafka_reader import read_topic
from harness.librdkafka import extension_librdkafka
from harness.oidc_provider import OidcProvider
from harness.wait import wait_until
from test_kafka_security import FAILING, create_hostile_roles, enqueue, properties_file, relay_lines, visible_to, worker

CLIENT_ID = "outbox-relay"
CLIENT_SECRET = "Oc7xQz2Lk58e1aRvM4"  # no words: the mask hides any 4 of its characters in a row
WRONG_SECRET = "Wn2Pq8Tz3c9fHsJ6"
SECRETS = (CLIENT_SECRET, WRONG_SECRET)

relay_has_oidc = "oidc" in extension_librdkafka().features


@pytest.fixture(scope="module")
def idp():
    with OidcProvider(clients={CLIENT_ID: CLIENT_SECRET}) as provider:
        yield provider


@pytest.fixture(scope="module")
def broker(idp):
    with KafkaBroker(oauth=idp) as kb:
        yield kb


@pytest.fixture
def topic(broker):
    name = f"billing.oidc.{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, partitions=3)
    return name


@pytest.fixture
def secrets_dir(tmp_path):
    tmp_path.chmod(0o700)
    return tmp_path


def oidc_relay(make_relay, broker, idp, secrets_dir, secret=CLIENT_SECRET, **settings):
    pg = make_relay(broker.oauth_bootstrap,
                    kafka_properties=("security.protocol=SASL_PLAINTEXT;sasl.mechanism=OAUTHBEARER;"
                                      f"sasl.oauthbearer.method=oidc;sasl.oauthbearer.client.id={CLIENT_ID};"
                                      f"sasl.oauthbearer.token.endpoint.url={idp.token_url};"
                                      "sasl.oauthbearer.scope=kafka.produce"),
                    kafka_properties_file=properties_file(secrets_dir, [f"sasl.oauthbearer.client.secret={secret}"]),
                    **settings)
    pg.wait_workers_running(1)
    return pg


def assert_secret_nowhere(pg):
    """Neither secret, nor its first 10 characters, nor the HTTP Basic credentials librdkafka
    sends to the token endpoint, in the server log, outbox.workers, pg_stat_activity, the
    superuser's settings views, nor in what a monitoring role and a pg_monitor one can read."""
    create_hostile_roles(pg)
    seen = [pg.log()] + [repr(pg.sql(sql)) for sql in (
        "SELECT * FROM outbox.workers", "SELECT * FROM pg_stat_activity",
        "SELECT name, setting, reset_val, boot_val FROM pg_settings", "SELECT * FROM pg_file_settings", "SHOW ALL")]
    seen += [visible_to(pg, role) for role in ("mallory", "watcher")]
    text = "\n".join(seen)
    for secret in SECRETS:
        assert secret[:10] not in text
        assert base64.b64encode(f"{CLIENT_ID}:{secret}".encode()).decode()[:16] not in text


@pytest.mark.skipif(not relay_has_oidc, reason="the relay's librdkafka has no OIDC (built without libcurl)")
def test_oidc_client_credentials_token_publishes_and_a_consumer_reads_back(broker, idp, topic, make_relay,
                                                                          secrets_dir):
    issued = idp.issued
    pg = oidc_relay(make_relay, broker, idp, secrets_dir)
    ids = enqueue(pg, 20, topic=topic, prefix="oidc")
    pg.wait_published(20, timeout=90)
    records = read_topic(broker.bootstrap, topic, len(ids))
    assert set(ids) <= {r.event_id for r in records}
    assert idp.issued > issued  # the token came from the endpoint, not from anywhere else
    assert worker(pg)["last_error"] is None
    assert_secret_nowhere(pg)


@pytest.mark.skipif(not relay_has_oidc, reason="the relay's librdkafka has no OIDC (built without libcurl)")
def test_wrong_client_secret_is_misconfigured_with_bounded_logs_until_fixed(broker, idp, topic, make_relay,
                                                                            secrets_dir):
    refused = idp.refused
    pg = oidc_relay(make_relay, broker, idp, secrets_dir, secret=WRONG_SECRET, **FAILING)
    pid = worker(pg)["pid"]
    ids = enqueue(pg, 3, topic=topic, prefix="refused")
    start = "SASL authentication failed (check sasl.oauthbearer.*): "
    wait_until(lambda: (worker(pg)["last_error"] or "").startswith(start), 60, "the token endpoint's refusal")
    w = worker(pg)
    assert w["state"] == "misconfigured", w
    assert idp.refused > refused
    assert '"error": "invalid_client"' in w["last_error"], w  # the token endpoint's own answer
    # librdkafka asks the endpoint again every 10 s: a couple of those, not a line per retry.
    wait_until(lambda: idp.refused >= refused + 2, 60, "a second token request")
    lines = relay_lines(pg)
    assert len(lines) <= 15, "\n".join(lines)
    w = worker(pg)
    assert w["pid"] == pid and w["state"] == "misconfigured" and w["published"] == 0, w
    assert pg.value("SELECT count(*) FROM outbox.events WHERE status = 'pending' AND attempts = 0 "
                    "AND event_id = ANY(%s::uuid[])", (ids,)) == len(ids)
    assert_secret_nowhere(pg)
    # The fix: the right secret in the file, then a reload. The events waited for it and go now.
    properties_file(secrets_dir, [f"sasl.oauthbearer.client.secret={CLIENT_SECRET}"])
    pg.reload()
    pg.wait_published(len(ids), timeout=90)
    assert worker(pg)["pid"] == pid
    assert set(ids) <= {r.event_id for r in read_topic(broker.bootstrap, topic, len(ids))}
    assert_secret_nowhere(pg)


@pytest.mark.skipif(relay_has_oidc, reason="the relay's librdkafka has OIDC")
def test_oidc_on_a_librdkafka_without_it_is_misconfigured_naming_the_property(idp, make_relay, secrets_dir):
    # Debian 12's 2.0.2: the property is refused when the producer is configured, no broker needed.
    pg = make_relay("127.0.0.1:1",
                    kafka_properties=("security.protocol=SASL_PLAINTEXT;sasl.mechanism=OAUTHBEARER;"
                                      f"sasl.oauthbearer.method=oidc;sasl.oauthbearer.client.id={CLIENT_ID};"
                                      f"sasl.oauthbearer.token.endpoint.url={idp.token_url}"),
                    kafka_properties_file=properties_file(secrets_dir,
                                                          [f"sasl.oauthbearer.client.secret={CLIENT_SECRET}"]))
    wait_until(lambda: pg.workers() and pg.workers()[0][2] == "misconfigured", 60, "misconfigured")
    error = worker(pg)["last_error"]
    # librdkafka's own reason ("not supported in this build: ... libcurl") is not passed on: the
    # relay never quotes what librdkafka says about a value.
    assert 'sets "sasl.oauthbearer.method" to a value librdkafka refuses' in error, error
    assert idp.issued == 0 and idp.refused == 0
    assert_secret_nowhere(pg)
