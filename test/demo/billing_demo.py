#!/usr/bin/python3
"""Billing demo: a subscription-billing application publishes its domain events to a real Apache
Kafka broker through the outbox extension, and the demo proves that what arrived is exactly what
the application committed.

What it does, start to finish (test/demo/run sets up the machine and calls this):

  1. starts a single-node Kafka broker and creates billing.invoices and billing.payments
     (6 partitions each);
  2. starts a throwaway PostgreSQL with outbox preloaded: 2 relay workers pointed at the broker;
  3. runs a burst of business transactions for ~200 subscriptions from several concurrent
     sessions: each transaction changes the invoices table AND enqueues its event
     (invoice.created / invoice.paid -> billing.invoices, payment.failed -> billing.payments;
     key = subscription id, deterministic event_id = outbox.event_id(invoice_id, kind)).
     One transaction is rolled back after its enqueue (nothing may reach Kafka), and one payment
     webhook is replayed (its enqueue returns NULL: the duplicate collapses);
  4. prints outbox.backlog while the relay drains, until everything is published;
  5. reads both topics back with a Kafka consumer and checks: nothing lost, every subscription's
     events in enqueue order on one partition, the partition/offset the relay recorded matches
     Kafka, the rolled-back event absent;
  6. prints outbox.backlog and outbox.workers;
  7. stops the broker and the cluster and removes their temp dirs, also on failure or Ctrl-C.

Exit status 0 when every check passes, 1 otherwise.

Run it through test/demo/run (it installs, builds and switches to an unprivileged user). Directly,
as a non-root user with the extension installed:

    PATH=/usr/lib/postgresql/15/bin:$PATH /usr/bin/python3 test/demo/billing_demo.py [--subscriptions N]
"""

import argparse
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # test/

import psycopg  # noqa: E402

from harness.kafka_broker import KafkaBroker  # noqa: E402
from harness.kafka_reader import check_delivery, read_topic  # noqa: E402
from harness.pg_cluster import PgCluster  # noqa: E402
from harness.wait import wait_until  # noqa: E402

INVOICES_TOPIC = "billing.invoices"
PAYMENTS_TOPIC = "billing.payments"
PARTITIONS = 6
RELAY_WORKERS = 2

# Which topic each kind of event goes to.
TOPIC_OF = {
    "invoice.created": INVOICES_TOPIC,
    "invoice.paid": INVOICES_TOPIC,
    "payment.failed": PAYMENTS_TOPIC,
}

PLAN_PRICES_CENTS = [1900, 4900, 9900, 24900]


# --- output ----------------------------------------------------------------------------------

T0 = time.monotonic()


def say(message=""):
    print(message, flush=True)


def step(title):
    say(f"\n== [{time.monotonic() - T0:5.1f}s] {title}")


def fmt(value):
    """A cell as text: short intervals and timestamps, '-' for NULL."""
    if value is None:
        return "-"
    if isinstance(value, timedelta):
        return f"{value.total_seconds():.2f}s"
    if isinstance(value, datetime):
        return value.strftime("%H:%M:%S.%f")[:-3]
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def print_table(headers, rows, indent="   "):
    """An aligned text table: numbers right-aligned, everything else left-aligned."""
    cells = [[fmt(v) for v in row] for row in rows]
    numeric = [any(isinstance(row[i], (int, float)) for row in rows) and
               all(isinstance(row[i], (int, float)) or row[i] is None for row in rows)
               for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values):
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return (indent + "  ".join(parts)).rstrip()

    say(line(headers))
    say(indent + "  ".join("-" * w for w in widths))
    for r in cells:
        say(line(r))
    if not rows:
        say(indent + "(no rows)")


# --- the business application ----------------------------------------------------------------

SCHEMA_SQL = """
CREATE TABLE invoices (
    invoice_id      text        PRIMARY KEY,
    subscription_id text        NOT NULL,
    amount_cents    integer     NOT NULL CHECK (amount_cents > 0),
    status          text        NOT NULL CHECK (status IN ('open', 'past_due', 'paid')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON invoices (subscription_id);

-- The application's own role: it writes its table and may call outbox.enqueue(), nothing else
-- of the outbox (enqueue is SECURITY DEFINER, so no privilege on outbox.events is needed).
CREATE ROLE billing_app LOGIN;
GRANT SELECT, INSERT, UPDATE ON invoices TO billing_app;
GRANT USAGE ON SCHEMA outbox TO billing_app;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, jsonb, uuid, integer, text, text, boolean, text, text) TO billing_app;
GRANT EXECUTE ON FUNCTION outbox.event_id(text, text) TO billing_app;
"""

