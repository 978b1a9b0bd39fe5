"""Failover-safe publishing (outbox.failover_standbys): a real streaming standby made with
pg_basebackup from a throwaway primary, the relay publishing to librdkafka's mock cluster.
With the standby stopped nothing is published; once it has the WAL the batch goes; after a crash
of the primary and a promotion of the standby, Kafka holds no event the new primary lacks, the
relay on the promoted standby publishes, and the old primary started again publishes nothing."""

import contextlib

import psycopg
import pytest

from harness.kafka_reader import read_topic
from harness.wait import wait_until

STANDBY = "standby1"


def enqueue(pg, key):
    return pg.value("SELECT outbox.enqueue('billing', %s, '{\"n\": 1}'::jsonb)::text", (key,))


def status_of(pg, event_id):
    return pg.value("SELECT status FROM outbox.events WHERE event_id = %s::uuid", (event_id,))


def kafka_ids(mock_cluster, at_least=0):
    """The event ids on the topic, read until `at_least` arrived and then nothing more for a while
    (a read that stopped at the first empty poll could miss records already there)."""
    return {r.event_id for r in read_topic(mock_cluster.bootstrap, "billing", at_least, timeout=30, settle=True)}


def wait_waiting_for_standby(pg, event_id, text):
    """The worker says it waits for the standby, and the event is still pending: it was claimed
    and held back, not published (the standby cannot confirm what it does not have)."""
    def check():
        state, error = pg.sql("SELECT state, last_error FROM outbox.workers WHERE worker = 0")[0]
        return state == "waiting for standby" and error and text in error and status_of(pg, event_id) == "pending"
    return wait_until(check, 60, f"'waiting for standby' ({text}) with {event_id} pending")


def primary_with_standby(mock_cluster, make_relay, standbys, **outbox):
    primary = make_relay(mock_cluster.bootstrap, **{"failover_wait_timeout": "1s", **outbox})
    primary.wait_workers_running(1)
    # Its configuration is the primary's (pg_basebackup copies it): outbox.failover_standbys names
    # the standby itself, which it leaves out once promoted (it never waits for itself).
    standby = primary.make_standby(STANDBY)
    standbys.append(standby)
    standby.start()
    primary.wait_streaming(STANDBY)
    return primary, standby


def test_standby_gates_publishing_and_a_promotion_loses_nothing_kafka_has(mock_cluster, make_relay, standbys):
    primary, standby = primary_with_standby(mock_cluster, make_relay, standbys, failover_standbys=STANDBY)

    # Standby streaming: an event goes out at once.
    first = enqueue(primary, "k1")
    primary.wait_published(1)

    # Standby stopped: the next one is claimed, held back, and not published.
    standby.stop()
    second = enqueue(primary, "k2")
    wait_waiting_for_standby(primary, second, f'standby "{STANDBY}" is not connected')
    assert kafka_ids(mock_cluster, 1) == {first}
    wait_until(lambda: "not publishing until the failover standbys confirm" in primary.log(), 30, "the log line")

    # Standby back: it gets the WAL, the batch goes.
    standby.start()
    primary.wait_published(2)
    assert kafka_ids(mock_cluster, 2) == {first, second}

    # Standby stopped again; an event only the primary has; the primary crashes before its WAL ships.
    standby.stop()
    lost = enqueue(primary, "k-lost")
    wait_waiting_for_standby(primary, lost, f'standby "{STANDBY}" is not connected')
    primary.stop("immediate")

    # Failover: the standby is promoted. It never had the lost event, and neither has Kafka.
    standby.start()
    standby.promote()
    assert standby.value("SELECT count(*) FROM outbox.events WHERE event_id = %s::uuid", (lost,)) == 0
    # The relay on the promoted standby publishes: what it has pending, and what comes next.
    standby.wait_workers_running(1)
    third = enqueue(standby, "k3")
    wait_until(lambda: status_of(standby, third) == "published", 60, "the promoted standby's relay publishing")
    in_kafka = kafka_ids(mock_cluster, 3)
    on_new_primary = {r[0] for r in standby.sql("SELECT event_id::text FROM outbox.events")}
    assert in_kafka <= on_new_primary, f"Kafka has events the new primary lacks: {in_kafka - on_new_primary}"
    assert {first, second, third} <= in_kafka and lost not in in_kafka

    # The old primary started again as a primary (not rewound into a standby): its standby is now
    # the primary and follows nobody, so the lost event stays held back, never published.
    primary.start()
    wait_waiting_for_standby(primary, lost, f'standby "{STANDBY}" is not connected')
    assert lost not in kafka_ids(mock_cluster, len(in_kafka))


