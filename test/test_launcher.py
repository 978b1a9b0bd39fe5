"""One install, many databases: the launcher starts relay workers for every database where the
extension is installed, stops them when the extension or the database is dropped, without a
restart; per-database outbox.workers; the cluster's worker budget, shown in the views; the
deprecated outbox.database; per-(topic, key) order and nothing lost per database across a crash
and a restart."""

import contextlib
import os
import signal
import threading

import psycopg
import pytest

from harness.kafka_reader import check_delivery, read_topic
from harness.pg_cluster import PgCluster
from harness.wait import wait_until


@contextlib.contextmanager
def cluster(mock_cluster, **settings):
    """A started cluster in launcher mode (outbox.database unset), no extension anywhere yet."""
    conf = {"outbox.bootstrap_servers": f"'{mock_cluster.bootstrap}'", "outbox.poll_interval": "'500ms'"}
    conf.update(settings)
    pg = PgCluster(settings=conf, create_extension=False)
    try:
        pg.init().start()
        yield pg
    except BaseException:
        print(f"--- server log {pg.log_path} ---\n" + pg.log()[-8000:])
        raise
    finally:
        pg.cleanup()


def add_database(pg, mock_cluster, name, extension=True):
    pg.sql(f'CREATE DATABASE "{name}"', dbname="postgres")
    mock_cluster.create_topic(name, 4)
    if extension:
        pg.sql("CREATE EXTENSION outbox", dbname=name)


def worker_rows(pg, db):
    return pg.sql("SELECT worker, pid, state, last_error FROM outbox.workers ORDER BY worker", dbname=db)


def running(pg, db):
    """Relay processes connected to `db` (pg_stat_activity, which any database shows)."""
    return pg.value("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = %s",
                    (db,), dbname="postgres")


def wait_running(pg, db, n, timeout=60):
    def ok():
        rows = worker_rows(pg, db)
        return len(rows) == n and all(r[1] for r in rows) and running(pg, db) == n
    return wait_until(ok, timeout, f"{n} relay workers running in {db}")


def launcher_rows(pg, db):
    return {r[0]: r[1:] for r in pg.sql("SELECT database, state, workers, running, last_error FROM outbox.launcher",
                                        dbname=db)}


def pending(pg, db):
    return pg.value("SELECT count(*) FROM outbox.events WHERE status <> 'published'", dbname=db)


def wait_all_published(pg, db, timeout=90):
    wait_until(lambda: pending(pg, db) == 0, timeout, f"every event of {db} published")


class Writer:
    """Enqueues into one database (topic = the database's name, 10 keys) from a thread, one
    transaction after the other, so enqueue order is commit order. Keeps {key: [event_id]}."""

    def __init__(self, pg, db):
        self.pg, self.db, self.by_key, self.seq = pg, db, {}, 0
        self.stop_flag = threading.Event()
        self.thread = None
        self.error = None

    def burst(self, transactions):
        with self.pg.connect(self.db, autocommit=False) as c:
            for _ in range(transactions):
                self.transaction(c)

    def transaction(self, c):
        ids = []
        for _ in range(5):
            key = f"k{self.seq % 10}"
            eid = c.execute("SELECT outbox.enqueue(%s, %s, %s::jsonb)::text",
                            (self.db, key, f'{{"seq": {self.seq}}}')).fetchone()[0]
            ids.append((key, eid))
            self.seq += 1
        c.commit()
        for key, eid in ids:
            self.by_key.setdefault(key, []).append(eid)

    def start(self):
        def run():
            try:
                with self.pg.connect(self.db, autocommit=False) as c:
                    while not self.stop_flag.is_set():
                        self.transaction(c)
                        self.stop_flag.wait(0.02)
            except Exception as e:  # reported by stop()
                self.error = e
        self.stop_flag.clear()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.stop_flag.set()
        self.thread.join(30)
        assert self.error is None, f"writer of {self.db} failed: {self.error!r}"

    @property
    def count(self):
        return sum(len(v) for v in self.by_key.values())

    def check(self, bootstrap):
        records = read_topic(bootstrap, self.db, self.count, settle=True)
        check = check_delivery(records, self.by_key)
        assert check.lost == [], f"{self.db}: {len(check.lost)} events lost"
        assert check.order_violations == [], f"{self.db}: order broken for {check.order_violations}"
        assert check.unique == self.count