# One event: key = subscription, JSON payload, an event_type header, and an event_id that is a
# function of (invoice, kind), so running the same business operation twice yields the same id.
ENQUEUE_SQL = """
SELECT outbox.enqueue(
    %(topic)s,
    %(subscription)s,
    jsonb_build_object('type', %(kind)s::text, 'invoice', %(invoice)s::text,
                       'subscription', %(subscription)s::text, 'amount_cents', %(amount)s::int),
    jsonb_build_object('event_type', %(kind)s::text),
    outbox.event_id(%(invoice)s::text, %(kind)s::text))::text
"""

# The business change of each kind of operation.
BUSINESS_SQL = {
    "invoice.created": "INSERT INTO invoices (invoice_id, subscription_id, amount_cents, status) "
                       "VALUES (%(invoice)s, %(subscription)s, %(amount)s, 'open')",
    "payment.failed": "UPDATE invoices SET status = 'past_due', updated_at = now() "
                      "WHERE invoice_id = %(invoice)s AND status = 'open'",
    "invoice.paid": "UPDATE invoices SET status = 'paid', updated_at = now() "
                    "WHERE invoice_id = %(invoice)s AND status IN ('open', 'past_due')",
}


class TaxServiceTimeout(Exception):
    """Raised by the demo inside a transaction, after its enqueue, to force a rollback."""


def business_op(conn, kind, subscription, invoice, amount, fail_after_enqueue=False):
    """One business transaction: the table change and its event commit or roll back together.
    Returns (event_id or None when the event already existed, rows the business change touched)."""
    params = {"topic": TOPIC_OF[kind], "kind": kind, "subscription": subscription,
              "invoice": invoice, "amount": amount}
    with conn.transaction():
        touched = conn.execute(BUSINESS_SQL[kind], params).rowcount
        event_id = conn.execute(ENQUEUE_SQL, params).fetchone()[0]
        if fail_after_enqueue:
            raise TaxServiceTimeout(event_id)
    return event_id, touched


def subscription_history(rng, n):
    """The operations of subscription n, in order: 1-3 monthly invoices, each created, maybe a
    failed card payment first, then (usually) paid."""
    subscription = f"sub_{n:04d}"
    amount = rng.choice(PLAN_PRICES_CENTS)
    ops = []
    for month in range(1, rng.randint(1, 3) + 1):
        invoice = f"inv_{n:04d}_{month:02d}"
        ops.append(("invoice.created", subscription, invoice, amount))
        failed = rng.random() < 0.3
        if failed:
            ops.append(("payment.failed", subscription, invoice, amount))
        if not failed or rng.random() < 0.7:
            ops.append(("invoice.paid", subscription, invoice, amount))
    return ops


class Session(threading.Thread):
    """One application session: runs the histories of its subscriptions, interleaved at random
    (each subscription's own operations stay in order), one transaction per operation.

    Results: enqueued[(topic, key)] = [event_id, ...] in enqueue order; kinds[event_id] = kind."""

    def __init__(self, pg, histories, seed):
        super().__init__(daemon=True)
        self.pg = pg
        self.histories = [list(h) for h in histories]
        self.rng = random.Random(seed)
        self.enqueued = defaultdict(list)
        self.kinds = {}
        self.transactions = 0
        self.error = None

    def run(self):
        try:
            with app_connect(self.pg) as conn:
                queues = [h for h in self.histories if h]
                while queues:
                    i = self.rng.randrange(len(queues))
                    kind, subscription, invoice, amount = queues[i].pop(0)
                    if not queues[i]:
                        del queues[i]
                    event_id, _ = business_op(conn, kind, subscription, invoice, amount)
                    if event_id is None:  # every operation of the burst is a new one
                        raise RuntimeError(f"enqueue of new {kind} for {invoice} returned NULL")
                    self.transactions += 1
                    self.enqueued[(TOPIC_OF[kind], subscription)].append(event_id)
                    self.kinds[event_id] = kind
        except Exception as e:  # reported by the main thread
            self.error = e


