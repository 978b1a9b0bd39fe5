"""A throwaway PostgreSQL cluster for the integration tests: initdb in a temp dir, its own port,
`shared_preload_libraries = 'outbox'`, stopped and removed afterwards. Never a system cluster."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import psycopg

from harness import crash_watch, initdb_template
from harness.wait import wait_until


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    def __init__(self, settings=None, database="postgres", create_extension=True, datadir=None, bindir=None,
                 harness_defaults=True):
        # bindir: the server's programs (initdb, pg_ctl); default: the first on PATH.
        # harness_defaults=False: postgresql.conf gets only `settings` and where the server listens
        # (a socket in the temp dir, a free port): not the harness's faster polls and backoffs,
        # fsync = off, more worker processes, nor even shared_preload_libraries. For a cluster
        # configured only as a document says (test_readme_quickstart.py).
        self.bindir = bindir
        self.tmp = tempfile.mkdtemp(prefix="outbox-pg-")
        self.datadir = datadir or os.path.join(self.tmp, "data")
        self.port = free_port()
        self.database = database
        self.log_path = os.path.join(self.tmp, "postgres.log")
        where_it_listens = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.tmp}'",
            "port": str(self.port),
        }
        self.settings = where_it_listens if not harness_defaults else {
            "shared_preload_libraries": "'outbox'",
            "outbox.poll_interval": "'2s'",
            "outbox.backoff_base": "'100ms'",
            "outbox.backoff_max": "'1s'",
            "outbox.publish_timeout": "'5s'",
            **where_it_listens,
            "fsync": "off",
            "max_worker_processes": "40",
            # warning (the default) shows ERROR lines too; "log" would hide them (LOG ranks above
            # ERROR in log_min_messages). The crash watch reads this log (harness/crash_watch.py).
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] %b '",
        }
        self.settings.update(settings or {})
        self.create_extension = create_extension
        self.started = False
        self.watch = crash_watch.Registration(self.log_path)

    def program(self, name):
        return os.path.join(self.bindir, name) if self.bindir else name

    # -- lifecycle ---------------------------------------------------------------------------
    def init(self):
        if not os.path.exists(os.path.join(self.datadir, "PG_VERSION")):
            # A copy of one initdb per server build, with a system identifier of its own
            # (harness/initdb_template.py); OUTBOX_TEST_INITDB=1 runs initdb for each cluster.
            if os.environ.get("OUTBOX_TEST_INITDB") == "1":
                initdb_template.run_initdb(self.program("initdb"), self.datadir)
            else:
                initdb_template.fresh_data_directory(self.program("initdb"), self.datadir)
        self.write_conf()
        return self

    def write_conf(self):
        with open(os.path.join(self.datadir, "postgresql.conf"), "a") as f:
            f.write("\n# outbox test harness\n")
            for k, v in self.settings.items():
                f.write(f"{k} = {v}\n")

    def start(self):
        subprocess.run([self.program("pg_ctl"), "-D", self.datadir, "-l", self.log_path, "-w", "-t", "120", "start"],
                       check=True, stdout=subprocess.DEVNULL)
        self.started = True
        return self

    def setup_database(self):
        # The relay's database: postgres exists from initdb on. Another one is only created when
        # the extension is wanted, so tests can name a missing database. The launcher relays
        # every database where the extension is installed (outbox.database unset), and starts
        # the workers at CREATE EXTENSION's commit.
        if self.database != "postgres" and self.create_extension:
            with self.connect("postgres") as c:
                c.execute(f'CREATE DATABASE "{self.database}"')
        if self.create_extension:
            # create_extension: True for the default version, or a version string ('0.3.0') for
            # the tests of an older schema that existing installs keep until they update.
            version = self.create_extension if isinstance(self.create_extension, str) else None
            with self.connect() as c:
                c.execute("CREATE EXTENSION outbox" + (f" VERSION '{version}'" if version else ""))
        return self

    def stop(self, mode="fast"):
        if self.started:
            subprocess.run([self.program("pg_ctl"), "-D", self.datadir, "-m", mode, "-w", "-t", "120", "stop"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.started = False

    def restart(self):
        self.stop()
        self.start()

    def reload(self):
        self.sql("SELECT pg_reload_conf()")

    def set(self, **settings):
        """ALTER SYSTEM each outbox.* setting (keyword: name without prefix) and reload. The reload
        is asynchronous: a worker takes the value when it next checks, possibly after work the
        test's next statement wakes it for. A test that needs the value in place before acting
        sets it at make_relay, or waits for its effect."""
        for name, value in settings.items():
            literal = "'" + str(value).replace("'", "''") + "'"
            self.sql(f"ALTER SYSTEM SET outbox.{name} = {literal}", dbname="postgres")
        self.reload()

    def cleanup(self):
        # Also stops a server whose start was interrupted (postmaster.pid is there).
        if os.path.exists(os.path.join(self.datadir, "postmaster.pid")):
            self.started = True
        self.stop("immediate")
        self.watch.close(self.log())
        if not os.environ.get("OUTBOX_KEEP_TMP"):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        try:
            self.init().start().setup_database()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc):
        self.cleanup()

    # -- access ------------------------------------------------------------------------------
    def connect(self, dbname=None, autocommit=True, user="postgres"):
        return psycopg.connect(host=self.tmp, port=self.port, user=user, dbname=dbname or self.database,
                               autocommit=autocommit)

    def sql(self, query, params=None, dbname=None):
        with self.connect(dbname) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else None

    def value(self, query, params=None, dbname=None):
        rows = self.sql(query, params, dbname)
        return rows[0][0] if rows else None

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:  # never started
            return ""

    def workers(self, conn=None):
        """outbox.workers' rows, over `conn` (a connection the caller keeps) or a new one."""
        query = ("SELECT worker, pid, state, published, failed, last_error, broker_state "
                 "FROM outbox.workers ORDER BY worker")
        return conn.execute(query).fetchall() if conn is not None else self.sql(query)

    def worker_pids(self, conn=None):
        return [r[1] for r in self.workers(conn)]

    def wait_workers_running(self, n, timeout=60):
        return wait_until(lambda: (lambda w: len(w) == n and all(r[1] for r in w))(self.workers()),
                          timeout, f"{n} relay workers running")

    def kill_worker(self, index=0, sig=signal.SIGKILL):
        pid = self.value("SELECT pid FROM outbox.workers WHERE worker = %s", (index,))
        assert pid, "worker not running"
        if sig == signal.SIGKILL:
            self.expect_killed(pid)
        os.kill(pid, sig)
        return pid

    def expect_killed(self, pid):
        """Declares a SIGKILL of `pid` that the test caused: the crash watch allows its line."""
        self.watch.expect_killed(pid)

    def wait_published(self, n, timeout=60):
        return wait_until(lambda: self.value("SELECT count(*) FROM outbox.events WHERE status = 'published'") >= n,
                          timeout, f"{n} events published")

    # -- replication (test_failover.py) ------------------------------------------------------
    def make_standby(self, application_name, settings=None):
        """A streaming standby of this (running) cluster: pg_basebackup -R into a temp dir of its
        own, its own port and socket, `application_name` in primary_conninfo (the name the
        primary's outbox.failover_standbys and pg_stat_replication know it by). Returned
        configured, not started; the caller cleans it up."""
        standby = PgCluster(settings=settings, database=self.database, create_extension=False)
        subprocess.run(["pg_basebackup", "-h", self.tmp, "-p", str(self.port), "-U", "postgres",
                        "-D", standby.datadir, "-R", "-X", "stream", "-c", "fast", "--no-sync"],
                       check=True, stdout=subprocess.DEVNULL)
        # The copied postgresql.conf is the primary's: the standby's own lines go after it.
        standby.init()
        with open(os.path.join(standby.datadir, "postgresql.auto.conf"), "a") as f:
            f.write(f"primary_conninfo = 'host={self.tmp} port={self.port} user=postgres "
                    f"application_name={application_name}'\n")
        return standby

    def wait_streaming(self, application_name, timeout=60):
        return wait_until(lambda: self.value("SELECT count(*) FROM pg_stat_replication "
                                             "WHERE application_name = %s AND state = 'streaming'",
                                             (application_name,), dbname="postgres"),
                          timeout, f"standby {application_name} streaming")

    def promote(self, timeout=60):
        subprocess.run(["pg_ctl", "-D", self.datadir, "-w", "-t", str(timeout), "promote"],
                       check=True, stdout=subprocess.DEVNULL)
        wait_until(lambda: self.value("SELECT NOT pg_is_in_recovery()", dbname="postgres"), timeout,
                   "promotion")

    def assert_no_crash_in_log(self):
        found = crash_watch.crashes(self.log(), self.watch.data["expected_kills"])
        assert not found, "\n".join(found)