def test_without_the_setting_kafka_gets_an_event_the_promoted_standby_lacks(mock_cluster, make_relay, standbys):
    """The control: the scenario above without outbox.failover_standbys loses the business row
    of an event Kafka has (what the setting prevents, and what the test above would catch)."""
    primary, standby = primary_with_standby(mock_cluster, make_relay, standbys)
    standby.stop()
    lost = enqueue(primary, "k-lost")
    wait_until(lambda: status_of(primary, lost) == "published", 60, "published with the standby stopped")
    primary.stop("immediate")
    standby.start()
    standby.promote()
    assert standby.value("SELECT count(*) FROM outbox.events WHERE event_id = %s::uuid", (lost,)) == 0
    assert lost in kafka_ids(mock_cluster, 1)


def test_one_setting_for_every_node_never_waits_for_itself(mock_cluster, make_relay, standbys):
    """'node_a, standby1' on both nodes (the standby copies it): the primary (cluster_name
    node_a) waits for standby1 only; promoted, standby1 waits for node_a only."""
    primary = make_relay(mock_cluster.bootstrap, failover_standbys=f"node_a, {STANDBY}", failover_wait_timeout="1s")
    primary.sql("ALTER SYSTEM SET cluster_name = 'node_a'", dbname="postgres")
    primary.restart()
    primary.wait_workers_running(1)
    standby = primary.make_standby(STANDBY)
    standbys.append(standby)
    standby.start()
    primary.wait_streaming(STANDBY)
    first = enqueue(primary, "k1")
    wait_until(lambda: status_of(primary, first) == "published", 60, "published with only itself missing")
    standby.stop()
    second = enqueue(primary, "k2")
    wait_waiting_for_standby(primary, second, f'standby "{STANDBY}" is not connected')
    assert "node_a" not in primary.value("SELECT last_error FROM outbox.workers WHERE worker = 0")
    primary.stop("immediate")
    standby.start()
    standby.promote()
    standby.wait_workers_running(1)
    third = enqueue(standby, "k3")
    wait_waiting_for_standby(standby, third, 'standby "node_a" is not connected')
    assert STANDBY not in standby.value("SELECT last_error FROM outbox.workers WHERE worker = 0")
    assert kafka_ids(mock_cluster, 1) == {first}


def test_replay_position_waits_for_the_standby_to_replay(mock_cluster, make_relay, standbys):
    primary, standby = primary_with_standby(mock_cluster, make_relay, standbys, failover_standbys=STANDBY,
                                            failover_standby_lsn="replay")
    standby.sql("SELECT pg_wal_replay_pause()", dbname="postgres")
    event = enqueue(primary, "k1")
    # Flushed on the standby (it streams), not replayed: held back, and the reason says replayed.
    wait_waiting_for_standby(primary, event, f'standby "{STANDBY}" replayed')
    assert kafka_ids(mock_cluster) == set()
    # By flush, the same standby is enough (a reload changes it).
    primary.set(failover_standby_lsn="flush")
    wait_until(lambda: status_of(primary, event) == "published", 60, "published once flush counts")
    standby.sql("SELECT pg_wal_replay_resume()", dbname="postgres")


def test_any_count_of_standbys(mock_cluster, make_relay, standbys):
    primary, standby = primary_with_standby(mock_cluster, make_relay, standbys,
                                            failover_standbys="ANY 1 (other, standby1)")
    first = enqueue(primary, "k1")
    primary.wait_published(1)
    primary.set(failover_standbys="ANY 2 (*)")
    second = enqueue(primary, "k2")
    wait_waiting_for_standby(primary, second, "1 of 1 connected standbys")
    assert kafka_ids(mock_cluster, 1) == {first}
    primary.set(failover_standbys="ANY 1 (*)")
    wait_until(lambda: status_of(primary, second) == "published", 60, "published once one standby is enough")


