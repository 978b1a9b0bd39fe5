#!/usr/bin/python3
"""A real single-node Apache Kafka broker (KRaft, broker+controller) for end-to-end tests.

The broker runs from the Maven Central jars that test/kafka/fetch-jars.sh caches, on the
machine's Java 17+, in a fresh temp dir, listening on two free loopback ports:

    from kafka_broker import KafkaBroker

    with KafkaBroker() as kb:
        kb.create_topic("events", partitions=3)   # returns once every partition has a leader
        run_tests(bootstrap=kb.bootstrap)         # "127.0.0.1:PORT"

    # An OAUTH listener (SASL_PLAINTEXT, OAUTHBEARER) whose tokens the broker checks against the
    # JWKS of a local OidcProvider (harness/oidc_provider.py), Kafka 4.x:
    with OidcProvider(clients={"relay": "s3cret"}) as idp, KafkaBroker(oauth=idp) as kb:
        kb.oauth_bootstrap

    # An operator's kafka-topics.sh (the release's TopicCommand) in a directory for PATH:
    with KafkaBroker(overrides={"auto.create.topics.enable": "false"}) as kb:
        kb.write_kafka_topics_sh(bindir)

    # TLS listeners (SECURE_LISTENERS) with a throwaway CA, SCRAM-SHA-512 users, Kafka 3.9:
    with KafkaBroker(secure=True, scram_users={"relay": "pw"}, release="3.9") as kb:
        kb.secure_bootstrap["SCRAM"], kb.ca.cert_pem, kb.ca.issue("client", client=True)

Command line (the system /usr/bin/python3 carries Debian's python3-confluent-kafka):

    python3 test/harness/kafka_broker.py --smoke   # start, produce 10, consume 10, stop
    python3 test/harness/kafka_broker.py --serve   # run a broker for a demo until Ctrl-C

Environment:
    OUTBOX_CACHE        cache root for the jars (default ~/.cache/outbox), see fetch-jars.sh
    OUTBOX_MAVEN_REPO   Maven local repository for fetch-jars.sh (default: Maven's ~/.m2)
    OUTBOX_KEEP_TMP     if set and non-empty, stop() keeps the temp dir (logs, data)
    JAVA_HOME           java is taken from $JAVA_HOME/bin, else from PATH

Only the standard library and confluent_kafka (for readiness checks and topic creation).
"""

import argparse
import base64
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid

_SYSTEM_PYTHON = "/usr/bin/python3"