def app_connect(pg):
    """A connection as the application role (trust authentication on the cluster's socket)."""
    return psycopg.connect(host=pg.tmp, port=pg.port, user="billing_app", dbname=pg.database,
                           autocommit=True)


# --- monitoring ------------------------------------------------------------------------------

def backlog_view(pg):
    """outbox.backlog as it is: one row per topic with events."""
    return pg.sql("SELECT topic, pending, in_flight, failed, published, oldest_pending_age "
                  "FROM outbox.backlog ORDER BY topic")


def backlog(pg):
    """outbox.backlog, with a row of zeros for a demo topic that has no events (yet)."""
    return pg.sql("SELECT t.topic, coalesce(b.pending, 0), coalesce(b.in_flight, 0), "
                  "       coalesce(b.failed, 0), coalesce(b.published, 0), b.oldest_pending_age "
                  "FROM unnest(%s::text[]) AS t(topic) "
                  "LEFT JOIN outbox.backlog b USING (topic) ORDER BY t.topic",
                  ([INVOICES_TOPIC, PAYMENTS_TOPIC],))


BACKLOG_HEADERS = ["topic", "pending", "in_flight", "failed", "published", "oldest_pending_age"]


def print_workers(pg):
    rows = pg.sql("SELECT worker, pid, state, published, failed, last_error, last_error_at, "
                  "last_publish_at, broker_state, started_at FROM outbox.workers ORDER BY worker")
    print_table(["worker", "pid", "state", "published", "failed", "last_error", "last_error_at",
                 "last_publish_at", "broker_state", "started_at"], rows)


def drain(pg, sessions, expected_total, timeout):
    """While the sessions run and until the relay has nothing left: a backlog snapshot about every
    quarter second (one row per topic). Returns when nothing is pending or in flight."""
    rows = []
    last_print = [0.0]

    def snapshot():
        now = time.monotonic()
        if any(s.error is not None for s in sessions):
            return True  # the caller reports the session's error
        burst_running = any(s.is_alive() for s in sessions)
        current = backlog(pg)
        done = (not burst_running and
                sum(r[1] + r[2] for r in current) == 0 and
                sum(r[1] + r[2] + r[3] + r[4] for r in current) >= expected_total())
        if done or now - last_print[0] >= 0.25:
            last_print[0] = now
            phase = "burst" if burst_running else "drain"
            for r in current:
                rows.append((f"{now - T0:.1f}s", phase) + tuple(r))
        return done

    try:
        wait_until(snapshot, timeout=timeout, what="the outbox to drain", interval=0.1)
    finally:
        print_table(["t", "phase"] + BACKLOG_HEADERS, rows)


# --- checks ----------------------------------------------------------------------------------

class Verdict:
    def __init__(self):
        self.failures = []

    def check(self, ok, what):
        if not ok:
            self.failures.append(what)
        return ok


def log_problems(pg, limit=15):
    """WARNING/ERROR/FATAL/PANIC lines of the server log and crashed processes."""
    pattern = re.compile(r"\b(WARNING|ERROR|FATAL|PANIC):|terminated by signal")
    lines = [line for line in pg.log().splitlines() if pattern.search(line)]
    return lines, lines[-limit:]


# --- the demo --------------------------------------------------------------------------------

def run(args):
    verdict = Verdict()
    rng = random.Random(args.seed)

    step("starting a Kafka broker (Apache Kafka 4.1.1, KRaft, single node)")
    with KafkaBroker() as kb:
        for topic in (INVOICES_TOPIC, PAYMENTS_TOPIC):
            kb.create_topic(topic, partitions=PARTITIONS)
        say(f"   broker {kb.bootstrap}, topics {INVOICES_TOPIC} and {PAYMENTS_TOPIC} "
            f"({PARTITIONS} partitions each)")

        step(f"starting PostgreSQL with outbox preloaded ({RELAY_WORKERS} relay workers)")
        settings = {"outbox.bootstrap_servers": f"'{kb.bootstrap}'",
                    "outbox.workers": str(RELAY_WORKERS)}
        pg = PgCluster(settings=settings)
        failed = True
        try:
            pg.init().start().setup_database()
            demo(pg, kb, args, rng, verdict)
            failed = bool(verdict.failures)
        finally:
            try:
                report_server_log(pg, failed)
            finally:
                cleanup_cluster(pg)
    return verdict


