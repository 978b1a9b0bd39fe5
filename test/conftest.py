"""Shared fixtures of the integration tests: throwaway PostgreSQL clusters with the extension
preloaded, librdkafka's mock cluster for fault injection, a real Kafka broker for end to end,
and a Kafka reader that checks what arrived."""

import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Autouse: fails a test whose clusters' logs show a crash it did not cause; shows ERROR lines.
from harness.crash_watch_pytest import crash_watch_fixture, pytest_terminal_summary  # noqa: E402,F401
from harness.kafka_reader import read_topic  # noqa: E402
from harness.mock_cluster import MockCluster  # noqa: E402
from harness.pg_cluster import PgCluster  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "schema(version): create the extension at this version, not the default")


@pytest.fixture
def mock_cluster():
    with MockCluster(brokers=3, topics={"billing": 4, "poison": 1, "orders": 8}) as mc:
        yield mc


@pytest.fixture
def make_relay(request):
    """make_relay(bootstrap, workers=1, **outbox_settings) -> a started PgCluster with the relay
    (the launcher relays every database with the extension; single_database=True sets the
    deprecated outbox.database to `database`; server={name: value} sets other server settings)."""
    clusters = []

    # @pytest.mark.schema("0.3.0"): the test is of an older schema's tables (which existing installs
    # keep until they update), so its clusters create that version instead of the default.
    schema = request.node.get_closest_marker("schema")

    def make(bootstrap, workers=1, create_extension=True, database="postgres", single_database=False, server=None,
             **outbox):
        if create_extension is True and schema is not None:
            create_extension = schema.args[0]
        settings = {"outbox.bootstrap_servers": f"'{bootstrap}'", "outbox.workers": str(workers), **(server or {})}
        if single_database:  # the deprecated outbox.database: only that database is relayed
            settings["outbox.database"] = f"'{database}'"
        for name, value in outbox.items():
            settings[f"outbox.{name}"] = f"'{value}'"
        pg = PgCluster(settings=settings, create_extension=create_extension, database=database)
        clusters.append(pg)
        pg.init().start().setup_database()
        return pg

    yield make
    for pg in clusters:
        try:
            if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
                print(f"--- server log {pg.log_path} ---\n" + pg.log()[-8000:])
        finally:
            pg.cleanup()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def standbys():
    """A list a test appends the standbys it makes to (PgCluster.make_standby): cleaned up after it."""
    made = []
    yield made
    for pg in made:
        pg.cleanup()


@pytest.fixture
def unique_topic():
    return "t-" + uuid.uuid4().hex[:12]


__all__ = ["read_topic"]
