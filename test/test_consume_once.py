"""Consumer-side dedup end to end: the billing demo's business transactions enqueue their events
in the producer's database, the relay publishes them to a real Kafka broker, and a real consumer
(harness/invoice_projector.py) applies them to a second database with outbox.consume_once().
It crashes twice along the way, then its group's offsets are reset to the beginning and it
consumes everything again: every invoice event is applied exactly once. The consumer's cluster
runs no relay (outbox.workers = 0), like a consumer database elsewhere would."""

import os
import random
from collections import Counter, defaultdict

import psycopg
import pytest

from demo.billing_demo import (INVOICES_TOPIC, PAYMENTS_TOPIC, SCHEMA_SQL, TOPIC_OF, app_connect,
                               business_op, subscription_history)
from harness.invoice_projector import (CONSUMER, LEDGER_SCHEMA_SQL, Crash, InvoiceProjector,
                                       reset_offsets_to_beginning)
from harness.kafka_broker import KafkaBroker
from harness.wait import wait_until

PARTITIONS = 3
TOPICS = (INVOICES_TOPIC, PAYMENTS_TOPIC)


@pytest.fixture(scope="module")
def kafka():
    with KafkaBroker() as kb:
        for topic in TOPICS:
            kb.create_topic(topic, partitions=PARTITIONS)
        yield kb


def run_billing(pg, subscriptions, seed=11):
    """The demo's business operations, one transaction each. Returns {event_id: (kind,
    subscription, invoice, amount)} of what committed."""
    pg.sql(SCHEMA_SQL)
    rng = random.Random(seed)
    events = {}
    with app_connect(pg) as conn:
        for n in range(1, subscriptions + 1):
            for kind, subscription, invoice, amount in subscription_history(rng, n):
                event_id, _ = business_op(conn, kind, subscription, invoice, amount)
                assert event_id is not None
                events[event_id] = (kind, subscription, invoice, amount)
    return events


def expected_balances(events):
    balances = defaultdict(lambda: [0, 0, 0])
    for kind, subscription, _, amount in events.values():
        b = balances[subscription]
        if kind == "invoice.created":
            b[0] += amount
        elif kind == "invoice.paid":
            b[1] += amount
        else:
            b[2] += 1
    return {s: tuple(b) for s, b in balances.items()}


def test_every_invoice_event_is_applied_exactly_once_through_crashes_and_a_full_replay(kafka, make_relay):
    billing = make_relay(kafka.bootstrap, workers=2, database="billing")
    ledger = make_relay(kafka.bootstrap, workers=0, database="ledger")
    ledger.sql(LEDGER_SCHEMA_SQL)

    events = run_billing(billing, subscriptions=40)
    assert {TOPIC_OF[kind] for kind, *_ in events.values()} == set(TOPICS)
    billing.wait_published(len(events), timeout=120)

    # First pass, with two crashes: one whose transaction (mark + effect) is rolled back by the
    # backend's death, one that committed but died before committing its Kafka offset.
    order = sorted(events)
    rolled_back, unacked = order[3], order[7]
    seen = {}
    group = "invoice-projector"
    crashes = 0
    pending = {"before": [rolled_back], "after": [unacked]}

    def first_pass_done():
        return (not pending["before"] and not pending["after"]
                and all(True in seen.get(e, []) for e in events))

    while not first_pass_done():
        projector = InvoiceProjector(kafka.bootstrap, ledger, TOPICS, group, seen,
                                     crash_before_commit=pending["before"], crash_after_commit=pending["after"])
        try:
            projector.run(until=first_pass_done)
        except Crash:
            crashes += 1
        finally:
            pending = {"before": list(projector.crash_before_commit), "after": list(projector.crash_after_commit)}
            projector.close()
        assert crashes <= 2
    assert crashes == 2
    # The rolled-back one was marked (true), lost its mark with the rollback, and was applied
    # when redelivered (true again). The unacked one was redelivered and found its mark.
    assert seen[rolled_back][:2] == [True, True]
    assert seen[unacked][:2] == [True, False]
    applied = Counter(dict(ledger.sql("SELECT event_id::text, count(*) FROM applied GROUP BY 1")))
    assert applied == Counter({e: 1 for e in events})

    # Replay: the group starts again from offset 0 of every partition; every record comes again
    # and is a duplicate.
    reset_offsets_to_beginning(kafka.bootstrap, group, TOPICS, PARTITIONS)
    replayed = {}
    projector = InvoiceProjector(kafka.bootstrap, ledger, TOPICS, group, replayed)
    try:
        projector.run(until=lambda: set(replayed) >= set(events))
    finally:
        projector.close()
    assert set(replayed) == set(events)
    assert all(results and not any(results) for results in replayed.values()), \
        {e: r for e, r in replayed.items() if any(r)}

    # Exactly once: one application per event id, and balances that are the sums of the events.
    applied = Counter(dict(ledger.sql("SELECT event_id::text, count(*) FROM applied GROUP BY 1")))
    assert applied == Counter({e: 1 for e in events})
    balances = {s: (i, p, f) for s, i, p, f in
                ledger.sql("SELECT subscription_id, invoiced_cents, paid_cents, failed_payments FROM balances")}
    assert balances == expected_balances(events)
    assert ledger.value("SELECT count(*) FROM outbox.consumed WHERE consumer = %s", (CONSUMER,)) == len(events)