def report_server_log(pg, failed):
    """Anything the server complained about, and on failure the log's tail."""
    if not os.path.exists(pg.log_path):
        return
    lines, shown = log_problems(pg)
    if lines:
        step(f"server log: {len(lines)} warning/error lines (last {len(shown)})")
        for line in shown:
            say("   " + line)
    if failed:
        say(f"\n--- tail of the server log {pg.log_path} ---")
        say("\n".join(pg.log().splitlines()[-40:]))


def cleanup_cluster(pg):
    """Stop the cluster and remove its temp dir. PgCluster.cleanup() stops the server only once
    start() has returned; after an interrupt during start-up a postmaster may run all the same,
    so stop whatever runs in the data directory."""
    if os.path.exists(os.path.join(pg.datadir, "postmaster.pid")):
        pg.started = True
    pg.cleanup()


def demo(pg, kb, args, rng, verdict):
    say(f"   server version {pg.value('SHOW server_version')}, port {pg.port}, "
        f"outbox {pg.value('SELECT extversion FROM pg_extension WHERE extname = %s', ('outbox',))}")
    pg.wait_workers_running(RELAY_WORKERS)
    pg.sql(SCHEMA_SQL)

    # -- 3. the burst ---------------------------------------------------------------------------
    histories = [subscription_history(rng, n) for n in range(1, args.subscriptions + 1)]
    planned = sum(len(h) for h in histories)
    step(f"business burst: {args.subscriptions} subscriptions, {planned} transactions, "
         f"{args.sessions} concurrent sessions")
    sessions = [Session(pg, histories[i::args.sessions], seed=args.seed * 100 + i)
                for i in range(args.sessions)]
    burst_started = time.monotonic()
    for s in sessions:
        s.start()

    def enqueued_so_far():
        return sum(s.transactions for s in sessions)

    drain(pg, sessions, lambda: planned, timeout=args.timeout)
    for s in sessions:
        s.join()
        if s.error is not None:
            raise RuntimeError(f"a business session failed: {s.error!r}") from s.error
    burst_seconds = time.monotonic() - burst_started
    say(f"   {enqueued_so_far()} transactions committed and published in {burst_seconds:.1f}s")

    enqueued = defaultdict(list)
    kinds = {}
    for s in sessions:
        enqueued.update(s.enqueued)  # sessions own disjoint subscriptions
        kinds.update(s.kinds)

    # -- the rolled-back transaction --------------------------------------------------------------
    step("a transaction that rolls back after its enqueue")
    rb_sub, rb_invoice, rb_amount = "sub_0001", "inv_0001_99", 24900
    with app_connect(pg) as conn:
        try:
            business_op(conn, "invoice.created", rb_sub, rb_invoice, rb_amount, fail_after_enqueue=True)
            raise AssertionError("the transaction was expected to fail")
        except TaxServiceTimeout as e:
            rolled_back_id = str(e)
    say(f"   invoice {rb_invoice}: INSERT + enqueue returned {rolled_back_id}, then the tax "
        "service timed out -> ROLLBACK")
    rb_rows = pg.value("SELECT count(*) FROM outbox.events WHERE event_id = %s", (rolled_back_id,))
    rb_invoices = pg.value("SELECT count(*) FROM invoices WHERE invoice_id = %s", (rb_invoice,))
    say(f"   rows left behind: outbox.events {rb_rows}, invoices {rb_invoices}")
    verdict.check(rb_rows == 0 and rb_invoices == 0, "the rolled-back transaction left rows behind")

    # -- the replayed operation -------------------------------------------------------------------
    step("a replayed payment webhook (same business operation twice)")
    paid = pg.sql("SELECT subscription_id, invoice_id, amount_cents FROM invoices "
                  "WHERE status = 'paid' ORDER BY invoice_id LIMIT 1")
    replay_sub, replay_invoice, replay_amount = paid[0]
    with app_connect(pg) as conn:
        replay_id, touched = business_op(conn, "invoice.paid", replay_sub, replay_invoice, replay_amount)
    original_id = pg.value("SELECT outbox.event_id(%s, 'invoice.paid')::text", (replay_invoice,))
    say(f"   invoice {replay_invoice}: UPDATE touched {touched} rows, enqueue returned "
        f"{'NULL' if replay_id is None else replay_id}")
    say(f"   (its event_id {original_id} = outbox.event_id('{replay_invoice}', 'invoice.paid') "
        "was enqueued once, by the first delivery)")
    verdict.check(replay_id is None, "the replayed operation enqueued a second event")
    verdict.check(original_id in kinds, "the replayed invoice's original event is not in the enqueue log")

    total_enqueued = sum(len(ids) for ids in enqueued.values())
    db_rows = pg.value("SELECT count(*) FROM outbox.events")
    verdict.check(db_rows == total_enqueued,
                  f"outbox.events holds {db_rows} rows, the application enqueued {total_enqueued}")

    # -- 4. everything published ----------------------------------------------------------------
    step("waiting until every event is published")
    pg.wait_published(total_enqueued, timeout=args.timeout)
    print_table(BACKLOG_HEADERS, backlog_view(pg))

    # -- 5. read Kafka back ---------------------------------------------------------------------
    step("reading billing.invoices and billing.payments back with a Kafka consumer")
    expected_by_topic = defaultdict(dict)
    for (topic, key), ids in enqueued.items():
        expected_by_topic[topic][key] = ids
    records = {}
    for topic in (INVOICES_TOPIC, PAYMENTS_TOPIC):
        want = sum(len(ids) for ids in expected_by_topic[topic].values())
        # settle: keep reading a little after the expected count, so duplicates would show.
        records[topic] = read_topic(kb.bootstrap, topic, want, timeout=60, settle=True)

    print_sample(records, enqueued)
    summarize(pg, records, expected_by_topic, kinds, rolled_back_id, replay_invoice, verdict)

    # -- 6. final state ---------------------------------------------------------------------------
    step("outbox.backlog")
    print_table(BACKLOG_HEADERS, backlog_view(pg))
    step("outbox.workers")
    print_workers(pg)


