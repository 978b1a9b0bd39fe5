"""The README's quick start, run as written: its one marked block, with bash -euo pipefail, psql,
kcat and kafka-topics.sh, against a fresh cluster configured only as the README's "Configure"
says and a real Kafka broker that creates no topic by itself. Only the connection variables the
README names (PGHOST, PGPORT, PGUSER, KAFKA) are set by the test. Also what the README says of
CREATE DATABASE ... TEMPLATE of a relayed database, and its workaround."""

import os
import re
import subprocess
import tempfile

import psycopg
import pytest

from harness.kafka_broker import KafkaBroker
from harness.pg_cluster import PgCluster
from harness.wait import wait_until

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
MARKED_BLOCK = re.compile(r"^<!-- quickstart:[^\n]*-->\n```sh\n(.*?)^```$", re.S | re.M)


# The postgresql.conf lines of README "Configure": the first block after that heading.
CONFIGURE_BLOCK = re.compile(r"^### Configure\n.*?^```\n(.*?)^```$", re.S | re.M)


def quickstart_block():
    with open(README, encoding="utf-8") as f:
        blocks = MARKED_BLOCK.findall(f.read())
    assert len(blocks) == 1, f"README.md has {len(blocks)} marked quick-start blocks, not one"
    return blocks[0]


def configure_settings(bootstrap):
    """README "Configure"'s postgresql.conf settings ({name: value}), its brokers replaced by ours."""
    with open(README, encoding="utf-8") as f:
        block = CONFIGURE_BLOCK.search(f.read())
    assert block, 'README.md has no "### Configure" section with a postgresql.conf block'
    settings = {}
    for line in block.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, value = (part.strip() for part in line.split("=", 1))
            settings[name] = value
    assert settings.get("shared_preload_libraries") == "'outbox'", settings
    assert "outbox.bootstrap_servers" in settings, settings
    settings["outbox.bootstrap_servers"] = f"'{bootstrap}'"
    return settings


@pytest.fixture(scope="module")
def quickstarted():
    """A fresh cluster installed as the README's Install says, the quick start run on it."""
    # A broker that creates no topic on a first produce or fetch (a production broker's usual
    # setting): the block must create its topic, with the Kafka CLI.
    with KafkaBroker(overrides={"auto.create.topics.enable": "false"}) as kafka, \
            tempfile.TemporaryDirectory(prefix="outbox-kafka-cli-") as cli:
        kafka.write_kafka_topics_sh(cli)
        # Fresh: no extension, no database but initdb's; postgresql.conf as README "Configure"
        # says and nothing else of the harness's (no faster polls or backoffs, fsync on).
        with PgCluster(settings=configure_settings(kafka.bootstrap), create_extension=False,
                       harness_defaults=False) as pg:
            env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
            env.update(PGHOST=pg.tmp, PGPORT=str(pg.port), PGUSER="postgres", KAFKA=kafka.bootstrap,
                       PATH=f"{cli}:{os.environ['PATH']}")
            run = subprocess.run(["bash", "-euo", "pipefail", "-c", quickstart_block()], env=env,
                                 capture_output=True, text=True, timeout=180)
            yield pg, run


def test_the_quick_start_runs_as_written_and_reads_the_event_back(quickstarted):
    pg, run = quickstarted
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    # On the server's defaults but for README "Configure": none of the harness's own.
    assert pg.sql("SELECT current_setting('outbox.poll_interval'), current_setting('fsync'), "
                  "current_setting('outbox.workers')") == [("10s", "on", "2")]
    event_id = pg.value("SELECT outbox.event_id('invoice-42', 'paid')::text", dbname="billing")
    # kcat's line: the key, the relay's event_id header beside the event's own, the payload.
    record = [line for line in run.stdout.splitlines() if line.startswith("key=")]
    assert len(record) == 1, run.stdout
    assert record[0].startswith("key=subscription-7 headers="), record
    headers = dict(h.split("=", 1) for h in record[0].split(" headers=", 1)[1].split(" value=")[0].split(","))
    assert headers == {"event_id": event_id, "event_type": "invoice.paid"}
    assert record[0].endswith('value={"type": "invoice.paid", "invoice": 42}'), record
    # The backlog as the monitoring role: one published event, nothing pending or failed.
    assert re.search(r"^ billing\.invoices \|\s+0 \|\s+0 \|\s+1 \| \s*$", run.stdout, re.M), run.stdout


def test_the_quick_start_roles_have_only_what_it_grants(quickstarted):
    pg, run = quickstarted
    assert run.returncode == 0, run.stderr
    for role, allowed, refused in (
            ("outbox_monitor", "SELECT count(*) FROM outbox.backlog", "SELECT count(*) FROM outbox.events"),
            ("billing_app", "SELECT count(*) FROM invoices", "SELECT count(*) FROM outbox.backlog")):
        with psycopg.connect(host=pg.tmp, port=pg.port, user=role, dbname="billing", autocommit=True) as c:
            assert c.execute(allowed).fetchone()[0] == 1
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(refused)


def test_create_database_template_of_a_relayed_database_fails_until_its_relay_is_stopped(quickstarted):
    pg, run = quickstarted
    assert run.returncode == 0, run.stderr
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.workers WHERE pid IS NOT NULL", dbname="billing") >= 1,
               30, "billing's relay worker")
    with pytest.raises(psycopg.errors.ObjectInUse, match='source database "billing" is being accessed by other users'):
        pg.sql("CREATE DATABASE billing_copy TEMPLATE billing", dbname="postgres")
    # The README's workaround: stop the relay for the copy, copy, relay again.
    pg.sql("ALTER DATABASE billing SET outbox.workers = 0", dbname="postgres")

    def copied():
        try:
            pg.sql("CREATE DATABASE billing_copy TEMPLATE billing", dbname="postgres")
            return True
        except psycopg.errors.ObjectInUse:
            return False
    wait_until(copied, 60, "CREATE DATABASE ... TEMPLATE billing once its relay stopped")
    pg.sql("ALTER DATABASE billing RESET outbox.workers", dbname="postgres")
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.workers WHERE pid IS NOT NULL", dbname="billing") >= 1,
               60, "billing relayed again")
    assert pg.value("SELECT count(*) FROM invoices", dbname="billing_copy") == 1
    # What the README says of the copy: not the source's SET, a relay of its own at once.
    wait_until(lambda: pg.value("SELECT count(*) FROM outbox.workers WHERE pid IS NOT NULL",
                                dbname="billing_copy") >= 1, 60, "billing_copy's own relay")