def test_publish_policy_publishes_after_the_timeout_and_says_so(mock_cluster, make_relay, standbys):
    primary, standby = primary_with_standby(mock_cluster, make_relay, standbys, failover_standbys=STANDBY,
                                            failover_on_timeout="publish")
    standby.stop()
    event = enqueue(primary, "k1")
    wait_until(lambda: status_of(primary, event) == "published", 60, "published after the timeout")
    error = primary.value("SELECT last_error FROM outbox.workers WHERE worker = 0")
    assert error.startswith("published without standby confirmation") and STANDBY in error
    assert kafka_ids(mock_cluster, 1) == {event}


def test_a_stop_during_the_wait_publishes_nothing_and_keeps_the_event(mock_cluster, make_relay, standbys):
    primary, standby = primary_with_standby(mock_cluster, make_relay, standbys, failover_standbys=STANDBY,
                                            failover_wait_timeout="1h")
    standby.stop()
    event = enqueue(primary, "k1")
    wait_waiting_for_standby(primary, event, "not connected")
    # SIGTERM of the worker waiting inside the claim (the postmaster starts it again).
    pid = primary.value("SELECT pid FROM outbox.workers WHERE worker = 0")
    primary.sql("SELECT pg_terminate_backend(%s)", (pid,))
    wait_until(lambda: primary.value("SELECT pid FROM outbox.workers WHERE worker = 0") not in (None, pid),
               60, "the worker restarted")
    assert status_of(primary, event) == "pending"
    standby.start()
    wait_until(lambda: status_of(primary, event) == "published", 60, "published once the standby is back")
    assert kafka_ids(mock_cluster, 1) == {event}


@pytest.mark.parametrize("value, problem", [
    ("a, a", "named twice"),
    ("ANY 3 (a, b)", "fewer than n"),
    ("ANY (a)", "followed by the number"),
    ("ANY 1 (a", "no closing parenthesis"),
    ("*", "needs a count"),
    ("a, , b", "empty"),
    ("ANY 0 (*)", "between 1 and 32"),
    ("a (b)", "parenthesis"),
    ("FIRST 1 (a, b)", "not supported"),
])
def test_bad_failover_standbys_is_refused_with_the_reason(make_relay, value, problem):
    pg = make_relay("localhost:1", workers=0)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
        pg.sql("ALTER SYSTEM SET outbox.failover_standbys = '%s'" % value)
    assert problem in (e.value.diag.message_detail or "") and "ANY n" in (e.value.diag.message_hint or "")
    assert pg.value("SHOW outbox.failover_standbys") == ""


def test_failover_settings_are_the_operators(make_relay):
    pg = make_relay("localhost:1", workers=0)
    for value in ("a, b", "ANY 1 (a, b)", "ANY 2 (*)", ""):
        pg.set(failover_standbys=value)
        wait_until(lambda: pg.value("SHOW outbox.failover_standbys") == value, 30, f"reloaded {value!r}")
    with contextlib.closing(pg.connect()) as c:
        with pytest.raises(psycopg.errors.CantChangeRuntimeParam):
            c.execute("SET outbox.failover_standbys = 'x'")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pg.sql("ALTER SYSTEM SET outbox.failover_standby_lsn = 'write'")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pg.sql("ALTER SYSTEM SET outbox.failover_on_timeout = 'maybe'")


def test_a_reload_during_a_long_wait_takes_effect_at_once(mock_cluster, make_relay, standbys):
    """An operator who turns the setting off while a batch waits (failover_wait_timeout 1h) sees
    the batch go now, not after the hour: a reload ends the claim's wait (the batch is released
    unpublished, whatever failover_on_timeout says) and the next claim runs with the new value."""
    primary, standby = primary_with_standby(mock_cluster, make_relay, standbys, failover_standbys=STANDBY,
                                            failover_wait_timeout="1h", failover_on_timeout="publish")
    standby.stop()
    event = enqueue(primary, "k1")
    wait_waiting_for_standby(primary, event, "not connected")
    # An unrelated reload publishes nothing (with publish, only the timeout may).
    primary.set(poll_interval="999ms")
    wait_until(lambda: primary.value("SHOW outbox.poll_interval") == "999ms", 30, "reloaded")
    wait_waiting_for_standby(primary, event, "not connected")
    assert status_of(primary, event) == "pending" and kafka_ids(mock_cluster) == set()
    primary.set(failover_standbys="")
    wait_until(lambda: status_of(primary, event) == "published", 60, "published once the setting is off")
    assert kafka_ids(mock_cluster, 1) == {event}


