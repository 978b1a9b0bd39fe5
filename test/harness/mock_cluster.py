#!/usr/bin/python3
"""A librdkafka mock Kafka cluster in a child process, for fault injection.

Wraps test/mockbroker/mockbroker (built on demand with make):

    with MockCluster(brokers=3, topics={"events": 4}) as mc:
        producer = Producer({"bootstrap.servers": mc.bootstrap, ...})
        mc.produce_errors(1, 87)      # next Produce request: INVALID_RECORD
        mc.down(1); mc.up(1)

Every command waits for the program's reply with a deadline and raises
MockClusterError unless it is OK, so a wedged mock fails the test instead of
hanging it.

Run directly:
    /usr/bin/python3 test/harness/mock_cluster.py --smoke     # self-test
    /usr/bin/python3 test/harness/mock_cluster.py --classify  # error table

Use the system python (Debian's python3-confluent-kafka links the system
librdkafka 2.0.2, the same library the extension uses).
"""

import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MOCKBROKER_DIR = Path(__file__).resolve().parents[1] / "mockbroker"
MOCKBROKER = MOCKBROKER_DIR / "mockbroker"


class MockClusterError(RuntimeError):
    pass


def build_mockbroker():
    """Runs make (a no-op when the binary is up to date)."""
    res = subprocess.run(["make", "-C", str(MOCKBROKER_DIR), "mockbroker"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    if res.returncode != 0:
        raise MockClusterError("building mockbroker failed:\n" + res.stdout)
    return MOCKBROKER


class MockCluster:
    """A running mockbroker process; start-up happens in the constructor.

    topics: a mapping {name: partitions} or an iterable of (name, partitions).
    nodelay=False reproduces the stock 2.0.2 mock (no TCP_NODELAY).
    """

    def __init__(self, brokers=3, topics=(), nodelay=True, debug=None,
                 start_timeout=30.0, command_timeout=10.0):
        self.brokers = brokers
        self.command_timeout = command_timeout
        self.bootstrap = None
        self._buf = b""
        self._proc = None
        self._wedged = False
        self.returncode = None

        if hasattr(topics, "items"):
            topics = topics.items()
        args = [str(build_mockbroker()), "--brokers", str(brokers)]
        for name, partitions in topics:
            args += ["--topic", f"{name}:{partitions}"]
        if not nodelay:
            args.append("--no-nodelay")
        if debug:
            args += ["--debug", debug]

        # stderr (librdkafka logs, the exit summary) goes to a file opened
        # O_APPEND, so we can read it back at any time without moving the
        # child's write position.
        fd, self.stderr_path = tempfile.mkstemp(prefix="mockbroker-",
                                                suffix=".log")
        os.close(fd)
        try:
            with open(self.stderr_path, "ab") as err:
                self._proc = subprocess.Popen(args, stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE,
                                              stderr=err)
        except BaseException:
            os.unlink(self.stderr_path)
            raise
        try:
            line = self._read_line(time.monotonic() + start_timeout)
            if not line.startswith("BOOTSTRAP "):
                raise MockClusterError(f"unexpected first line {line!r}")
            self.bootstrap = line.split(" ", 1)[1]
        except BaseException:
            self.close(timeout=2.0)
            raise

    # -- context manager ------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def pid(self):
        return self._proc.pid

    def stderr_text(self):
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    # -- protocol -------------------------------------------------------
    def _read_line(self, deadline):
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                # A late reply would be taken for the next command's: this
                # process is no longer usable.
                self._wedged = True
                raise MockClusterError("timed out waiting for mockbroker; "
                                       "stderr:\n" + self.stderr_text())
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                try:
                    rc = self._proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    rc = "?"  # closed its stdout but still running
                raise MockClusterError(f"mockbroker exited (rc={rc}); "
                                       "stderr:\n" + self.stderr_text())
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def command(self, line, timeout=None):
        """Sends one command; returns the text after OK, raises otherwise."""
        if self._proc is None or self._proc.poll() is not None:
            raise MockClusterError("mockbroker is not running")
        if self._wedged:
            raise MockClusterError("mockbroker did not answer an earlier "
                                   "command in time")
        deadline = time.monotonic() + (timeout or self.command_timeout)
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise MockClusterError("mockbroker exited; stderr:\n"
                                   + self.stderr_text()) from None
        reply = self._read_line(deadline)
        if reply != "OK" and not reply.startswith("OK "):
            raise MockClusterError(f"{line!r}: {reply}")
        return reply[3:]

    # -- commands -------------------------------------------------------
    def down(self, broker_id):
        self.command(f"down {broker_id}")

    def up(self, broker_id):
        self.command(f"up {broker_id}")

    def rtt(self, broker_id_or_all, ms):
        """Sets a broker's (or "all" brokers') RTT. librdkafka 2.0.2 can hang
        on this after a down/up: set RTTs before an outage."""
        self.command(f"rtt {broker_id_or_all} {int(ms)}")

    def produce_errors(self, count, errcode):
        """The next `count` Produce requests (one per partition batch, on any
        broker) fail with `errcode`."""
        self.command(f"produce_errors {int(count)} {int(errcode)}")

    def topic_error(self, topic, errcode):
        """Error returned for `topic` in Metadata responses (0 clears it)."""
        self.command(f"topic_error {topic} {int(errcode)}")

    def create_topic(self, name, partitions):
        self.command(f"create_topic {name} {int(partitions)}")

    def stats(self):
        """{"accepted": TCP connections accepted, "nodelay": of which with
        TCP_NODELAY verified on}."""
        fields = dict(kv.split("=") for kv in self.command("stats").split())
        return {k: int(v) for k, v in fields.items()}

    def close(self, timeout=10.0):
        """Sends quit and waits up to `timeout`, then kills. Idempotent;
        returns the exit code."""
        proc = self._proc
        if proc is None:
            return self.returncode
        deadline = time.monotonic() + timeout
        if proc.poll() is None:
            try:
                self.command("quit", timeout=timeout)
            except MockClusterError:
                pass  # dead or wedged: the wait below decides
            try:
                proc.stdin.close()  # EOF also makes it exit
            except OSError:
                pass
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        self.returncode = proc.returncode
        self._proc = None
        try:
            os.unlink(self.stderr_path)
        except FileNotFoundError:
            pass
        return self.returncode


# ---------------------------------------------------------------------------
# Self-test and error classification (need confluent_kafka)
# ---------------------------------------------------------------------------

def _producer(bootstrap, **extra):
    from confluent_kafka import Producer
    errors = []
    conf = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
        # Reconnect quickly after a broker comes back up.
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "error_cb": errors.append,
    }
    conf.update(extra)
    return Producer(conf), errors  # errors: what error_cb saw, fatal or not


def _produce_wait(producer, topic, records, timeout=15.0, raised=None):
    """Produces [(key, value, partition or None)] and flushes with a bound.
    Returns one (error or None, partition, offset) per record, or None for
    a record whose delivery report did not arrive in time. Errors that
    flush() raises (fatal ones) are appended to `raised`."""
    from confluent_kafka import KafkaException
    results = [None] * len(records)

    def on_delivery(i):
        return lambda err, msg: results.__setitem__(
            i, (err, msg.partition(), msg.offset()))

    for i, (key, value, partition) in enumerate(records):
        kw = {} if partition is None else {"partition": partition}
        producer.produce(topic, value=value, key=key,
                         on_delivery=on_delivery(i), **kw)
        producer.poll(0)
    deadline = time.monotonic() + timeout
    while None in results and time.monotonic() < deadline:
        try:
            producer.flush(max(0.0, deadline - time.monotonic()))
        except KafkaException as e:
            # A fatal error surfaces here (not in error_cb); keep flushing:
            # the purged messages still get their delivery reports.
            if raised is not None:
                raised.append(e.args[0])
    return results


def _consume_all(bootstrap, topic, partitions, expected, timeout=15.0):
    """Reads every partition from the beginning until `expected` messages
    have arrived or the deadline passes. Returns ([(partition, key, value)]
    in per-partition offset order, number of messages in the log according
    to the watermarks)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "mock-smoke",
                  "enable.auto.commit": False})
    try:
        in_log = 0
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p),
                                             timeout=timeout)
            in_log += hi - lo
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                  for p in range(partitions)])
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < expected and time.monotonic() < deadline:
            for m in c.consume(expected - len(got), timeout=0.2):
                if m.error() is None:
                    got.append((m.partition(), m.key(), m.value()))
        return got, in_log
    finally:
        c.close()


class _Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"  ok   {name}")
        else:
            self.failed += 1
            print(f"  FAIL {name} {detail}")
        return ok


def smoke():
    from confluent_kafka import KafkaError
    topic, partitions, n = "smoke", 4, 50
    check = _Checks()
    try:
        with MockCluster(brokers=3, topics={topic: partitions}) as mc:
            check("three bootstrap brokers", len(mc.bootstrap.split(",")) == 3,
                  mc.bootstrap)
            p, p_errors = _producer(mc.bootstrap)

            # 1. Keyed idempotent produce, then read everything back.
            records = [(f"key-{i % 10}", f"value-{i}", None) for i in range(n)]
            res = _produce_wait(p, topic, records)
            check(f"{n} keyed messages delivered",
                  all(r is not None and r[0] is None for r in res), res)
            got, in_log = _consume_all(mc.bootstrap, topic, partitions, n)
            check(f"{n} messages consumed back", len(got) == n == in_log,
                  (len(got), in_log))
            by_key = {}  # key -> [(partition, produce index)] in log order
            for part, key, value in got:
                by_key.setdefault(key, []).append(
                    (part, int(value.split(b"-")[1])))
            check("each key on one partition, in produce order",
                  all(len({part for part, _ in v}) == 1 and
                      [i for _, i in v] == sorted(i for _, i in v)
                      for v in by_key.values()), by_key)

            st = mc.stats()
            check("TCP_NODELAY on every accepted socket",
                  st["accepted"] > 0 and st["nodelay"] == st["accepted"], st)

            # 2. A permanent error fails exactly the message whose request
            #    gets it; the next messages go through.
            mc.produce_errors(1, KafkaError.INVALID_RECORD)
            res = _produce_wait(p, topic, [("bad", "poisoned", 0)])
            err = res[0][0] if res[0] else None
            check("injected INVALID_RECORD fails that message",
                  err is not None and err.code() == KafkaError.INVALID_RECORD,
                  res)
            res = _produce_wait(p, topic, [(f"after-{i}", f"after-{i}", 0)
                                    for i in range(5)])
            check("next messages succeed",
                  all(r is not None and r[0] is None for r in res), res)
            check("no fatal producer error",
                  not any(e.fatal() for e in p_errors), p_errors)

            # 3. Broker outage: messages for a partition it leads wait, then
            #    go through once it is back.
            md = p.list_topics(topic, timeout=10)
            leaders = {pid: pm.leader
                       for pid, pm in md.topics[topic].partitions.items()}
            victim_part = min(leaders)
            victim = leaders[victim_part]
            mc.down(victim)
            for i in range(5):
                p.produce(topic, key=f"outage-{i}", value=f"outage-{i}",
                          partition=victim_part)
            # Absence needs a window: nothing can be acked with the leader
            # down, so a short bounded flush must leave all 5 queued.
            left = p.flush(0.5)
            check(f"broker {victim} down holds its partition's messages",
                  left == 5, left)
            mc.up(victim)
            left = p.flush(20)
            check(f"broker {victim} up delivers them", left == 0, left)

            # 4. The log holds everything except the failed message.
            total = n + 5 + 5
            got, in_log = _consume_all(mc.bootstrap, topic, partitions, total)
            values = [v for _, _, v in got]
            check(f"log holds {total} messages, not the failed one",
                  len(got) == total == in_log and b"poisoned" not in values,
                  (len(got), in_log))
            check("still no fatal producer error",
                  not any(e.fatal() for e in p_errors), p_errors)
            del p  # destroy the client before its brokers go away
            rc = mc.close()
            check("mockbroker exits 0", rc == 0, rc)
    except Exception as e:  # a crashed step is one more failure
        check("smoke run", False, repr(e))
    print(f"mock smoke: {check.passed} passed, {check.failed} failed")
    return 0 if check.failed == 0 else 1


# Codes tried by --classify: the ones the relay must classify, plus the
# usual retriable and idempotence-specific ones for comparison.
CLASSIFY_CODES = [2, 3, 6, 7, 10, 13, 17, 18, 19, 20, 21, 29, 31, 43, 45, 46,
                  47, 56, 59, 74, 75, 76, 87, -195]


def classify_one(code, gapless, timeout=15.0):
    """Injects one `code` into the Produce request of message A (after a
    warm-up message), then produces B. Returns what the idempotent producer
    did: the class, A's delivery report, B's fate and the client errors
    (error_cb, plus fatal errors raised by flush()).

    Classes: "a retried" = A delivered after an internal retry; "b permanent"
    = A's delivery report carries the error, the producer lives on;
    "c fatal" = the producer raised a fatal error and must be recreated."""
    from confluent_kafka import KafkaError, KafkaException
    topic = "c"
    with MockCluster(brokers=1, topics={topic: 1}) as mc:
        extra = {"enable.gapless.guarantee": True} if gapless else {}
        p, p_errors = _producer(mc.bootstrap, **extra)
        warm = _produce_wait(p, topic, [("w", "warm", 0)], timeout)
        if not warm[0] or warm[0][0] is not None:
            raise MockClusterError(f"warm-up failed: {warm}")
        mc.produce_errors(1, code)
        a = _produce_wait(p, topic, [("a", "A", 0)], timeout, p_errors)[0]
        # B: produce() itself may refuse for a while (or for good after a
        # fatal error); retry it until accepted or the deadline passes.
        b, refused, t0 = None, None, time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                b = _produce_wait(p, topic, [("b", "B", 0)], timeout,
                                  p_errors)[0]
                refused_for = time.monotonic() - t0
                break
            except KafkaException as e:
                refused = refused or e.args[0].name()
                if e.args[0].code() == KafkaError._FATAL:
                    break
                p.poll(0.1)
        del p
    fatal = [e for e in p_errors if e.fatal()]
    if fatal:
        kind = "c fatal"
    elif a is None:
        kind = "stuck"
    elif a[0] is None:
        kind = "a retried"
    else:
        kind = "b permanent"
    a_name = ("no report" if a is None else
              "delivered" if a[0] is None else a[0].name())
    if b is not None and b[0] is None:
        b_name = "delivered"
    elif b is not None:
        b_name = b[0].name()
    else:
        b_name = "not accepted"
    if refused:
        b_name += (f" (produce() raised {refused} for {refused_for:.1f} s)"
                   if b else
                   f" (produce() raised {refused})")
    return {"kind": kind, "a": a_name, "b": b_name,
            "errors": [e.name() + ("(fatal)" if e.fatal() else "")
                       for e in p_errors]}


def classify():
    from confluent_kafka import KafkaError
    print(f"{'code':>5} {'name':32} {'gapless':7} {'class':11} "
          f"{'message A':30} {'message B':55} client errors")
    for gapless in (False, True):
        for code in CLASSIFY_CODES:
            r = classify_one(code, gapless)
            print(f"{code:>5} {KafkaError(code).name():32} {str(gapless):7} "
                  f"{r['kind']:11} {r['a']:30} {r['b']:55} "
                  f"{','.join(r['errors'])}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--smoke"]:
        sys.exit(smoke())
    if sys.argv[1:] == ["--classify"]:
        sys.exit(classify())
    print(f"usage: {sys.argv[0]} --smoke | --classify", file=sys.stderr)
    sys.exit(2)
