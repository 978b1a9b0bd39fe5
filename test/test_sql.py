"""SQL-level checks that need a cluster of their own (settings changed by reload, loading without
preload) or many generated inputs (event ids against Python's uuid5)."""

import random
import subprocess
import uuid

import psycopg
import pytest

from harness.pg_cluster import PgCluster

NAMESPACE = uuid.UUID("d4e3f08c-32f8-4d92-844f-adced4c5bfb1")


def netstring(s):
    return f"{len(s.encode('utf-8'))}:{s},"


@pytest.fixture(scope="module")
def sql_cluster():
    with PgCluster(settings={"outbox.workers": "0"}) as pg:
        yield pg


def random_text(rng):
    alphabet = "ab:,0123456789 -_/é漢🙂\\'\""
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def test_event_ids_match_an_independent_uuid5(sql_cluster):
    rng = random.Random(20261130)
    pairs = [(random_text(rng), random_text(rng)) for _ in range(300)]
    with sql_cluster.connect() as c:
        for a, d in pairs:
            got = c.execute("SELECT outbox.event_id(%s, %s)", (a, d)).fetchone()[0]
            assert got == uuid.uuid5(NAMESPACE, netstring(a) + netstring(d)), (a, d)
            ns = uuid.UUID(int=rng.getrandbits(128))
            got = c.execute("SELECT outbox.event_id(%s::uuid, %s)", (str(ns), a + d)).fetchone()[0]
            assert got == uuid.uuid5(ns, a + d)
    # No two distinct pairs share an id.
    ids = {uuid.uuid5(NAMESPACE, netstring(a) + netstring(d)) for a, d in set(pairs)}
    assert len(ids) == len(set(pairs))


def test_purge_without_window_needs_retention(sql_cluster):
    sql_cluster.sql("ALTER SYSTEM SET outbox.retention = 0")
    sql_cluster.reload()
    try:
        with sql_cluster.connect() as c:  # a new session sees the reloaded value
            assert c.execute("SHOW outbox.retention").fetchone()[0] == "0"
            with pytest.raises(psycopg.errors.NullValueNotAllowed) as e:
                c.execute("SELECT outbox.purge()")
            assert "outbox.retention is 0" in str(e.value)
            assert e.value.diag.message_hint.startswith("Pass the window")
            assert c.execute("SELECT outbox.purge(interval '1 day')").fetchone()[0] == 0
    finally:
        sql_cluster.sql("ALTER SYSTEM RESET outbox.retention")
        sql_cluster.reload()


def test_loading_without_shared_preload_libraries_is_refused():
    pg = PgCluster(settings={"shared_preload_libraries": "''"}, create_extension=False)
    try:
        pg.init().start()
        with pg.connect() as c:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
                c.execute("LOAD 'outbox'")
            assert "shared_preload_libraries" in str(e.value)
            with pytest.raises(psycopg.Error):
                c.execute("CREATE EXTENSION outbox")
    finally:
        pg.cleanup()


def test_boundary_turns_errors_into_sql_errors_and_session_survives(sql_cluster):
    with sql_cluster.connect() as c:
        for bad in ["SELECT outbox.enqueue('bad topic', 'k', 'x')",
                    "SELECT outbox.event_id(NULL, 'x')",
                    "SELECT outbox.enqueue('t', 'k', 'x', '[1]')"]:
            with pytest.raises(psycopg.Error):
                c.execute(bad)
        assert c.execute("SELECT outbox.event_id('a', 'b') IS NOT NULL").fetchone()[0]


def test_pgxn_meta_names_the_version_the_control_file_installs():
    """META.json (PGXN) and outbox.control must agree, or PGXN ships a version it does not describe."""
    import json
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[1]
    control = re.search(r"^default_version\s*=\s*'([^']+)'", (root / "outbox.control").read_text(), re.M).group(1)
    meta = json.loads((root / "META.json").read_text())
    assert meta["version"] == control
    assert meta["provides"]["outbox"]["version"] == control