def test_three_databases_extension_and_database_dropped_while_others_publish_then_crash_and_restart(
        mock_cluster):
    # naptime 1h: every start and stop below comes from a commit telling the launcher, not a rescan.
    with cluster(mock_cluster, **{"outbox.launcher_naptime": "'1h'"}) as pg:
        for db in ("db_a", "db_b", "db_c"):
            add_database(pg, mock_cluster, db)
        pg.sql("ALTER DATABASE db_b SET outbox.workers = 2", dbname="postgres")
        wait_running(pg, "db_a", 1)
        wait_running(pg, "db_b", 2)
        wait_running(pg, "db_c", 1)
        # No process stays in a database without the extension (its probe left at once).
        wait_until(lambda: running(pg, "postgres") == 0, 30, "no relay in postgres")
        assert launcher_rows(pg, "db_a").keys() == {"db_a", "db_b", "db_c"}

        a, b = Writer(pg, "db_a").start(), Writer(pg, "db_b").start()
        # The extension dropped and created again in db_c while db_a and db_b publish.
        c = Writer(pg, "db_c")
        c.burst(4)
        wait_all_published(pg, "db_c")
        with pg.connect("db_c") as conn:
            conn.execute("SET lock_timeout = '20s'")
            conn.execute("DROP EXTENSION outbox")
        wait_until(lambda: running(pg, "db_c") == 0, 30, "db_c's worker stopped after DROP EXTENSION")
        assert 'extension "outbox" is not installed in database "db_c"; stopping' in pg.log()
        c.check(mock_cluster.bootstrap)
        pg.sql("CREATE EXTENSION outbox", dbname="db_c")
        wait_running(pg, "db_c", 1)
        c.burst(4)  # after the earlier ones of their keys, on the same topic
        wait_all_published(pg, "db_c")
        c.check(mock_cluster.bootstrap)
        # DROP DATABASE of a relayed database, no FORCE: its worker (only its) is stopped first.
        pids_b = {r[1] for r in worker_rows(pg, "db_b")}
        pg.sql("DROP DATABASE db_c", dbname="postgres")
        assert 'stopping the relay workers for DROP DATABASE "db_c"' in pg.log()
        assert {r[1] for r in worker_rows(pg, "db_b")} == pids_b
        # The launcher is not stuck: a database created after the drop gets its relay.
        add_database(pg, mock_cluster, "db_d")
        wait_running(pg, "db_d", 1)
        d = Writer(pg, "db_d")
        d.burst(4)
        wait_all_published(pg, "db_d")
        a.stop()
        b.stop()
        assert a.count > 0 and b.count > 0
        rows = launcher_rows(pg, "db_a")
        assert set(rows) == {"db_a", "db_b", "db_d"}
        assert all(state == "running" for state, *_ in rows.values()), rows
        assert rows["db_b"][1:3] == (2, 2)

        # A relay worker crashes: the postmaster restarts everything, the launcher all relays.
        pid = worker_rows(pg, "db_a")[0][1]
        pg.expect_killed(pid)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: worker_rows(pg, "db_a")[0][1] not in (None, pid), 60, "relay back after the crash")
        for db, n in (("db_a", 1), ("db_b", 2), ("db_d", 1)):
            wait_running(pg, db, n)
        a.burst(20)
        b.burst(20)
        # And a restart.
        pg.restart()
        for db, n in (("db_a", 1), ("db_b", 2), ("db_d", 1)):
            wait_running(pg, db, n)
        a.burst(20)
        b.burst(20)
        d.burst(4)
        for w in (a, b, d):
            wait_all_published(pg, w.db)
            w.check(mock_cluster.bootstrap)
        assert pg.log().count("outbox launcher started") == 3  # start, after the crash, after the restart


def test_per_database_workers_follow_alter_database_without_restart(mock_cluster):
    with cluster(mock_cluster) as pg:
        add_database(pg, mock_cluster, "db_a")
        add_database(pg, mock_cluster, "db_b")
        wait_running(pg, "db_a", 1)
        pg.sql("ALTER DATABASE db_a SET outbox.workers = 3", dbname="postgres")
        wait_running(pg, "db_a", 3)
        wait_running(pg, "db_b", 1)  # its own count: the configuration files'
        a = Writer(pg, "db_a")
        a.burst(60)
        wait_all_published(pg, "db_a")
        a.check(mock_cluster.bootstrap)
        assert all(n > 0 for (n,) in pg.sql("SELECT published FROM outbox.workers", dbname="db_a"))

        # 0: no relay for that database, said so in outbox.launcher; nothing published meanwhile.
        pg.sql("ALTER DATABASE db_a SET outbox.workers = 0", dbname="postgres")
        wait_until(lambda: running(pg, "db_a") == 0 and worker_rows(pg, "db_a") == [], 30, "db_a's relay stopped")
        wait_until(lambda: launcher_rows(pg, "db_b").get("db_a", ("",))[0] == "disabled", 30, "db_a disabled")
        pg.sql("SELECT outbox.enqueue('db_a', 'held', 'x'::text)", dbname="db_a")
        pg.sql("SELECT outbox.enqueue('db_b', 'k', 'y'::text)", dbname="db_b")
        wait_all_published(pg, "db_b")
        assert pending(pg, "db_a") == 1

        # RESET: back to the configuration files' count, which a reload changes for db_b too.
        pg.set(workers=2)
        pg.sql("ALTER DATABASE db_a RESET outbox.workers", dbname="postgres")
        wait_running(pg, "db_a", 2)
        wait_running(pg, "db_b", 2)
        wait_all_published(pg, "db_a")