def print_sample(records, enqueued):
    """The whole story of a few subscriptions, as Kafka has it."""
    stories = sorted({key for (topic, key) in enqueued if topic == PAYMENTS_TOPIC})[:2]
    stories += sorted(key for (topic, key), ids in enqueued.items()
                      if topic == INVOICES_TOPIC and len(ids) >= 6 and key not in stories)[:1]
    step(f"sample: every record of {', '.join(stories)}")
    rows = []
    for topic, recs in records.items():
        for r in recs:
            key = r.key.decode() if r.key is not None else None
            if key in stories:
                payload = json.loads(r.value)
                rows.append((topic, r.partition, r.offset, key, r.event_id, r.headers.get("event_type"),
                             payload.get("invoice"), payload.get("amount_cents")))
    rows.sort(key=lambda row: (row[3], row[0], row[2]))
    print_table(["topic", "partition", "offset", "key", "event_id header", "event_type", "invoice",
                 "amount_cents"], rows)


def summarize(pg, records, expected_by_topic, kinds, rolled_back_id, replay_invoice, verdict):
    step("summary")
    rows = []
    received_all = [r for recs in records.values() for r in recs]

    # Per topic: counts, losses, duplicates, per-key order, one partition per key.
    for topic, recs in records.items():
        expected = expected_by_topic[topic]
        check = check_delivery(recs, expected)
        partitions_of_key = defaultdict(set)
        for r in recs:
            partitions_of_key[r.key].add(r.partition)
        split_keys = [k for k, ps in partitions_of_key.items() if len(ps) > 1]
        unexpected = {r.event_id for r in recs} - {e for ids in expected.values() for e in ids}
        in_order = not check.order_violations and not split_keys
        rows.append((topic, sum(len(ids) for ids in expected.values()), check.delivered, check.unique,
                     len(check.lost), check.duplicates, len(unexpected), len(expected),
                     "ok" if in_order else f"{len(check.order_violations) + len(split_keys)} keys wrong"))
        verdict.check(not check.lost, f"{topic}: {len(check.lost)} events lost, e.g. {check.lost[:3]}")
        verdict.check(not check.order_violations,
                      f"{topic}: per-key order broken for {check.order_violations[:5]}")
        verdict.check(not split_keys, f"{topic}: keys on more than one partition: {split_keys[:5]}")
        verdict.check(not unexpected, f"{topic}: {len(unexpected)} records nobody enqueued")
    totals = tuple(sum(r[i] for r in rows) for i in range(1, 8))
    rows.append(("total",) + totals + ("ok" if all(r[8] == "ok" for r in rows) else "FAILED",))
    print_table(["topic", "enqueued", "received", "unique ids", "lost", "duplicates", "unexpected",
                 "keys", "per-key order"], rows)

    # Per event type: what the application enqueued vs what Kafka carries (event_type header).
    enq_types = Counter(kinds.values())
    got_types = Counter(r.headers.get("event_type") for r in received_all)
    say("")
    print_table(["event_type", "enqueued", "received"],
                [(t, enq_types[t], got_types[t]) for t in sorted(set(enq_types) | set(got_types))])

    # The headers and payload agree with each other and with the key.
    mismatched = 0
    for r in received_all:
        payload = json.loads(r.value)
        if (payload.get("type") != r.headers.get("event_type") or kinds.get(r.event_id) != payload.get("type")
                or payload.get("subscription") != (r.key.decode() if r.key is not None else None)):
            mismatched += 1
    verdict.check(mismatched == 0, f"{mismatched} records whose key/headers/payload disagree")

    # The partition and offset the relay recorded are where the record really is.
    recorded = {row[0]: (row[1], row[2]) for row in
                pg.sql("SELECT event_id::text, kafka_partition, kafka_offset FROM outbox.events")}
    wrong_position = [r.event_id for r in received_all
                      if recorded.get(r.event_id) != (r.partition, r.offset)]
    verdict.check(not wrong_position,
                  f"{len(wrong_position)} records not at the partition/offset outbox.events recorded")

    rolled_back_found = sum(1 for r in received_all if r.event_id == rolled_back_id)
    rolled_back_invoice = sum(1 for r in received_all if json.loads(r.value).get("invoice") == "inv_0001_99")
    replay_copies = sum(1 for r in received_all
                        if r.headers.get("event_type") == "invoice.paid"
                        and json.loads(r.value).get("invoice") == replay_invoice)
    verdict.check(rolled_back_found == 0 and rolled_back_invoice == 0,
                  f"the rolled-back event reached Kafka ({rolled_back_found} records)")
    verdict.check(replay_copies == 1, f"the replayed payment is in Kafka {replay_copies} times, not once")

    say("")
    print_table(["check", "result"], [
        ("events enqueued (committed)", sum(len(ids) for exp in expected_by_topic.values()
                                            for ids in exp.values())),
        ("records received from Kafka", len(received_all)),
        ("unique event_ids received", len({r.event_id for r in received_all})),
        ("per-key order (enqueue order, one partition per key)",
         "ok" if rows[-1][8] == "ok" else "FAILED"),
        ("partition/offset recorded in outbox.events match Kafka",
         "ok" if not wrong_position else f"{len(wrong_position)} wrong"),
        ("key / event_type header / payload consistent", "ok" if mismatched == 0 else f"{mismatched} wrong"),
        ("rolled-back event found in Kafka", rolled_back_found),
        (f"copies of the replayed invoice.paid ({replay_invoice})", replay_copies),
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscriptions", type=int, default=200, help="subscriptions to bill (default 200)")
    parser.add_argument("--sessions", type=int, default=4, help="concurrent application sessions (default 4)")
    parser.add_argument("--seed", type=int, default=7, help="random seed of the business histories")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds allowed for draining")
    args = parser.parse_args(argv)
    if args.subscriptions < 3 or args.sessions < 1:
        parser.error("need at least 3 subscriptions and 1 session")

    # SIGTERM (and SIGINT, which a shell may have set to ignored for background jobs) unwind
    # through the with blocks, so the broker and the cluster are always stopped and removed.
    # Further signals are ignored from then on, so that the clean-up itself runs to its end.
    def on_signal(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        say(f"\nbilling demo: interrupted by signal {signum}, cleaning up")
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        verdict = run(args)
    except Exception as e:
        say(f"\nbilling demo: ERROR: {type(e).__name__}: {e}")
        say(f"billing demo: FAILED after {time.monotonic() - T0:.1f}s")
        return 1
    if verdict.failures:
        say("\nbilling demo: FAILED")
        for f in verdict.failures:
            say(f"   - {f}")
        say(f"   ({time.monotonic() - T0:.1f}s)")
        return 1
    say(f"\nbilling demo: OK - every committed event arrived once, in per-key order; nothing "
        f"rolled back or replayed leaked ({time.monotonic() - T0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
