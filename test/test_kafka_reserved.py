"""Producer properties the relay reserves (issue 15 item 5): refused by every spelling librdkafka
takes for them (its name, an alias, the topic. prefix), in outbox.kafka_properties_file (the
worker: misconfigured), in outbox.kafka_properties at server start (the worker) and on a reload
of postgresql.conf (the check hook: the old value stays). SET-time refusals of each spelling:
sql/settings.sql."""

import os

import psycopg
import pytest

from harness.wait import wait_until

# Each line reaches a reserved property by another way: (line, what last_error must say).
RESERVED_SPELLINGS = [
    ("topic.partitioner=random", 'may not set "topic.partitioner" (librdkafka\'s "partitioner")'),
    ("topic.message.timeout.ms=1000", 'may not set "topic.message.timeout.ms" (librdkafka\'s "message.timeout.ms")'),
    ("topic.delivery.timeout.ms=1000", 'may not set "topic.delivery.timeout.ms" (librdkafka\'s "message.timeout.ms")'),
    ("linger.ms = 5", 'may not set "linger.ms" (librdkafka\'s "queue.buffering.max.ms")'),
    ("acks=all", 'may not set "acks" (librdkafka\'s "request.required.acks")'),
    ("topic.queuing.strategy=lifo", 'may not set "topic.queuing.strategy" (librdkafka\'s "queuing.strategy")'),
    ("plugin.library.paths=/nonexistent/plugin.so", 'may not set "plugin.library.paths"'),
]
SECRET = "Zq7s3cr3t"


def write_private(path, lines):
    """Replaces the file in one step: the worker reads it whenever it retries making the producer,
    and a file truncated mid-write would be a valid one."""
    with open(path + ".new", "w") as f:
        f.write("".join(f"{line}\n" for line in lines))
    os.chmod(path + ".new", 0o600)
    os.replace(path + ".new", path)


def last_error(pg):
    return pg.workers()[0][5] or ""


def published(pg):
    return pg.value("SELECT count(*) FROM outbox.events WHERE status = 'published'")


def test_reserved_property_in_the_file_is_refused_by_any_spelling(mock_cluster, make_relay):
    pg = make_relay(mock_cluster.bootstrap, poll_interval="200ms")
    pg.wait_workers_running(1)
    path = os.path.join(pg.tmp, "kafka.secrets")
    write_private(path, ["client.id=relay"])
    pg.set(kafka_properties_file=path)
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'before')")
    pg.wait_published(1)
    for line, refusal in RESERVED_SPELLINGS:
        # Line 2, after a secret: the error names the line and the property, never a value.
        write_private(path, [f"sasl.password={SECRET}", line])
        pg.reload()
        expected = f"outbox.kafka_properties_file line 2 {refusal}"
        wait_until(lambda: last_error(pg).startswith(expected), 30, f"{line} refused")
        assert pg.workers()[0][2] == "misconfigured"
        pg.sql("SELECT outbox.enqueue('billing', 'k', %s)", (f"while {line} is in the file",))
    # No producer was made with any of them: nothing published meanwhile.
    assert published(pg) == 1
    assert SECRET not in pg.log() and SECRET not in repr(pg.workers())
    # Other spellings name no property (librdkafka matches names exactly): refused too.
    for line in ("TOPIC.partitioner=random", "Partitioner=random", "topic.topic.partitioner=random",
                 "topic. partitioner=random"):
        write_private(path, [line])
        pg.reload()
        wait_until(lambda: last_error(pg) == "outbox.kafka_properties_file line 1 names no librdkafka property", 30,
                   f"{line} refused")
    assert published(pg) == 1
    write_private(path, ["client.id=relay"])
    pg.reload()
    pg.wait_published(1 + len(RESERVED_SPELLINGS))


def test_reserved_property_set_before_start_is_refused_by_the_worker(mock_cluster, make_relay):
    # At start a refused value would be dropped for the empty default (PostgreSQL's rule for a
    # library's setting) and the relay would run without the operator's other properties: the
    # worker refuses it instead, and publishes nothing.
    pg = make_relay(mock_cluster.bootstrap, kafka_properties="client.id=relay;topic.partitioner=random")
    wait_until(lambda: pg.workers()[0][2] == "misconfigured", 30, "misconfigured state")
    assert last_error(pg).startswith(
        'outbox.kafka_properties entry 2 may not set "topic.partitioner" (librdkafka\'s "partitioner")')
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'waits')")
    assert pg.value("SHOW outbox.kafka_properties") == "client.id=relay;topic.partitioner=random"
    assert published(pg) == 0


@pytest.mark.parametrize("how", ["postgresql.conf", "ALTER SYSTEM"])
def test_reload_of_a_reserved_property_keeps_the_relay_on_the_old_one(mock_cluster, make_relay, how):
    # The value holds a secret: ALTER SYSTEM takes it (refusing it would make PostgreSQL log the
    # statement, secret and all), and the reload refuses it in every process (the postmaster logs
    # why, without the value); the relay keeps publishing with the old one.
    pg = make_relay(mock_cluster.bootstrap, kafka_properties="client.id=relay")
    pg.wait_workers_running(1)
    pid = pg.worker_pids()[0]
    value = f"sasl.password={SECRET};topic.delivery.timeout.ms=1000"
    if how == "ALTER SYSTEM":
        pg.set(kafka_properties=value)
    else:
        with open(os.path.join(pg.datadir, "postgresql.conf"), "a") as f:
            f.write(f"outbox.kafka_properties = '{value}'\n")
        pg.reload()
    refusal = ('outbox.kafka_properties entry 2 may not set "topic.delivery.timeout.ms" '
               '(librdkafka\'s "message.timeout.ms")')
    wait_until(lambda: refusal in pg.log(), 30, "reload refused")
    assert SECRET not in pg.log()
    assert pg.value("SHOW outbox.kafka_properties") == "client.id=relay"
    pg.sql("SELECT outbox.enqueue('billing', 'k', 'after the refused reload')")
    pg.wait_published(1)
    assert pg.worker_pids()[0] == pid and pg.workers()[0][2] != "misconfigured"


def test_a_role_allowed_to_alter_the_setting_cannot_set_a_reserved_property(mock_cluster, make_relay):
    # Least privilege: a role granted ALTER SYSTEM on this one setting (PostgreSQL 15), nothing else.
    pg = make_relay(mock_cluster.bootstrap)
    pg.sql("CREATE ROLE ops LOGIN")
    pg.sql("GRANT ALTER SYSTEM ON PARAMETER outbox.kafka_properties TO ops")
    with psycopg.connect(host=pg.tmp, port=pg.port, user="ops", dbname="postgres", autocommit=True) as c:
        for value in ("topic.partitioner=random", "delivery.timeout.ms=1", "max.in.flight=1000"):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
                c.execute(f"ALTER SYSTEM SET outbox.kafka_properties = '{value}'")
            assert "may not set" in str(e.value) and e.value.diag.message_hint.startswith("Remove the entry")
        c.execute("ALTER SYSTEM SET outbox.kafka_properties = 'compression.type=lz4'")  # tuning is allowed
    assert pg.value("SELECT count(*) FROM pg_file_settings WHERE name = 'outbox.kafka_properties' "
                    "AND sourcefile LIKE '%auto.conf'") == 1