try:
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError as _err:
    # Debian's python3-confluent-kafka lives in the system Python; a pyenv/venv python3 first
    # on PATH does not see it. When run as a script, re-run under the system interpreter.
    if (__name__ == "__main__" and os.path.exists(_SYSTEM_PYTHON)
            and os.path.realpath(sys.executable) != os.path.realpath(_SYSTEM_PYTHON)):
        print(f"kafka_broker: confluent_kafka not importable from {sys.executable}; "
              f"re-running under {_SYSTEM_PYTHON}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(_SYSTEM_PYTHON, [_SYSTEM_PYTHON, *sys.argv])
    raise ImportError("kafka_broker needs confluent_kafka: install python3-confluent-kafka "
                      f"and use {_SYSTEM_PYTHON}") from _err

try:
    from harness.tls_certs import STORE_PASSWORD, ThrowawayCa
except ImportError:  # run as a script from test/harness
    from tls_certs import STORE_PASSWORD, ThrowawayCa

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_KAFKA_DIR = os.path.join(_REPO, "test", "kafka")
FETCH_JARS = os.path.join(_KAFKA_DIR, "fetch-jars.sh")
# The broker releases the harness can run, by the pom whose jars fetch-jars.sh caches. 3.9:
# librdkafka before 2.6.1 (Debian 12 has 2.0.2) answers the SCRAM server-first message with a
# nonce that Kafka 4.x refuses as invalid credentials (librdkafka#4895); 3.x accepts it.
RELEASES = {"4.1": os.path.join(_KAFKA_DIR, "pom.xml"),
            "3.9": os.path.join(_KAFKA_DIR, "pom-3.9.xml"),
            # The newest release (its jars still target Java 17), for test_kafka_e2e.py.
            "4.4": os.path.join(_KAFKA_DIR, "pom-4.4.xml")}
LOG4J_CONFIG = os.path.join(_KAFKA_DIR, "log4j2.properties")

NODE_ID = 1

# With secure=True, the TLS listeners: name -> (security protocol, broker certificate,
# ssl.client.auth). SCRAM: TLS + SASL/SCRAM-SHA-512; MTLS: mutual TLS (a client certificate
# signed by the test CA is required); EXPIRED: like SCRAM, but its certificate has expired.
SECURE_LISTENERS = {
    "SCRAM": ("SASL_SSL", "valid", "none"),
    "MTLS": ("SSL", "valid", "required"),
    "EXPIRED": ("SASL_SSL", "expired", "none"),
}


class KafkaBrokerError(RuntimeError):
    """The broker could not be fetched, formatted, started or used."""


def _tail(path, lines=40):
    """Last `lines` lines of a text file, or a note that it is missing/empty."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"(cannot read {path}: {e.strerror})"
    if not text.strip():
        return f"({path} is empty)"
    return "\n".join(text.splitlines()[-lines:])


def _free_loopback_ports(count):
    """`count` distinct TCP ports that were free on 127.0.0.1 a moment ago.

    All sockets stay bound until every port is picked, so the ports differ from each other.
    Another process may still grab one before the broker binds it; the start-up error then
    shows "Address already in use" in the log tail.
    """
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _random_cluster_id():
    """A Kafka cluster id, as `StorageTool random-uuid` would print, without starting a JVM.

    Kafka ids are 16 random bytes in unpadded URL-safe base64 (22 characters); Kafka's own
    generator never hands out ids whose text starts with '-', so neither do we.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def _java():
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("java")
    if not found:
        raise KafkaBrokerError("java not found (set JAVA_HOME or put Java 17+ on PATH)")
    return found


class KafkaBroker:
    """One KRaft Kafka process acting as broker and controller (node id 1) on loopback.

    Use as a context manager, or call start() and stop() yourself; stop() is idempotent.

    Attributes valid after start():
        bootstrap        "127.0.0.1:PORT" of the PLAINTEXT listener, for bootstrap.servers
        secure_bootstrap with secure=True: {"SCRAM": ..., "MTLS": ..., "EXPIRED": ...}, the
                         bootstrap of each TLS listener (SECURE_LISTENERS)
        ca               with secure=True: the ThrowawayCa that signed the broker's
                         certificates and that the MTLS listener trusts for clients
        port             that broker port
        controller_port  the KRaft controller listener (not for clients)
        log_path         the broker's log4j log file (INFO) in the temp dir
        console_path     the JVM's stdout/stderr (crashes that happen before logging)
        tmpdir           the temp dir holding config, logs and data
        pid              the broker JVM's process id
        cluster_id       the cluster id the storage was formatted with
    """

    def __init__(self, *, heap="384m", start_timeout=180.0, stop_timeout=30.0,
                 overrides=None, secure=False, scram_users=None, release="4.1", oauth=None):
        """
        heap           -Xmx of the broker JVM
        start_timeout  seconds allowed for format + start until the broker answers metadata
                       (generous: a cold JVM on 2 cores takes several seconds)
        stop_timeout   seconds to wait after SIGTERM before SIGKILL
        overrides      dict of extra/replacement server.properties settings
        secure         also open the TLS listeners (see SECURE_LISTENERS), with certificates
                       of a throwaway CA made in the temp dir (self.ca)
        scram_users    {name: password}: SCRAM-SHA-512 users, written into the storage by
                       the broker's own `kafka-storage format --add-scram`
        release        "4.1" (test/kafka/pom.xml), "4.4" (pom-4.4.xml) or "3.9" (pom-3.9.xml):
                       librdkafka before 2.6.1 can SCRAM-authenticate to 3.x brokers only
        oauth          an identity provider (jwks_url, issuer, audience: OidcProvider): also
                       open the OAUTH listener, where the broker's own
                       OAuthBearerValidatorCallbackHandler validates tokens with its JWKS
        """
        if release not in RELEASES:
            raise KafkaBrokerError(f"unknown Kafka release {release!r} (one of {sorted(RELEASES)})")
        self.release = release
        self.heap = heap
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.overrides = dict(overrides or {})
        self.secure = secure
        self.scram_users = dict(scram_users or {})
        self.ca = None
        self.secure_bootstrap = {}  # listener name -> "127.0.0.1:PORT", when secure
        self.oauth = oauth
        self.oauth_bootstrap = None  # "127.0.0.1:PORT" of the OAUTH listener, with oauth
        self.bootstrap = None
        self.port = None
        self.controller_port = None
        self.log_path = None
        self.console_path = None
        self.tmpdir = None
        self.pid = None
        self.cluster_id = None
        self._libs = None
        self._proc = None
        self._console = None

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        """Fetch the jars, format a fresh storage dir, start the broker and wait until ready.

        Raises KafkaBrokerError (with the tail of the broker's logs when it got that far);
        on failure everything started so far is stopped and cleaned up.
        """
        if self._proc is not None or self.tmpdir is not None:
            raise KafkaBrokerError("KafkaBroker.start() called twice")
        deadline = time.monotonic() + self.start_timeout
        try:
            self._libs = self._fetch_jars()
            self.tmpdir = tempfile.mkdtemp(prefix="outbox-kafka-")
            self.log_path = os.path.join(self.tmpdir, "server.log")
            self.console_path = os.path.join(self.tmpdir, "console.out")
            ports = _free_loopback_ports(2 + (len(SECURE_LISTENERS) if self.secure else 0)
                                         + (1 if self.oauth else 0))
            if self.oauth:
                self.oauth_bootstrap = f"127.0.0.1:{ports.pop()}"
            self.port, self.controller_port = ports[:2]
            self.bootstrap = f"127.0.0.1:{self.port}"
            if self.secure:
                self.ca = ThrowawayCa(os.path.join(self.tmpdir, "tls"))
                self.secure_bootstrap = {name: f"127.0.0.1:{port}"
                                         for name, port in zip(SECURE_LISTENERS, ports[2:])}
            props = self._write_server_properties()
            self._format_storage(props, deadline)
            self._launch(props)
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """Stop the broker: SIGTERM (controlled shutdown), bounded wait, then SIGKILL.

        Signals only the PID this object started. Removes the temp dir unless OUTBOX_KEEP_TMP
        is set. Safe to call more than once.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    print(f"kafka_broker: broker pid {proc.pid} ignored SIGTERM for "
                          f"{self.stop_timeout:.0f}s, sending SIGKILL", file=sys.stderr)
                    proc.kill()
                    proc.wait()
        if self._console is not None:
            self._console.close()
            self._console = None
        if self.tmpdir is not None:
            if os.environ.get("OUTBOX_KEEP_TMP"):
                print(f"kafka_broker: keeping {self.tmpdir} (OUTBOX_KEEP_TMP is set)",
                      file=sys.stderr)
            else:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def kill(self):
        """SIGKILL the broker (as a machine that lost power); restart() brings it back."""
        self._require_running()
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait(30)

    def restart(self, timeout=120.0):
        """Start a killed broker again on its own data and ports, and wait until it is ready."""
        assert self._proc is not None and self._proc.poll() is not None, "restart() of a broker that runs"
        self._console.close()
        self._console = open(self.console_path, "ab")
        self._proc = subprocess.Popen(
            self._jvm(self.heap, self.log_path, "kafka.Kafka", os.path.join(self.tmpdir, "server.properties")),
            stdin=subprocess.DEVNULL, stdout=self._console, stderr=subprocess.STDOUT, cwd=self.tmpdir)
        self.pid = self._proc.pid
        self._wait_ready(time.monotonic() + timeout)

    # -- client helpers -------------------------------------------------------------------

    def create_topic(self, name, partitions=1, config=None, timeout=60.0):
        """Create topic `name` (replication factor 1) and wait until every partition has a
        leader in the metadata, so the first produce/fetch does not see
        LEADER_NOT_AVAILABLE. `config` is a dict of topic configs. Raises KafkaBrokerError
        (also when the topic already exists)."""
        self._require_running()
        deadline = time.monotonic() + timeout
        admin = self._admin()
        topic = NewTopic(name, num_partitions=partitions, replication_factor=1,
                         config=dict(config or {}))
        future = admin.create_topics([topic], request_timeout=timeout)[name]
        try:
            future.result(timeout=timeout)
        except KafkaException as e:
            raise KafkaBrokerError(f"creating topic {name!r} failed: {e}") from e

        def leaders_ready():
            md = admin.list_topics(topic=name, timeout=5)
            t = md.topics.get(name)
            return (t is not None and t.error is None and len(t.partitions) == partitions
                    and all(p.error is None and p.leader >= 0 for p in t.partitions.values()))

        self._poll(leaders_ready, deadline, f"leaders for all {partitions} partitions of "
                                            f"topic {name!r}")

    def record_batches(self, topic):
        """{partition: [the producer id of each record batch in its log, in log order]}, read
        from the broker's own log segments (a client sees neither batches nor producer ids). A
        segment is a run of record batches of format v2: baseOffset int64, batchLength int32 (the
        bytes after it), partitionLeaderEpoch int32, magic int8, crc int32, attributes int16,
        lastOffsetDelta int32, two timestamps int64, producerId int64, ... (Kafka's protocol
        guide, "Record Batch")."""
        self._require_running()
        data_dir = os.path.join(self.tmpdir, "data")
        batches = {}
        for d in os.listdir(data_dir):
            name, _, partition = d.rpartition("-")
            if name != topic:
                continue
            found = batches.setdefault(int(partition), [])
            for f in sorted(os.listdir(os.path.join(data_dir, d))):
                if not f.endswith(".log"):
                    continue
                with open(os.path.join(data_dir, d, f), "rb") as segment:
                    data = segment.read()
                at = 0
                while at + 61 <= len(data):
                    (length,) = struct.unpack_from(">i", data, at + 8)
                    if length <= 0:
                        break  # preallocated, unwritten tail
                    if data[at + 16] != 2:
                        raise KafkaBrokerError(f"{d}/{f}: a record batch of format {data[at + 16]}, not 2")
                    found.append(struct.unpack_from(">q", data, at + 43)[0])
                    at += 12 + length
        return batches

    def producer_ids(self, topic):
        """{partition: set of the producer ids of its record batches} (record_batches)."""
        return {p: set(ids) for p, ids in self.record_batches(topic).items()}

    def write_kafka_topics_sh(self, directory):
        """A `kafka-topics.sh` in `directory`, as a Kafka distribution's bin/ has, for tests that
        run an operator's commands (test_readme_quickstart.py): it runs the broker release's own
        TopicCommand from the cached jars (the 4.1 pom fetches kafka-tools for it), logging to a
        file beside it. Returns its path."""
        self._require_running()
        tools = [jar for jar in os.listdir(self._libs) if jar.startswith("kafka-tools-") and
                 not jar.startswith("kafka-tools-api-")]
        if not tools:
            raise KafkaBrokerError(f"no kafka-tools jar in {self._libs}: the release's pom "
                                   f"({RELEASES[self.release]}) does not fetch it")
        path = os.path.join(directory, "kafka-topics.sh")
        command = self._jvm("128m", os.path.join(directory, "kafka-topics.log"),
                            "org.apache.kafka.tools.TopicCommand")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n# Written by test/harness/kafka_broker.py\n"
                    f"exec {' '.join(shlex.quote(arg) for arg in command)} \"$@\"\n")
        os.chmod(path, 0o755)
        return path

    # -- internals ------------------------------------------------------------------------

    def _require_running(self):
        if self._proc is None:
            raise KafkaBrokerError("broker is not running (use start() or a with block)")
        if self._proc.poll() is not None:
            raise KafkaBrokerError(
                self._failure(f"broker exited with code {self._proc.returncode}"))

    def _admin(self):
        # A short-lived client per call: a long-lived one would keep reconnecting (and
        # logging to stderr) once the broker is stopped.
        return AdminClient({"bootstrap.servers": self.bootstrap,
                            "log.connection.close": False})

    def _fetch_jars(self):
        # stderr passes through, so a first (downloading) run shows what it does.
        try:
            res = subprocess.run([FETCH_JARS], stdout=subprocess.PIPE, text=True,
                                 timeout=1800,
                                 env={**os.environ, "OUTBOX_KAFKA_POM": RELEASES[self.release]})
        except (OSError, subprocess.TimeoutExpired) as e:
            raise KafkaBrokerError(f"{FETCH_JARS} failed: {e}") from e
        libs = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
        if res.returncode != 0 or not os.path.isdir(libs):
            raise KafkaBrokerError(f"{FETCH_JARS} failed (exit {res.returncode}); "
                                   "see its messages above")
        return libs

    def _write_server_properties(self):
        data_dir = os.path.join(self.tmpdir, "data")
        props = {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            # Static quorum: the storage is formatted WITHOUT --standalone to match. (The
            # dynamic controller.quorum.bootstrap.servers style needs --standalone; mixing
            # the two fails with confusing errors.)
            "controller.quorum.voters": f"{NODE_ID}@127.0.0.1:{self.controller_port}",
            "listeners": (f"PLAINTEXT://127.0.0.1:{self.port},"
                          f"CONTROLLER://127.0.0.1:{self.controller_port}"),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": data_dir,
            # The defaults (3 replicas, min ISR 2) cannot be met by one broker: consumer
            # groups and transactions would never get a coordinator.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Fewer internal partitions to create on first use (defaults 50 each).
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.num.partitions": "1",
            # Tests join groups one consumer at a time; do not wait 3 s for more members.
            "group.initial.rebalance.delay.ms": "0",
            # The 128 MiB default is allocated on the heap at start-up.
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
        }
        if self.secure:
            props.update(self._secure_listener_properties(props))
        if self.oauth:
            props.update(self._oauth_listener_properties(props))
        props.update({k: str(v) for k, v in self.overrides.items()})
        path = os.path.join(self.tmpdir, "server.properties")
        with open(path, "w") as f:
            f.write("# Written by test/harness/kafka_broker.py\n")
            for key, value in props.items():
                f.write(f"{key}={value}\n")
        return path

    def _secure_listener_properties(self, props):
        """The TLS listeners next to PLAINTEXT (which stays for the controller, the harness's
        own clients and inter-broker traffic): each with its own keystore and client checks."""
        valid = self.ca.issue("broker")
        expired = self.ca.issue("broker-expired", expired=True)
        extra = {}
        listeners, advertised, protocols = [props["listeners"]], [props["advertised.listeners"]], \
            [props["listener.security.protocol.map"]]
        for name, (protocol, cert_kind, client_auth) in SECURE_LISTENERS.items():
            address = self.secure_bootstrap[name]
            listeners.append(f"{name}://{address}")
            advertised.append(f"{name}://{address}")
            protocols.append(f"{name}:{protocol}")
            cert = expired if cert_kind == "expired" else valid
            prefix = f"listener.name.{name.lower()}."
            extra.update({
                prefix + "ssl.keystore.type": "PKCS12",
                prefix + "ssl.keystore.location": cert.keystore,
                prefix + "ssl.keystore.password": STORE_PASSWORD,
                prefix + "ssl.key.password": STORE_PASSWORD,
                prefix + "ssl.client.auth": client_auth,
            })
            if client_auth == "required":
                extra.update({prefix + "ssl.truststore.type": "PKCS12",
                              prefix + "ssl.truststore.location": self.ca.truststore(),
                              prefix + "ssl.truststore.password": STORE_PASSWORD})
            if protocol == "SASL_SSL":
                extra.update({
                    prefix + "sasl.enabled.mechanisms": "SCRAM-SHA-512",
                    prefix + "scram-sha-512.sasl.jaas.config":
                        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                })
        extra.update({"listeners": ",".join(listeners),
                      "advertised.listeners": ",".join(advertised),
                      "listener.security.protocol.map": ",".join(protocols),
                      "sasl.enabled.mechanisms": "SCRAM-SHA-512"})
        return extra

    def _oauth_listener_properties(self, props):
        """The OAUTH listener: SASL_PLAINTEXT with OAUTHBEARER, tokens validated by signature
        (the JWKS, fetched from the provider at start and refreshed), issuer and audience."""
        prefix = "listener.name.oauth."
        return {
            "listeners": f"{props['listeners']},OAUTH://{self.oauth_bootstrap}",
            "advertised.listeners": f"{props['advertised.listeners']},OAUTH://{self.oauth_bootstrap}",
            "listener.security.protocol.map": f"{props['listener.security.protocol.map']},OAUTH:SASL_PLAINTEXT",
            prefix + "sasl.enabled.mechanisms": "OAUTHBEARER",
            prefix + "oauthbearer.sasl.jaas.config":
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            prefix + "oauthbearer.sasl.server.callback.handler.class":
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
            "sasl.oauthbearer.jwks.endpoint.url": self.oauth.jwks_url,
            "sasl.oauthbearer.expected.issuer": self.oauth.issuer,
            "sasl.oauthbearer.expected.audience": self.oauth.audience,
        }

    def _jvm(self, heap, log_file, main_class, *args):
        # Kafka 4 fetches a JWKS (or token) URL only if this system property lists it.
        allowed = [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={self.oauth.jwks_url}"] if self.oauth else []
        return [_java(), f"-Xmx{heap}", "-XX:+ExitOnOutOfMemoryError",
                "-Djava.awt.headless=true", *allowed,
                f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                f"-Doutbox.kafka.log={log_file}",
                "-cp", os.path.join(self._libs, "*"),  # expanded by java, not a shell
                main_class, *args]

    def _format_storage(self, props, deadline):
        # StorageTool always ends with System.exit, hence its own JVM.
        self.cluster_id = _random_cluster_id()
        cmd = self._jvm("128m", os.path.join(self.tmpdir, "format.log"),
                        "kafka.tools.StorageTool", "format",
                        "-t", self.cluster_id, "-c", props,
                        *[arg for name, password in self.scram_users.items()
                          for arg in ("--add-scram",
                                      f'SCRAM-SHA-512=[name="{name}",password="{password}"]')])
        try:
            res = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True,
                                 timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as e:
            raise KafkaBrokerError(f"formatting Kafka storage timed out: {e.output}") from e
        if res.returncode != 0:
            raise KafkaBrokerError(
                f"formatting Kafka storage failed (exit {res.returncode}):\n{res.stdout}\n"
                f"--- {self.tmpdir}/format.log ---\n"
                f"{_tail(os.path.join(self.tmpdir, 'format.log'))}")

    def _launch(self, props):
        self._console = open(self.console_path, "wb")
        self._proc = subprocess.Popen(
            self._jvm(self.heap, self.log_path, "kafka.Kafka", props),
            stdin=subprocess.DEVNULL, stdout=self._console, stderr=subprocess.STDOUT,
            cwd=self.tmpdir)
        self.pid = self._proc.pid

    def _wait_ready(self, deadline):
        # The PLAINTEXT port only opens once the broker has caught up with the metadata log
        # and is unfenced (the controller port opens earlier: do not poll that one). Then a
        # metadata round trip proves the broker actually serves requests.
        def port_open():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                return False

        def broker_in_metadata():
            try:
                md = self._admin().list_topics(timeout=5)
            except KafkaException:
                return False
            return NODE_ID in md.brokers

        self._poll(port_open, deadline, f"broker port {self.port} to accept connections")
        self._poll(broker_in_metadata, deadline, "a metadata response listing the broker")
        self._warm_producer_ids(deadline)

    def _warm_producer_ids(self, deadline):
        # A fresh broker answers the first InitProducerId with COORDINATOR_LOAD_IN_PROGRESS
        # while it fetches a block of producer ids from the controller; librdkafka then logs
        # a GETPID warning and retries only after 500 ms. Have one throw-away idempotent
        # producer take that hit here, so the tests' producers get an id at once.
        eos = {}

        def on_stats(raw):
            eos.update(json.loads(raw).get("eos") or {})

        producer = Producer({"bootstrap.servers": self.bootstrap,
                             "enable.idempotence": True,
                             "statistics.interval.ms": 50, "stats_cb": on_stats,
                             "log_level": 3})  # the expected GETPID warning is level 4
        try:
            self._poll(lambda: producer.poll(0.05) >= 0 and eos.get("producer_id", -1) >= 0,
                       deadline, "an idempotent producer id")
        finally:
            del producer

    def _poll(self, condition, deadline, what, interval=0.1):
        """Call condition() until it is true; fail early if the broker exits, or at the
        deadline. Waiting on the process doubles as the pause between attempts."""
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise KafkaBrokerError(self._failure(
                    f"broker exited with code {self._proc.returncode} while waiting for {what}"))
            if condition():
                return
            if time.monotonic() >= deadline:
                raise KafkaBrokerError(self._failure(f"timed out waiting for {what}"))
            if self._proc is not None:
                try:
                    self._proc.wait(timeout=interval)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(interval)

    def _failure(self, message):
        if self._console is not None:
            self._console.flush()
        hint = "" if os.environ.get("OUTBOX_KEEP_TMP") else \
            " (set OUTBOX_KEEP_TMP=1 to keep the temp dir)"
        return (f"{message}{hint}\n"
                f"--- tail of {self.log_path} ---\n{_tail(self.log_path)}\n"
                f"--- tail of {self.console_path} ---\n{_tail(self.console_path, 20)}")


# -- command line -------------------------------------------------------------------------

def _smoke(debug):
    """Start a broker, create a 3-partition topic, produce 10 keyed messages with an
    idempotent producer (acks=all), consume them back through a consumer group. Returns
    (passed, failed) counted per message."""
    count = 10
    t0 = time.monotonic()
    with KafkaBroker() as kb:
        t_ready = time.monotonic()
        print(f"kafka smoke: broker ready at {kb.bootstrap} in {t_ready - t0:.1f}s "
              f"(pid {kb.pid}, log {kb.log_path})", file=sys.stderr)
        topic = f"smoke-{uuid.uuid4().hex[:8]}"
        kb.create_topic(topic, partitions=3)

        # Producer: the same librdkafka the extension links (Debian's 2.0.2). Its statistics
        # report the idempotence state and the producer id the broker assigned.
        stats = {}

        def on_stats(raw):
            eos = json.loads(raw).get("eos")
            if eos:
                stats.update(eos)

        pconf = {"bootstrap.servers": kb.bootstrap, "enable.idempotence": True,
                 "acks": "all", "statistics.interval.ms": 100, "stats_cb": on_stats}
        if debug:
            pconf["debug"] = "feature,protocol,eos,msg"
        producer = Producer(pconf)
        sent = {f"key-{i}": f"value-{i}" for i in range(count)}
        errors = []

        def on_delivery(err, msg):
            if err is not None:
                errors.append(f"{msg.key()}: {err}")

        for key, value in sent.items():
            producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        left = producer.flush(30)
        if left or errors:
            raise KafkaBrokerError(f"produce failed: {left} undelivered, errors {errors}")
        # Statistics come on a timer; serve callbacks until a report with a producer id.
        deadline = time.monotonic() + 10
        while stats.get("producer_id", -1) < 0 and time.monotonic() < deadline:
            producer.poll(0.1)
        if stats.get("idemp_state") != "Assigned" or stats.get("producer_id", -1) < 0:
            raise KafkaBrokerError(f"idempotent producer has no producer id: eos={stats}")
        print(f"kafka smoke: idempotent producer id {stats['producer_id']} "
              f"epoch {stats.get('producer_epoch')}", file=sys.stderr)
        del producer

        # Consumer group (subscribe, not assign) to exercise FindCoordinator, JoinGroup,
        # SyncGroup and OffsetCommit against the 4.1 broker.
        cconf = {"bootstrap.servers": kb.bootstrap, "group.id": f"smoke-{uuid.uuid4().hex}",
                 "auto.offset.reset": "earliest", "enable.auto.commit": False}
        if debug:
            cconf["debug"] = "feature,protocol,cgrp"
        consumer = Consumer(cconf)
        received = {}
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 60
            while sum(len(v) for v in received.values()) < count \
                    and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    raise KafkaBrokerError(f"consume failed: {msg.error()}")
                key = msg.key().decode() if msg.key() is not None else None
                received.setdefault(key, []).append(msg.value().decode())
            if received:
                consumer.commit(asynchronous=False)
        finally:
            consumer.close()

        passed = sum(1 for k, v in sent.items() if received.get(k) == [v])
        failed = count - passed
        unexpected = {k: v for k, v in received.items() if k not in sent}
        if failed or unexpected:
            print(f"kafka smoke: sent {sent}\nreceived {received}", file=sys.stderr)
            failed += sum(len(v) for v in unexpected.values())
    print(f"kafka smoke: total {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return passed, failed


def _serve():
    """Run a broker until SIGINT/SIGTERM, for demos."""
    def on_signal(signum, frame):
        raise SystemExit(128 + signum)  # unwinds through the with block: stop() runs
    # Set SIGINT explicitly too: a shell starts background jobs with SIGINT ignored, and
    # Python then never raises KeyboardInterrupt.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with KafkaBroker() as kb:
        print(f"kafka broker ready: bootstrap={kb.bootstrap} log={kb.log_path} "
              f"pid={kb.pid} (Ctrl-C to stop)", flush=True)
        code = kb._proc.wait()
        print(f"kafka broker exited by itself with code {code}", file=sys.stderr)
        return 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--smoke", action="store_true",
                      help="start a broker, round-trip 10 keyed messages, stop")
    mode.add_argument("--serve", action="store_true",
                      help="start a broker and keep it running until Ctrl-C")
    parser.add_argument("--debug", action="store_true",
                        help="with --smoke: librdkafka debug=feature,protocol,... on stderr")
    args = parser.parse_args(argv)
    if args.serve:
        return _serve()
    try:
        passed, failed = _smoke(args.debug)
    except (KafkaBrokerError, KafkaException) as e:
        print(f"kafka smoke: error: {e}", file=sys.stderr)
        passed, failed = 0, 10
    print(f"kafka smoke: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
