"""postgres_exporter (the Prometheus community exporter) for the metrics tests: built once per
machine from the Go module proxy at a pinned version, started against a throwaway cluster with
docs/metrics/queries.yaml, scraped over HTTP.

The build is `go build` inside the module's downloaded source, not `go install pkg@version`:
the proxy here serves the version but not the module's version list, which `go install` reads
(for deprecation notices) and then fails on."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request

from harness.pg_cluster import free_port
from harness.wait import wait_until

MODULE = "github.com/prometheus-community/postgres_exporter"
VERSION = "v0.17.1"
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "outbox", "postgres_exporter", VERSION)
BINARY = os.path.join(CACHE, "postgres_exporter")
BUILD_TIMEOUT_S = 900


def go_command():
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if go is None:
        raise RuntimeError("building postgres_exporter needs Go 1.23 or later (`go` on PATH or /usr/local/go)")
    return go


def ensure_binary():
    """The cached binary, built first if it is not there."""
    if os.access(BINARY, os.X_OK):
        return BINARY
    go = go_command()
    os.makedirs(CACHE, exist_ok=True)
    env = dict(os.environ, GOFLAGS="-buildvcs=false -mod=readonly")
    info = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], env=env, check=True,
                          stdout=subprocess.PIPE, text=True, timeout=BUILD_TIMEOUT_S)
    source = json.loads(info.stdout)["Dir"]
    partial = BINARY + f".{os.getpid()}.partial"
    subprocess.run([go, "build", "-trimpath", "-o", partial, "./cmd/postgres_exporter"], cwd=source, env=env,
                   check=True, timeout=BUILD_TIMEOUT_S)
    os.replace(partial, BINARY)  # atomic: a concurrent or interrupted build never leaves half a binary
    return BINARY


class Exporter:
    """A running postgres_exporter on 127.0.0.1:<free port>; stopped on exit."""

    def __init__(self, dsn, queries_path, extra_args=()):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="postgres-exporter-", suffix=".log", delete=False)
        env = dict(os.environ, DATA_SOURCE_NAME=dsn)
        self.proc = subprocess.Popen(
            [ensure_binary(), f"--web.listen-address=127.0.0.1:{self.port}",
             f"--extend.query-path={queries_path}", *extra_args],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: self.proc.poll() is not None or self.get("/metrics"), 60, "postgres_exporter serving")
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres_exporter exited ({self.proc.returncode}):\n{self.log_text()}")
        except BaseException:
            self.close()
            raise

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            assert r.status == 200, r.status
            return r.read().decode()

    def scrape(self):
        """{(name, ((label, value), ...sorted)): value} of one scrape of /metrics."""
        return parse_metrics(self.get("/metrics"))

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        os.unlink(self.log.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """The Prometheus text format's samples (comments and blank lines skipped)."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = tuple(sorted((k, bytes(v, "utf-8").decode("unicode_escape")) for k, v in LABEL.findall(m.group(2) or "")))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples
