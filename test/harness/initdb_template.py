"""A fresh data directory without running initdb for every cluster: initdb runs once per server
build and test process, into a template, and each cluster gets a copy of it (a copy takes a
tenth of initdb's time, which the suite pays hundreds of times).

A copy would share the template's system identifier, which initdb draws anew for every cluster
and which the extension reads (a restore into another cluster is told apart by it, DESIGN.md
"Re-base"). So each copy gets a new one, written where PostgreSQL keeps it: pg_control (whose
CRC-32C is recomputed) and the long header of the first page of every WAL segment (the startup
process refuses a segment of another system identifier). Little-endian machines only, as the
suite's."""

import atexit
import os
import shutil
import struct
import subprocess
import tempfile
import time

_templates = {}  # initdb's real path -> the template's data directory

# CRC-32C (Castagnoli), reflected, as PostgreSQL's pg_crc32c.
_CRC32C_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC32C_TABLE.append(_c)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# pg_control: ControlFileData starts with the system identifier (uint64); its crc field follows
# the bytes it covers. Its offset differs between majors: found by checking, as the server does.
_SYSID = struct.Struct("<Q")
_CRC = struct.Struct("<I")
# A WAL page's long header: the short header (24 bytes, MAXALIGNed), then xlp_sysid.
_XLP_INFO = struct.Struct("<H")  # at offset 2
_XLP_LONG_HEADER = 0x0002
_XLP_SYSID_OFFSET = 24


def _crc_offset(control):
    # The struct is followed by zeros up to the file's size (PG_CONTROL_FILE_SIZE): the CRC is
    # the last non-zero run's, and must check out.
    for offset in range(8, min(len(control), 1024) - 4, 4):
        if crc32c(control[:offset]) == _CRC.unpack_from(control, offset)[0] and not any(control[offset + 4:]):
            return offset
    raise RuntimeError("pg_control: no CRC-32C found over its first 1024 bytes")


def _new_system_identifier():
    # initdb's shape: seconds in the high 32 bits, then microseconds and pid bits; random here
    # (os.urandom: a test may seed the random module).
    now = time.time()
    return (int(now) << 32) | (int((now % 1) * 1_000_000) << 12) | (int.from_bytes(os.urandom(2), "little") & 0xFFF)


def set_system_identifier(datadir, sysid):
    """Writes `sysid` into the stopped cluster's pg_control and WAL segment headers."""
    path = os.path.join(datadir, "global", "pg_control")
    with open(path, "r+b") as f:
        control = bytearray(f.read())
        crc_at = _crc_offset(control)
        old = _SYSID.unpack_from(control, 0)[0]
        _SYSID.pack_into(control, 0, sysid)
        _CRC.pack_into(control, crc_at, crc32c(control[:crc_at]))
        f.seek(0)
        f.write(control)
    wal = os.path.join(datadir, "pg_wal")
    for name in os.listdir(wal):
        if len(name) != 24 or not all(c in "0123456789ABCDEF" for c in name):
            continue
        with open(os.path.join(wal, name), "r+b") as f:
            page = f.read(_XLP_SYSID_OFFSET + 8)
            if len(page) < _XLP_SYSID_OFFSET + 8 or not _XLP_INFO.unpack_from(page, 2)[0] & _XLP_LONG_HEADER:
                continue
            if _SYSID.unpack_from(page, _XLP_SYSID_OFFSET)[0] != old:
                raise RuntimeError(f"{name}: its long page header names another system identifier")
            f.seek(_XLP_SYSID_OFFSET)
            f.write(_SYSID.pack(sysid))


def run_initdb(initdb, datadir):
    """initdb as the harness makes every cluster: trust, superuser postgres, no fsync."""
    subprocess.run([initdb, "-D", datadir, "-A", "trust", "-U", "postgres", "--no-sync"], check=True,
                   stdout=subprocess.DEVNULL)


def _template(initdb):
    real = os.path.realpath(shutil.which(initdb) or initdb)
    datadir = _templates.get(real)
    if datadir is None:
        base = tempfile.mkdtemp(prefix="outbox-pg-template-")
        atexit.register(shutil.rmtree, base, True)
        datadir = os.path.join(base, "data")
        run_initdb(real, datadir)
        _templates[real] = datadir
    return datadir


def fresh_data_directory(initdb, datadir):
    """What `initdb -D datadir -A trust -U postgres --no-sync` makes, with a system identifier of
    its own."""
    shutil.copytree(_template(initdb), datadir, symlinks=True)
    os.chmod(datadir, 0o700)
    set_system_identifier(datadir, _new_system_identifier())
