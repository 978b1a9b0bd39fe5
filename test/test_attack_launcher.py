"""Attacks on the launcher's requests (issue 15 items 1, 2): roles with the least rights (only
CONNECT; a database owner with CREATEDB; a role granted SET on outbox.workers) try to restart or
stall a relay they have no right to touch, or to take a database's slots. "Restarted" is read from
the workers' pids and started_at (outbox.workers); each test ends with a request of its own
(served_after) so that the launcher is known to have taken every earlier one."""

import psycopg
import pytest

from harness.wait import Timeout, wait_until
from test_launcher import (add_database, cluster, connect_as, launcher_rows, pending, quote, running, runs,
                           served_after, wait_running)


def need_grant_set(pg):
    if pg.value("SELECT current_setting('server_version_num')::int") < 150000:
        pytest.skip("GRANT SET ON PARAMETER is PostgreSQL 15+")


def failing(c, sql, error=psycopg.Error):
    """`sql` fails in a savepoint of c's open transaction, which goes on."""
    c.execute("SAVEPOINT f")
    with pytest.raises(error):
        c.execute(sql)
    c.execute("ROLLBACK TO SAVEPOINT f")


def test_statements_that_succeed_for_a_role_with_only_connect_restart_nothing(mock_cluster):
    # What a role with only CONNECT can make succeed: DROP DATABASE IF EXISTS of names that do
    # not exist (many, faster than the launcher takes them), DROP EXTENSION IF EXISTS where there
    # is none, CREATE EXTENSION IF NOT EXISTS where it is; failing statements in nested savepoints
    # (released into one rolled back), in EXCEPTION blocks re-entered in a loop, and before
    # PREPARE TRANSACTION / COMMIT PREPARED.
    with cluster(mock_cluster, max_prepared_transactions="2", **{"outbox.launcher_naptime": "'1h'"}) as pg:
        for db in ("db_a", "db_b", "db_c"):
            add_database(pg, mock_cluster, db)
        pg.sql("CREATE DATABASE plain", dbname="postgres")
        pg.sql("ALTER DATABASE db_b SET outbox.workers = 2", dbname="postgres")
        pg.sql("CREATE ROLE mallory LOGIN")
        for db in ("postgres", "db_b", "db_c"):  # CONNECT on db_a and plain only
            pg.sql(f"REVOKE CONNECT ON DATABASE {db} FROM PUBLIC", dbname="postgres")
        wait_running(pg, "db_a", 1)
        wait_running(pg, "db_b", 2)
        wait_running(pg, "db_c", 1)
        before = {db: runs(pg, db) for db in ("db_a", "db_b")}

        with connect_as(pg, "mallory", "db_a", autocommit=True) as c:
            for i in range(3 * 16 + 1):
                c.execute(f"DROP DATABASE IF EXISTS no_such_{i}")
                c.execute("CREATE EXTENSION IF NOT EXISTS outbox")
        with connect_as(pg, "mallory", "plain", autocommit=True) as c:
            for _ in range(20):
                c.execute("DROP EXTENSION IF EXISTS outbox")
        alter_b = "ALTER DATABASE db_b SET outbox.workers = 1"
        with connect_as(pg, "mallory", "db_a") as c:
            c.execute("SAVEPOINT outer_s")
            c.execute("SAVEPOINT inner_s")
            failing(c, alter_b)
            failing(c, "DROP EXTENSION IF EXISTS outbox")  # exists here: must be owner
            c.execute("CREATE EXTENSION IF NOT EXISTS outbox")
            c.execute("RELEASE SAVEPOINT inner_s")
            c.execute("ROLLBACK TO SAVEPOINT outer_s")
            # The same EXCEPTION block entered 50 times, each time with a statement that fails
            # (of another database, of one that does not exist) after one that succeeded.
            c.execute("DO $$ BEGIN FOR i IN 1..50 LOOP BEGIN "
                      "EXECUTE 'CREATE EXTENSION IF NOT EXISTS outbox'; "
                      f"EXECUTE {quote(alter_b)}; "
                      "EXCEPTION WHEN OTHERS THEN BEGIN "
                      "EXECUTE format('ALTER DATABASE no_such_%s SET outbox.workers = 1', i); "
                      "EXCEPTION WHEN OTHERS THEN NULL; END; END; END LOOP; END $$")
            c.commit()
            # Two-phase: what the prepared transaction did is what COMMIT PREPARED commits.
            failing(c, alter_b)
            failing(c, "ALTER DATABASE no_such_db SET outbox.workers = 1")
            c.execute("CREATE EXTENSION IF NOT EXISTS outbox")
            c.execute("PREPARE TRANSACTION 'mallory'")
        with connect_as(pg, "mallory", "db_a", autocommit=True) as c:
            c.execute("COMMIT PREPARED 'mallory'")
        served_after(pg, "db_c")
        assert {db: runs(pg, db) for db in ("db_a", "db_b")} == before