def test_budget_used_up_is_shown_and_the_database_starts_when_a_slot_is_freed(mock_cluster):
    with cluster(mock_cluster, **{"outbox.max_workers": "2", "outbox.launcher_naptime": "'1h'"}) as pg:
        add_database(pg, mock_cluster, "db_a")
        wait_running(pg, "db_a", 1)
        add_database(pg, mock_cluster, "db_b")
        wait_running(pg, "db_b", 1)
        add_database(pg, mock_cluster, "db_c")

        def left_out():
            rows = worker_rows(pg, "db_c")
            return len(rows) == 1 and rows[0][1] is None and rows[0][2] == "no worker slot" and rows[0][3]
        wait_until(left_out, 30, "db_c shown without a worker slot")
        assert "outbox.max_workers = 2" in worker_rows(pg, "db_c")[0][3]
        state, workers, n_running, error = launcher_rows(pg, "db_a")["db_c"]
        assert (state, workers, n_running) == ("no worker slot", 1, 0) and "outbox.max_workers" in error
        assert pg.value("SELECT max_workers FROM outbox.launcher LIMIT 1", dbname="db_a") == 2
        pg.sql("SELECT outbox.enqueue('db_c', 'k', 'waits for a slot'::text)", dbname="db_c")
        assert pg.log().count('database "db_c": no worker slot') == 1  # logged once, not per look

        # DROP EXTENSION in db_a frees its slot: db_c starts and publishes.
        with pg.connect("db_a") as c:
            c.execute("SET lock_timeout = '20s'")
            c.execute("DROP EXTENSION outbox")
        wait_running(pg, "db_c", 1)
        wait_all_published(pg, "db_c")


def test_max_worker_processes_used_up_is_shown(mock_cluster):
    # 3 = the logical replication launcher, the outbox launcher and one relay worker.
    with cluster(mock_cluster, max_worker_processes="3", **{"outbox.launcher_naptime": "'2s'"}) as pg:
        for db in ("db_a", "db_b", "db_c"):
            add_database(pg, mock_cluster, db)

        def shown():
            rows = [worker_rows(pg, db) for db in ("db_a", "db_b", "db_c")]
            refused = [r for rs in rows for r in rs if r[2] == "no worker slot"]
            return refused and all("max_worker_processes" in r[3] for r in refused) and running(pg, "db_a") + \
                running(pg, "db_b") + running(pg, "db_c") >= 1
        wait_until(shown, 60, "a database without a worker slot, for max_worker_processes")
        assert "max_worker_processes (3) is used up" in pg.log()


def test_a_budget_that_max_worker_processes_cannot_hold_is_said_at_start(mock_cluster):
    with cluster(mock_cluster, max_worker_processes="3", **{"outbox.max_workers": "3"}) as pg:
        warning = ("WARNING:  outbox.max_workers = 3 and the launcher need 4 background workers, "
                   "more than max_worker_processes = 3")
        assert warning in pg.log()
        assert "HINT:  Raise max_worker_processes to at least 4 plus what parallel query" in pg.log()
    with cluster(mock_cluster, max_worker_processes="4", **{"outbox.max_workers": "3"}) as pg:
        assert "the launcher need" not in pg.log()


def test_outbox_database_still_relays_that_database_only_and_says_it_is_deprecated(mock_cluster):
    with cluster(mock_cluster, **{"outbox.database": "'db_a'"}) as pg:
        add_database(pg, mock_cluster, "db_a")
        pg.sql("CREATE DATABASE db_b", dbname="postgres")
        with pg.connect("db_b") as c:
            notices = []
            c.add_notice_handler(lambda d: notices.append(d.message_primary))
            c.execute("CREATE EXTENSION outbox")
        assert any('outbox events in database "db_b" will not be published' in n for n in notices)
        wait_running(pg, "db_a", 1)
        assert "outbox.database is deprecated" in pg.log()
        pg.sql("SELECT outbox.enqueue('db_a', 'k', 'x'::text)", dbname="db_a")
        pg.sql("SELECT outbox.enqueue('db_b', 'k', 'y'::text)", dbname="db_b")
        wait_all_published(pg, "db_a")
        assert running(pg, "db_b") == 0 and worker_rows(pg, "db_b") == []
        assert pending(pg, "db_b") == 1