def test_a_cancel_during_the_wait_publishes_nothing(mock_cluster, make_relay, standbys):
    primary, standby = primary_with_standby(mock_cluster, make_relay, standbys, failover_standbys=STANDBY,
                                            failover_wait_timeout="1h")
    standby.stop()
    event = enqueue(primary, "k1")
    wait_waiting_for_standby(primary, event, "not connected")
    pid = primary.value("SELECT pid FROM outbox.workers WHERE worker = 0")
    primary.sql("SELECT pg_cancel_backend(%s)", (pid,))
    wait_until(lambda: "canceling statement due to user request" in primary.log(), 60, "the cancel served")
    wait_waiting_for_standby(primary, event, "not connected")
    assert primary.value("SELECT pid FROM outbox.workers WHERE worker = 0") == pid
    assert kafka_ids(mock_cluster) == set()
    standby.start()
    wait_until(lambda: status_of(primary, event) == "published", 60, "published once the standby is back")


def wait_streaming_count(primary, n):
    return wait_until(lambda: primary.value("SELECT count(*) FROM pg_stat_replication WHERE application_name = %s "
                                            "AND state = 'streaming'", (STANDBY,), dbname="postgres") >= n,
                      60, f"{n} standbys streaming as {STANDBY}")


def test_two_standbys_of_one_name_must_both_have_the_batch(mock_cluster, make_relay, standbys):
    """Two standbys misnamed alike: a failover may go to either, so the one that lags holds the
    batch (the better of the two would let Kafka get what a failover to the other loses)."""
    primary, first = primary_with_standby(mock_cluster, make_relay, standbys, failover_standbys=STANDBY,
                                          failover_standby_lsn="replay")
    second = primary.make_standby(STANDBY)
    standbys.append(second)
    second.start()
    wait_streaming_count(primary, 2)
    second.sql("SELECT pg_wal_replay_pause()", dbname="postgres")
    event = enqueue(primary, "k1")
    wait_waiting_for_standby(primary, event, f'standby "{STANDBY}" replayed')
    assert kafka_ids(mock_cluster) == set()
    second.sql("SELECT pg_wal_replay_resume()", dbname="postgres")
    wait_until(lambda: status_of(primary, event) == "published", 60, "published once both replayed it")


def test_a_standby_under_the_nodes_own_name_counts_while_it_streams(mock_cluster, make_relay, standbys):
    """A promoted standby1 keeps application_name=standby1 in its primary_conninfo; the old primary,
    rebuilt as its standby under the name the setting lists, streams from it as standby1: that is
    another node, not itself, and must have the batch."""
    primary = make_relay(mock_cluster.bootstrap, failover_standbys=STANDBY, failover_wait_timeout="1s",
                         failover_standby_lsn="replay")
    primary.sql(f"ALTER SYSTEM SET primary_conninfo = 'host=/nonexistent application_name={STANDBY}'",
                dbname="postgres")
    primary.reload()
    primary.wait_workers_running(1)
    standby = primary.make_standby(STANDBY)
    standbys.append(standby)
    standby.start()
    primary.wait_streaming(STANDBY)
    standby.sql("SELECT pg_wal_replay_pause()", dbname="postgres")
    event = enqueue(primary, "k1")
    wait_waiting_for_standby(primary, event, f'standby "{STANDBY}" replayed')
    assert kafka_ids(mock_cluster) == set()
    # Gone, it is indistinguishable from the node's own name: left out, the batch goes.
    standby.stop()
    wait_until(lambda: status_of(primary, event) == "published", 60, "published with only its own name missing")