def test_a_database_owner_with_createdb_cannot_restart_a_relay_or_change_its_count(mock_cluster):
    # The owner of a relayed database (outbox.workers = 2 set by a superuser) who may also create
    # databases: CREATE/RENAME/OWNER/CONNECTION LIMIT/ALLOW_CONNECTIONS/IS_TEMPLATE/DROP of
    # databases of its own, RESET ALL and other settings of the relayed one (outbox.workers is
    # not its to reset), CREATE EXTENSION IF NOT EXISTS: neither its relay nor another restarts.
    with cluster(mock_cluster, **{"outbox.max_workers": "6", "outbox.launcher_naptime": "'1h'"}) as pg:
        for db in ("db_o", "db_b", "db_c"):
            add_database(pg, mock_cluster, db)
        pg.sql("CREATE ROLE owner_o LOGIN CREATEDB")
        pg.sql("ALTER DATABASE db_o OWNER TO owner_o", dbname="postgres")
        pg.sql("ALTER DATABASE db_o SET outbox.workers = 2", dbname="postgres")
        wait_running(pg, "db_o", 2)
        wait_running(pg, "db_b", 1)
        wait_running(pg, "db_c", 1)
        before = {db: runs(pg, db) for db in ("db_o", "db_b")}

        with connect_as(pg, "owner_o", "postgres", autocommit=True) as c:
            for _ in range(3):
                c.execute("CREATE DATABASE mine")
                c.execute("ALTER DATABASE mine RENAME TO mine2")
                c.execute("ALTER DATABASE mine2 OWNER TO owner_o")
                c.execute("ALTER DATABASE mine2 CONNECTION LIMIT 3")
                c.execute("ALTER DATABASE mine2 ALLOW_CONNECTIONS false")
                c.execute("ALTER DATABASE mine2 IS_TEMPLATE true")
                c.execute("ALTER DATABASE mine2 IS_TEMPLATE false")
                c.execute("ALTER DATABASE mine2 RESET ALL")
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute("ALTER DATABASE mine2 SET outbox.workers = 1")
                c.execute("DROP DATABASE mine2")
            c.execute("ALTER DATABASE db_o SET work_mem = '2MB'")
            c.execute("ALTER DATABASE db_o RESET ALL")
            c.execute("ALTER DATABASE db_o OWNER TO owner_o")
            c.execute("ALTER DATABASE db_o CONNECTION LIMIT 50")
            for sql in ("ALTER DATABASE db_o SET outbox.workers = 2", "ALTER DATABASE db_o RESET outbox.workers",
                        "ALTER DATABASE db_b SET work_mem = '2MB'", "ALTER DATABASE db_b RESET ALL"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(sql)
        with connect_as(pg, "owner_o", "db_o") as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS outbox")
            failing(c, "ALTER DATABASE db_o SET outbox.workers FROM CURRENT")
            c.commit()
        served_after(pg, "db_c")
        assert {db: runs(pg, db) for db in ("db_o", "db_b")} == before
        assert pg.value("SELECT setconfig FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase "
                        "WHERE d.datname = 'db_o' AND s.setrole = 0") == ["outbox.workers=2"]


def test_a_role_granted_set_on_outbox_workers_restarts_only_its_database_and_keeps_its_slot(mock_cluster):
    # A role granted SET on outbox.workers that owns db_s restarts db_s as often as it likes
    # (its right): in a loop of 30, db_s keeps its slot from the waiting db_w throughout and
    # runs at the end; no other relay restarts, nor through ALTER ROLE ... IN DATABASE.
    with cluster(mock_cluster, **{"outbox.max_workers": "3", "outbox.launcher_naptime": "'1h'"}) as pg:
        need_grant_set(pg)
        for db in ("db_b", "db_c", "db_s"):
            add_database(pg, mock_cluster, db)
            wait_running(pg, db, 1)
        add_database(pg, mock_cluster, "db_w")
        wait_until(lambda: launcher_rows(pg, "db_b").get("db_w", ("",))[0] == "no worker slot", 30,
                   "db_w waiting for a slot")
        pg.sql("CREATE ROLE setter LOGIN")
        pg.sql("ALTER DATABASE db_s OWNER TO setter", dbname="postgres")
        pg.sql("GRANT SET ON PARAMETER outbox.workers TO setter")
        before = {db: runs(pg, db) for db in ("db_b", "db_c")}
        before_s = runs(pg, "db_s")
        with connect_as(pg, "setter", "db_s", autocommit=True) as c:
            for _ in range(30):
                c.execute("ALTER DATABASE db_s SET outbox.workers = 1")
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute("ALTER DATABASE db_b SET outbox.workers = 1")
                assert running(pg, "db_w") == 0
            c.execute("ALTER ROLE setter IN DATABASE db_b SET outbox.workers = 1")
            c.execute("ALTER ROLE setter SET outbox.workers = 1")
        wait_until(lambda: (r := runs(pg, "db_s")) != before_s and r[0][1] is not None and running(pg, "db_s") == 1,
                   60, "db_s running again after its restarts")
        assert {db: runs(pg, db) for db in ("db_b", "db_c")} == before
        assert running(pg, "db_w") == 0 and launcher_rows(pg, "db_b")["db_w"][0] == "no worker slot"


def test_a_restart_keeps_a_database_running_when_its_count_is_below_the_configured_one(mock_cluster):
    # outbox.workers = 2 in the configuration files, db_a's own 1; db_c takes the other 2 slots
    # of 3. db_a's owner sets db_a's count again (the same 1): db_a kept 1 slot, and must run again.
    with cluster(mock_cluster, **{"outbox.max_workers": "3", "outbox.workers": "2",
                                  "outbox.launcher_naptime": "'1h'"}) as pg:
        need_grant_set(pg)
        add_database(pg, mock_cluster, "db_a", extension=False)
        pg.sql("ALTER DATABASE db_a SET outbox.workers = 1", dbname="postgres")
        pg.sql("CREATE EXTENSION outbox", dbname="db_a")
        wait_running(pg, "db_a", 1)
        add_database(pg, mock_cluster, "db_c")
        wait_running(pg, "db_c", 2)
        pg.sql("CREATE ROLE owner_a LOGIN")
        pg.sql("ALTER DATABASE db_a OWNER TO owner_a", dbname="postgres")
        pg.sql("GRANT SET ON PARAMETER outbox.workers TO owner_a")
        before = runs(pg, "db_a")
        with connect_as(pg, "owner_a", "db_a", autocommit=True) as c:
            c.execute("ALTER DATABASE db_a SET outbox.workers = 1")
        try:
            wait_until(lambda: (r := runs(pg, "db_a")) != before and r and r[0][1] is not None
                       and running(pg, "db_a") == 1, 30, "db_a running again on the slot it kept")
        except Timeout:
            raise AssertionError(f"db_a stays at 0 workers: {launcher_rows(pg, 'db_c')}")


def test_two_databases_restarted_at_once_both_get_their_slots_back(mock_cluster):
    # db_a and db_b (2 workers each) fill the budget of 4; db_w waits. Both restarted in one
    # commit keep what they held: neither starves the other, nor does db_w take a slot meanwhile.
    with cluster(mock_cluster, **{"outbox.max_workers": "4", "outbox.launcher_naptime": "'1h'"}) as pg:
        need_grant_set(pg)
        for db in ("db_a", "db_b"):
            add_database(pg, mock_cluster, db, extension=False)
            pg.sql(f"ALTER DATABASE {db} SET outbox.workers = 2", dbname="postgres")
            pg.sql("CREATE EXTENSION outbox", dbname=db)
            wait_running(pg, db, 2)
        add_database(pg, mock_cluster, "db_w")
        wait_until(lambda: launcher_rows(pg, "db_a").get("db_w", ("",))[0] == "no worker slot", 30,
                   "db_w waiting for a slot")
        pg.sql("CREATE ROLE setter LOGIN")
        for db in ("db_a", "db_b"):
            pg.sql(f"ALTER DATABASE {db} OWNER TO setter", dbname="postgres")
        pg.sql("GRANT SET ON PARAMETER outbox.workers TO setter")
        before = {db: runs(pg, db) for db in ("db_a", "db_b")}
        with connect_as(pg, "setter", "postgres") as c:
            for _ in range(5):
                c.execute("ALTER DATABASE db_a SET outbox.workers = 2")
                c.execute("ALTER DATABASE db_b SET outbox.workers = 2")
                c.commit()
        for db in ("db_a", "db_b"):
            wait_until(lambda: (r := runs(pg, db)) != before[db] and len(r) == 2 and all(x[1] for x in r)
                       and running(pg, db) == 2, 60, f"{db} running again with both workers")
        assert running(pg, "db_w") == 0 and launcher_rows(pg, "db_a")["db_w"][0] == "no worker slot"


def test_a_loop_of_statements_a_role_with_only_connect_may_run_does_not_stall_a_backlog(mock_cluster):
    # Issue 15 item 1's measure: while a role with only CONNECT runs, as fast as it can, every
    # statement of the kind the launcher listens to that it can make succeed (and ones that fail
    # in a savepoint of a transaction that commits, and COMMIT PREPARED, which wakes db_a's
    # workers), db_b's backlog is published to the end by the same two workers it started with,
    # and db_a's worker is woken, never restarted.
    with cluster(mock_cluster, max_prepared_transactions="2", **{"outbox.launcher_naptime": "'1h'"}) as pg:
        for db in ("db_a", "db_b"):
            add_database(pg, mock_cluster, db)
        pg.sql("ALTER DATABASE db_b SET outbox.workers = 2", dbname="postgres")
        pg.sql("CREATE ROLE mallory LOGIN")
        pg.sql("REVOKE CONNECT ON DATABASE db_b FROM PUBLIC", dbname="postgres")
        wait_running(pg, "db_a", 1)
        wait_running(pg, "db_b", 2)
        before = runs(pg, "db_b")
        before_a = runs(pg, "db_a")
        pg.sql("SELECT outbox.enqueue('db_b', 'k' || (i % 50), 'x'::text) FROM generate_series(1, 20000) i",
               dbname="db_b")
        statements = 0
        with connect_as(pg, "mallory", "db_a", autocommit=True) as c:
            def published():
                nonlocal statements
                for i in range(20):
                    c.execute(f"DROP DATABASE IF EXISTS no_such_{statements}_{i}")
                    c.execute("CREATE EXTENSION IF NOT EXISTS outbox")
                    with c.transaction():
                        failing(c, f"ALTER DATABASE no_such_{i} SET outbox.workers = 1")
                        failing(c, "ALTER DATABASE db_b SET outbox.workers = 1")
                    c.execute("BEGIN")
                    c.execute(f"PREPARE TRANSACTION 'mallory_{statements}'")
                    c.execute(f"COMMIT PREPARED 'mallory_{statements}'")
                    statements += 5
                return pending(pg, "db_b") == 0
            wait_until(published, 120, "db_b's backlog published while the statements run")
        assert statements > 0 and runs(pg, "db_b") == before and runs(pg, "db_a") == before_a



def start_three(pg, mock_cluster):
    """db_b, db_c and db_s relayed; db_s owned by `setter`, granted SET on outbox.workers."""
    need_grant_set(pg)
    for db in ("db_b", "db_c", "db_s"):
        add_database(pg, mock_cluster, db)
        wait_running(pg, db, 1)
    pg.sql("CREATE ROLE setter LOGIN")
    pg.sql("ALTER DATABASE db_s OWNER TO setter", dbname="postgres")
    pg.sql("GRANT SET ON PARAMETER outbox.workers TO setter")


def db_s_runs(pg):
    return running(pg, "db_s") == 1 and launcher_rows(pg, "db_b")["db_s"][0] == "running"


def test_a_reset_while_a_probe_that_saw_zero_is_still_there_starts_the_relay_at_once(mock_cluster):
    # db_s is disabled (outbox.workers = 0, set by `setter`, who owns it and was granted SET on
    # outbox.workers). Setting the 0 again starts a probe; it reads the 0 at connect and is held
    # (a superuser's lock on db_s's pg_extension) before it reports it. The RESET commits then,
    # and is taken by the launcher while that probe still holds its slot: when it reports its
    # (stale) 0, db_s must be probed again at once, not after outbox.launcher_naptime (1h here).
    with cluster(mock_cluster, **{"outbox.launcher_naptime": "'1h'"}) as pg:
        start_three(pg, mock_cluster)
        before_b = runs(pg, "db_b")
        db_s = pg.value("SELECT oid FROM pg_database WHERE datname = 'db_s'")
        with connect_as(pg, "setter", "postgres", autocommit=True) as c:
            c.execute("ALTER DATABASE db_s SET outbox.workers = 0")
            wait_until(lambda: running(pg, "db_s") == 0 and launcher_rows(pg, "db_b")["db_s"][0] == "disabled",
                       60, "db_s disabled")
            with pg.connect("db_s", autocommit=False) as holder:
                holder.execute("LOCK TABLE pg_catalog.pg_extension IN ACCESS EXCLUSIVE MODE")
                c.execute("ALTER DATABASE db_s SET outbox.workers = 0")  # a probe starts, and reads 0
                wait_until(lambda: pg.value("SELECT count(*) FROM pg_locks WHERE database = %s AND relation = "
                                            "'pg_catalog.pg_extension'::regclass AND NOT granted", (db_s,)) > 0,
                           30, "the probe of db_s held before it looks for the extension")
                c.execute("ALTER DATABASE db_s RESET outbox.workers")
                served_after(pg, "db_c")  # the launcher took the RESET while the probe holds its slot
                holder.rollback()
        try:
            wait_until(lambda: db_s_runs(pg), 60, "db_s running after its RESET")
        except Timeout:
            raise AssertionError(f"db_s left without a relay: {launcher_rows(pg, 'db_b')}")
        assert runs(pg, "db_b") == before_b


@pytest.mark.parametrize("last", ["RESET outbox.workers", "SET outbox.workers = 0"], ids=["reset", "zero"])
def test_a_loop_of_zero_and_reset_by_a_role_granted_set_ends_with_the_last_count(mock_cluster, last):
    # The same role flips db_s's count between 0 and the files' (RESET) as fast as it can:
    # commits land everywhere in a probe's life. db_s ends with the last count: running after a
    # RESET, disabled with no worker after a 0 (a probe started for a late request sees it and
    # leaves). No other relay restarts.
    with cluster(mock_cluster, **{"outbox.launcher_naptime": "'1h'"}) as pg:
        start_three(pg, mock_cluster)
        before_b = runs(pg, "db_b")
        with connect_as(pg, "setter", "db_s", autocommit=True) as c:
            for _ in range(30):
                c.execute("ALTER DATABASE db_s SET outbox.workers = 0")
                c.execute("ALTER DATABASE db_s RESET outbox.workers")
            c.execute(f"ALTER DATABASE db_s {last}")
        served_after(pg, "db_c")  # the launcher has taken every request of the loop
        if last.startswith("RESET"):
            try:
                wait_until(lambda: db_s_runs(pg), 60, "db_s running after its last RESET")
            except Timeout:
                raise AssertionError(f"db_s left without a relay: {launcher_rows(pg, 'db_b')}")
        else:
            wait_until(lambda: running(pg, "db_s") == 0 and launcher_rows(pg, "db_b")["db_s"][0] == "disabled",
                       60, "db_s disabled after its last 0")
        assert runs(pg, "db_b") == before_b