def test_consumed_retention_is_the_operators_setting(make_relay):
    """A reload of outbox.consumed_retention moves the window consume_once purges with; 0 keeps
    marks forever (then purge_consumed needs its window)."""
    pg = make_relay("127.0.0.1:9", workers=0)
    old = "5f5149c4-5d91-5747-b479-d84c355ce43d"
    pg.sql("INSERT INTO outbox.consumed (consumer, event_id, consumed_at) "
           "VALUES ('c', %s, now() - interval '2 hours')", (old,))
    assert pg.sql("SELECT outbox.consume_once('c', gen_random_uuid())") == [(True,)]
    assert pg.value("SELECT count(*) FROM outbox.consumed WHERE event_id = %s", (old,)) == 1

    pg.set(consumed_retention="1h")
    wait_until(lambda: pg.value("SHOW outbox.consumed_retention") == "1h", 30, "the reload")
    assert pg.sql("SELECT outbox.consume_once('c', gen_random_uuid())") == [(True,)]
    assert pg.value("SELECT count(*) FROM outbox.consumed WHERE event_id = %s", (old,)) == 0
    # The trade-off: after its mark is gone, a late duplicate is applied again.
    assert pg.sql("SELECT outbox.consume_once('c', %s)", (old,)) == [(True,)]

    pg.set(consumed_retention="0")
    wait_until(lambda: pg.value("SHOW outbox.consumed_retention") == "0", 30, "the reload")
    pg.sql("UPDATE outbox.consumed SET consumed_at = now() - interval '10 years'")
    assert pg.sql("SELECT outbox.consume_once('c', gen_random_uuid())") == [(True,)]
    assert pg.value("SELECT count(*) FROM outbox.consumed") == 4
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="needs older_than"):
        pg.sql("SELECT outbox.purge_consumed()")
    assert pg.value("SELECT outbox.purge_consumed(interval '1 year')") == 3


def test_without_the_preload_consume_once_refuses_and_a_session_cannot_set_the_window(make_relay):
    """The library is not preloaded any more (removed after CREATE EXTENSION): then
    outbox.consumed_retention is only a placeholder a consumer role can SET. consume_once must not
    purge with that ('1s' would delete every consumer's marks and re-apply their events): it
    fails with the preload error and changes nothing."""
    pg = make_relay("127.0.0.1:9", workers=0)
    victim = "5f5149c4-5d91-5747-b479-d84c355ce43d"
    pg.sql("INSERT INTO outbox.consumed (consumer, event_id, consumed_at) "
           "VALUES ('victim', %s, now() - interval '1 hour')", (victim,))
    pg.sql("CREATE ROLE hostile_consumer LOGIN")
    pg.sql("GRANT USAGE ON SCHEMA outbox TO hostile_consumer")
    pg.sql("GRANT EXECUTE ON FUNCTION outbox.consume_once(text, uuid) TO hostile_consumer")
    with open(os.path.join(pg.datadir, "postgresql.conf"), "a") as conf:
        conf.write("shared_preload_libraries = ''\n")
    pg.restart()

    with psycopg.connect(host=pg.tmp, port=pg.port, dbname=pg.database, user="hostile_consumer",
                         autocommit=True) as hostile:
        hostile.execute("SET outbox.consumed_retention = '1s'")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                           match="must be loaded via shared_preload_libraries"):
            hostile.execute("SELECT outbox.consume_once('hostile', gen_random_uuid())")
    assert pg.sql("SELECT consumer FROM outbox.consumed") == [("victim",)]