def test_outbox_database_created_later_is_relayed_without_restart(mock_cluster):
    with cluster(mock_cluster, **{"outbox.database": "'later'"}) as pg:
        line = 'outbox.database "later" does not exist'
        wait_until(lambda: line in pg.log(), 30, "missing database logged")
        add_database(pg, mock_cluster, "later")
        wait_running(pg, "later", 1)
        pg.sql("SELECT outbox.enqueue('later', 'k', 'x'::text)", dbname="later")
        wait_all_published(pg, "later")
        assert pg.log().count(line) == 1


def test_sessions_cannot_change_the_per_database_count(mock_cluster):
    with cluster(mock_cluster) as pg:
        add_database(pg, mock_cluster, "db_a")
        pg.sql("CREATE ROLE owner_a LOGIN")
        pg.sql("ALTER DATABASE db_a OWNER TO owner_a", dbname="postgres")
        with psycopg.connect(host=pg.tmp, port=pg.port, user="owner_a", dbname="db_a", autocommit=True) as c:
            for statement in ("ALTER DATABASE db_a SET outbox.workers = 30", "SET outbox.workers = 30"):
                try:
                    c.execute(statement)
                    raise AssertionError(f"{statement} was allowed")
                except psycopg.errors.InsufficientPrivilege:
                    pass
        wait_running(pg, "db_a", 1)


def test_terminated_launcher_comes_back_and_takes_over_the_relay(mock_cluster):
    with cluster(mock_cluster) as pg:
        add_database(pg, mock_cluster, "db_a")
        wait_running(pg, "db_a", 1)
        launcher = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox launcher'"
        old_launcher, old_worker = pg.value(launcher), worker_rows(pg, "db_a")[0][1]
        assert pg.value("SELECT pg_terminate_backend(%s)", (old_launcher,))
        # The new launcher has no handles for the old workers: it stops them and starts afresh.
        wait_until(lambda: pg.value(launcher) not in (None, old_launcher), 60, "launcher restarted")
        wait_until(lambda: worker_rows(pg, "db_a")[0][1] not in (None, old_worker), 60, "worker started afresh")
        wait_running(pg, "db_a", 1)
        a = Writer(pg, "db_a")
        a.burst(10)
        wait_all_published(pg, "db_a")
        a.check(mock_cluster.bootstrap)


def test_a_count_above_the_whole_budget_is_named_as_the_reason(mock_cluster):
    # No other database holds a slot: "used up by other databases" would send the operator
    # looking for databases that are not there, waiting for a slot that never fits.
    with cluster(mock_cluster, **{"outbox.max_workers": "2", "outbox.launcher_naptime": "'1h'"}) as pg:
        add_database(pg, mock_cluster, "db_a")
        wait_running(pg, "db_a", 1)
        pg.sql("ALTER DATABASE db_a SET outbox.workers = 3", dbname="postgres")

        def reason():
            rows = worker_rows(pg, "db_a")
            return rows and rows[0][2] == "no worker slot" and rows[0][3]
        wait_until(reason, 30, "db_a shown without a worker slot")
        error = worker_rows(pg, "db_a")[0][3]
        assert "outbox.workers = 3 for this database is more than outbox.max_workers = 2" in error, error
        assert "other databases" not in error


def test_a_count_lowered_while_it_does_not_fit_starts_the_database(mock_cluster):
    # Holding no slot, the database has no worker to see its new count: the launcher must look
    # again rather than wait for slots for the old one (forever, when it exceeds the budget).
    with cluster(mock_cluster, **{"outbox.max_workers": "2", "outbox.launcher_naptime": "'1h'"}) as pg:
        add_database(pg, mock_cluster, "db_a")
        pg.sql("ALTER DATABASE db_a SET outbox.workers = 3", dbname="postgres")
        wait_until(lambda: launcher_rows(pg, "db_a").get("db_a", ("",))[0] == "no worker slot", 30,
                   "db_a without a worker slot")
        pg.sql("ALTER DATABASE db_a SET outbox.workers = 2", dbname="postgres")
        wait_running(pg, "db_a", 2)
        pg.sql("SELECT outbox.enqueue('db_a', 'k', 'x'::text)", dbname="db_a")
        wait_all_published(pg, "db_a")
        # The same through the configuration files: 3 there, none of its own, then 1 and a reload.
        pg.sql("ALTER DATABASE db_a RESET outbox.workers", dbname="postgres")
        pg.set(workers=3)
        wait_until(lambda: launcher_rows(pg, "db_a").get("db_a", ("",))[0] == "no worker slot", 30,
                   "db_a without a worker slot again")
        pg.set(workers=1)
        wait_running(pg, "db_a", 1)


def test_a_relayed_database_made_a_template_by_its_owner_says_so_and_resumes(mock_cluster):
    # Templates are not relayed, and IS_TEMPLATE needs no superuser: the relay must not stop unseen.
    with cluster(mock_cluster, **{"outbox.launcher_naptime": "'1h'"}) as pg:
        add_database(pg, mock_cluster, "db_a")
        pg.sql("CREATE ROLE owner_a LOGIN")
        pg.sql("ALTER DATABASE db_a OWNER TO owner_a", dbname="postgres")
        wait_running(pg, "db_a", 1)
        with psycopg.connect(host=pg.tmp, port=pg.port, user="owner_a", dbname="postgres", autocommit=True) as c:
            c.execute("ALTER DATABASE db_a IS_TEMPLATE true")
        wait_until(lambda: running(pg, "db_a") == 0, 30, "db_a's relay stopped")
        line = 'database "db_a" is a template now: its relay stops and its events wait'
        wait_until(lambda: line in pg.log(), 30, "the stop logged")
        pg.sql("SELECT outbox.enqueue('db_a', 'k', 'waits'::text)", dbname="db_a")
        with psycopg.connect(host=pg.tmp, port=pg.port, user="owner_a", dbname="postgres", autocommit=True) as c:
            c.execute("ALTER DATABASE db_a IS_TEMPLATE false")
        wait_running(pg, "db_a", 1)
        wait_all_published(pg, "db_a")
        assert pg.log().count(line) == 1


def test_the_owner_renames_a_relayed_database_and_its_relay_follows(mock_cluster):
    # RenameDatabase refuses while any other session is connected: the relay must step aside for
    # whom the rename would go ahead (owner with CREATEDB), and only for them.
    with cluster(mock_cluster, **{"outbox.launcher_naptime": "'1h'"}) as pg:
        add_database(pg, mock_cluster, "db_a")
        pg.sql("CREATE ROLE owner_a LOGIN CREATEDB")
        pg.sql("CREATE ROLE other LOGIN CREATEDB")
        pg.sql("ALTER DATABASE db_a OWNER TO owner_a", dbname="postgres")
        wait_running(pg, "db_a", 1)
        pid = worker_rows(pg, "db_a")[0][1]
        with psycopg.connect(host=pg.tmp, port=pg.port, user="other", dbname="postgres", autocommit=True) as c:
            try:
                c.execute("ALTER DATABASE db_a RENAME TO db_x")
                raise AssertionError("a non-owner renamed the database")
            except psycopg.errors.InsufficientPrivilege:
                pass
        assert worker_rows(pg, "db_a")[0][1] == pid  # not restarted for someone else's attempt
        with psycopg.connect(host=pg.tmp, port=pg.port, user="owner_a", dbname="postgres", autocommit=True) as c:
            c.execute("ALTER DATABASE db_a RENAME TO db_r")
        wait_running(pg, "db_r", 1)
        pg.sql("SELECT outbox.enqueue('db_a', 'k', 'after the rename'::text)", dbname="db_r")
        wait_all_published(pg, "db_r")
        wait_until(lambda: "db_r" in launcher_rows(pg, "db_r"), 30, "outbox.launcher shows the new name")


def test_a_database_owner_cannot_restart_other_databases_relays(mock_cluster):
    # RESET ALL is open to a database's owner; it cannot touch outbox.workers (SUSET), so it must
    # not restart anything, and repeating it in one transaction must not become "restart every
    # database" (a restart resends the batches in flight).
    with cluster(mock_cluster, **{"outbox.launcher_naptime": "'1h'"}) as pg:
        for db in ("db_a", "db_b", "db_c"):
            add_database(pg, mock_cluster, db)
        pg.sql("CREATE ROLE owner_a LOGIN")
        pg.sql("ALTER DATABASE db_a OWNER TO owner_a", dbname="postgres")
        for db in ("db_a", "db_b", "db_c"):
            wait_running(pg, db, 1)
        pids = {db: worker_rows(pg, db)[0][1] for db in ("db_a", "db_b")}
        with psycopg.connect(host=pg.tmp, port=pg.port, user="owner_a", dbname="postgres") as c:
            for _ in range(6):
                c.execute("ALTER DATABASE db_a RESET ALL")
            c.commit()
        # A later request, once served, shows the launcher has taken the earlier ones.
        pg.sql("ALTER DATABASE db_c SET outbox.workers = 2", dbname="postgres")
        wait_running(pg, "db_c", 2)
        assert {db: worker_rows(pg, db)[0][1] for db in ("db_a", "db_b")} == pids


def test_a_database_not_looked_into_for_want_of_a_slot_is_not_said_to_want_workers(mock_cluster):
    # The launcher looks into every database; "postgres" has no extension, and with the budget
    # used up its look waits: the reason must say that, not that it wants relay workers.
    with cluster(mock_cluster, **{"outbox.max_workers": "1", "outbox.launcher_naptime": "'1s'"}) as pg:
        add_database(pg, mock_cluster, "db_a")
        wait_running(pg, "db_a", 1)
        wait_until(lambda: "postgres" in launcher_rows(pg, "db_a"), 30, "postgres shown without a slot")
        state, _, _, error = launcher_rows(pg, "db_a")["postgres"]
        assert state == "no worker slot" and "to look into it" in error and "wanted" not in error, error


def runs(pg, db):
    """Each relay worker of `db` as (worker, pid, started_at): a restart changes them."""
    return pg.sql("SELECT worker, pid, started_at FROM outbox.workers ORDER BY worker", dbname=db)


def served_after(pg, db):
    """A request committed now, once served, shows the launcher has taken every earlier one:
    `db` (one worker) is restarted (new pid) and runs again."""
    before = runs(pg, db)
    pg.sql(f"ALTER DATABASE {db} SET outbox.workers = 1", dbname="postgres")
    wait_until(lambda: (r := runs(pg, db)) and r != before and r[0][1] is not None and running(pg, db) == 1, 60,
               f"{db} restarted for the later request")


def quote(text):
    return "'" + text.replace("'", "''") + "'"


def connect_as(pg, user, db, autocommit=False):
    return pg.connect(db, autocommit=autocommit, user=user)


# Every statement the utility hook looks at, each failing for a role with only CONNECT: of
# another database, a database that does not exist (distinct names, more than any request list
# holds), this very database, and the extension.
FAILING_FOR_A_ROLE_WITH_ONLY_CONNECT = [
    "ALTER DATABASE db_b SET outbox.workers = 1",
    "ALTER DATABASE db_b RESET outbox.workers",
    "ALTER DATABASE db_b RESET ALL",
    "ALTER DATABASE db_b SET work_mem = '1MB'",
    "ALTER DATABASE db_a SET outbox.workers = 1",
    "ALTER DATABASE db_a RESET outbox.workers",
    "ALTER DATABASE db_b RENAME TO db_x",
    "ALTER DATABASE db_b IS_TEMPLATE true",
    "ALTER DATABASE db_b CONNECTION LIMIT 1",
    "ALTER DATABASE db_b OWNER TO mallory",
    "ALTER ROLE mallory IN DATABASE db_b SET outbox.workers = 1",
    "DROP DATABASE IF EXISTS no_such_db",  # in a transaction block: refused
    "CREATE EXTENSION outbox",  # already exists
    "DROP EXTENSION outbox",
    "ALTER EXTENSION outbox UPDATE",
] + [f"ALTER DATABASE no_such_db_{i} SET outbox.workers = 1" for i in range(20)]


def test_a_role_with_only_connect_cannot_restart_any_relay(mock_cluster):
    # Issue 15 item 1: the hook took a statement as done before it ran; a failing one in a
    # savepoint or an EXCEPTION block, in a transaction that commits, restarted the relay of the
    # database it named, and a name that does not exist (or a full request list) every database's.
    with cluster(mock_cluster, **{"outbox.launcher_naptime": "'1h'"}) as pg:
        for db in ("db_a", "db_b", "db_c"):
            add_database(pg, mock_cluster, db)
        pg.sql("ALTER DATABASE db_b SET outbox.workers = 2", dbname="postgres")
        pg.sql("CREATE ROLE mallory LOGIN")
        for db in ("postgres", "db_b", "db_c"):  # CONNECT on db_a only
            pg.sql(f"REVOKE CONNECT ON DATABASE {db} FROM PUBLIC", dbname="postgres")
        wait_running(pg, "db_a", 1)
        wait_running(pg, "db_b", 2)
        wait_running(pg, "db_c", 1)
        before = {db: runs(pg, db) for db in ("db_a", "db_b")}
        with connect_as(pg, "mallory", "db_a") as c:
            for _ in range(3):
                for statement in FAILING_FOR_A_ROLE_WITH_ONLY_CONNECT:
                    c.execute("SAVEPOINT s")
                    with pytest.raises(psycopg.Error):
                        c.execute(statement)
                    c.execute("ROLLBACK TO SAVEPOINT s")
                # The same in PL/pgSQL's EXCEPTION blocks (a subtransaction each).
                body = "".join(f"BEGIN EXECUTE {quote(s)}; EXCEPTION WHEN OTHERS THEN NULL; END; "
                               for s in FAILING_FOR_A_ROLE_WITH_ONLY_CONNECT)
                c.execute(f"DO $$ BEGIN {body} END $$")
                # Statements that succeed and change nothing for the relay.
                c.execute("CREATE EXTENSION IF NOT EXISTS outbox")
                c.execute("ALTER ROLE mallory IN DATABASE db_b SET work_mem = '1MB'")
                c.commit()
        with connect_as(pg, "mallory", "db_a", autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS no_such_db")  # succeeds, drops nothing
            for statement in ("DROP DATABASE db_b", "ALTER DATABASE no_such_db SET outbox.workers = 1"):
                with pytest.raises(psycopg.Error):
                    c.execute(statement)
        served_after(pg, "db_c")
        assert {db: runs(pg, db) for db in ("db_a", "db_b")} == before


def test_only_a_committed_change_of_outbox_workers_restarts_and_only_its_database(mock_cluster):
    # A role that may change db_b's outbox.workers (its owner, granted SET on the parameter):
    # a change that succeeded but was rolled back (savepoint, EXCEPTION block, PREPARE
    # TRANSACTION then ROLLBACK PREPARED) restarts nothing; a committed one restarts db_b only.
    with cluster(mock_cluster, max_prepared_transactions="2",
                 **{"outbox.max_workers": "6", "outbox.launcher_naptime": "'1h'"}) as pg:
        if pg.value("SELECT current_setting('server_version_num')::int") < 150000:
            pytest.skip("GRANT SET ON PARAMETER is PostgreSQL 15+")
        for db in ("db_a", "db_b", "db_c"):
            add_database(pg, mock_cluster, db)
        pg.sql("CREATE ROLE owner_b LOGIN")
        pg.sql("ALTER DATABASE db_b OWNER TO owner_b", dbname="postgres")
        pg.sql("GRANT SET ON PARAMETER outbox.workers TO owner_b")
        for db in ("db_a", "db_b", "db_c"):
            wait_running(pg, db, 1)
        before = {db: runs(pg, db) for db in ("db_a", "db_b")}
        change = "ALTER DATABASE db_b SET outbox.workers = 3"
        with connect_as(pg, "owner_b", "db_b") as c:
            c.execute("SAVEPOINT s")
            c.execute(change)
            c.execute("ROLLBACK TO SAVEPOINT s")
            c.execute("SAVEPOINT outer_s")
            c.execute("SAVEPOINT inner_s")
            c.execute(change)
            c.execute("RELEASE SAVEPOINT inner_s")  # into outer_s, which is rolled back
            c.execute("ROLLBACK TO SAVEPOINT outer_s")
            c.execute(f"DO $$ BEGIN BEGIN {change}; RAISE EXCEPTION 'undo'; "
                      "EXCEPTION WHEN raise_exception THEN NULL; END; END $$")
            c.commit()
            c.execute(change)
            with pytest.raises(psycopg.errors.DivisionByZero):
                c.execute("SELECT 1 / 0")  # fails after it: the whole transaction rolls back
            c.rollback()
            c.execute(change)
            c.execute("PREPARE TRANSACTION 'p'")
        pg.sql("ROLLBACK PREPARED 'p'", dbname="db_b")
        served_after(pg, "db_c")
        assert {db: runs(pg, db) for db in ("db_a", "db_b")} == before
        assert pg.value("SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase "
                        "WHERE d.datname = 'db_b'") == 0
        # Committed through a released savepoint: db_b restarts with 3, db_a not at all.
        with connect_as(pg, "owner_b", "db_b") as c:
            c.execute("SAVEPOINT s")
            c.execute(change)
            c.execute("RELEASE SAVEPOINT s")
            c.commit()
        wait_running(pg, "db_b", 3)
        assert runs(pg, "db_a") == before["db_a"]


def test_requests_beyond_every_list_look_again_but_restart_only_what_changed(mock_cluster):
    # More databases in one transaction, and more sessions at once, than the launcher's request
    # list holds (the launcher is stopped meanwhile, so that they pile up): the overflow may make
    # it look at every database again, never restart one whose count did not change; the one
    # whose count did change is restarted, not lost in the overflow.
    with cluster(mock_cluster, **{"outbox.launcher_naptime": "'1h'"}) as pg:
        for db in ("db_a", "db_b", "db_c"):
            add_database(pg, mock_cluster, db)
        names = [f"plain_{i}" for i in range(20)]
        for name in names:
            pg.sql(f"CREATE DATABASE {name}", dbname="postgres")
        for db in ("db_a", "db_b", "db_c"):
            wait_running(pg, db, 1)
        before = runs(pg, "db_a")
        launcher = pg.value("SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox launcher'")
        os.kill(launcher, signal.SIGSTOP)
        try:
            with pg.connect("postgres", autocommit=False) as c:
                for name in names:
                    c.execute(f"ALTER DATABASE {name} SET outbox.workers = 1")
                c.execute("ALTER DATABASE db_b SET outbox.workers = 2")
                c.commit()
            sessions = [pg.connect("postgres", autocommit=False) for _ in names]
            try:
                for c, name in zip(sessions, names):
                    c.execute(f"ALTER DATABASE {name} RESET outbox.workers")
                for c in sessions:
                    c.commit()
            finally:
                for c in sessions:
                    c.close()
        finally:
            os.kill(launcher, signal.SIGCONT)
        wait_running(pg, "db_b", 2)
        served_after(pg, "db_c")
        assert runs(pg, "db_a") == before


def test_a_restart_keeps_the_database_slots_from_a_waiting_database(mock_cluster):
    # Issue 15 item 2: CREATE EXTENSION IF NOT EXISTS (any role that may connect: "already
    # exists, skipping" comes before any privilege check) restarted a database with its own
    # outbox.workers; and with the budget contended, a restarted database lost its slots to a
    # waiting one and stayed at 0 workers.
    with cluster(mock_cluster, **{"outbox.max_workers": "3", "outbox.launcher_naptime": "'1h'"}) as pg:
        add_database(pg, mock_cluster, "db_a")
        pg.sql("ALTER DATABASE db_a SET outbox.workers = 2", dbname="postgres")
        wait_running(pg, "db_a", 2)
        add_database(pg, mock_cluster, "db_c")
        wait_running(pg, "db_c", 1)
        add_database(pg, mock_cluster, "db_w")
        wait_until(lambda: launcher_rows(pg, "db_a").get("db_w", ("",))[0] == "no worker slot", 30,
                   "db_w waiting for a slot")
        pg.sql("CREATE ROLE mallory LOGIN")
        before = runs(pg, "db_a")
        with connect_as(pg, "mallory", "db_a") as c:
            for _ in range(20):
                c.execute("CREATE EXTENSION IF NOT EXISTS outbox")
                c.execute("SAVEPOINT s")
                with pytest.raises(psycopg.errors.DuplicateObject):
                    c.execute("CREATE EXTENSION outbox")
                c.execute("ROLLBACK TO SAVEPOINT s")
            c.commit()
        with connect_as(pg, "mallory", "db_a", autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS outbox")
        served_after(pg, "db_c")  # db_c restarted: it keeps its slot, db_w still waits
        assert runs(pg, "db_a") == before
        assert launcher_rows(pg, "db_a")["db_w"][0] == "no worker slot"

        # A restart the launcher decides (its count set again: worker 0 starts alone with the
        # probe count, then all of them with 2) keeps both of db_a's slots throughout.
        pg.sql("ALTER DATABASE db_a SET outbox.workers = 2", dbname="postgres")
        wait_until(lambda: (r := runs(pg, "db_a")) != before and len(r) == 2 and all(x[1] for x in r)
                   and running(pg, "db_a") == 2, 60, "db_a restarted with both workers")
        rows = launcher_rows(pg, "db_a")
        assert rows["db_a"][:3] == ("running", 2, 2) and rows["db_w"][0] == "no worker slot", rows
        assert running(pg, "db_w") == 0

        # A worker that stops by itself: the database's other worker stops too and both start
        # again on the slots it kept (before, worker 1's slot went to db_w, and its lanes waited).
        pid = runs(pg, "db_a")[1][1]
        assert pg.value("SELECT pg_terminate_backend(%s)", (pid,))
        wait_until(lambda: (r := runs(pg, "db_a")) and len(r) == 2 and all(x[1] for x in r) and pid not in
                   [x[1] for x in r] and running(pg, "db_a") == 2, 60, "db_a's two workers back")
        assert launcher_rows(pg, "db_a")["db_w"][0] == "no worker slot"
        for i in range(20):
            pg.sql("SELECT outbox.enqueue('db_a', %s, 'x'::text)", (f"k{i}",), dbname="db_a")
        wait_all_published(pg, "db_a")
