"""Which librdkafka the installed extension loads: the tests' view of `make RDKAFKA_PREFIX=...`.

The tests' own Kafka clients (Debian's python3-confluent-kafka) always run Debian's librdkafka;
the relay runs whichever library outbox.so resolves. This asks the dynamic loader (ldd of the
outbox.so in `pg_config --pkglibdir`, pg_config first on PATH as test/run sets it) and then that
library itself (rd_kafka_version_str), in a child process so that the tests' own librdkafka is
not mixed with it.
"""

import collections
import functools
import re
import subprocess
import sys

ExtensionLibrdkafka = collections.namedtuple("ExtensionLibrdkafka", "path version number features")

_ASK = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.rd_kafka_version_str.restype = ctypes.c_char_p
lib.rd_kafka_conf_new.restype = ctypes.c_void_p
lib.rd_kafka_conf_get.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t))
features, size = ctypes.create_string_buffer(1024), ctypes.c_size_t(1024)
lib.rd_kafka_conf_get(lib.rd_kafka_conf_new(), b"builtin.features", features, ctypes.byref(size))
print(lib.rd_kafka_version_str().decode(), lib.rd_kafka_version(), features.value.decode())
"""


@functools.lru_cache(maxsize=None)
def extension_librdkafka():
    """(path of the librdkafka.so.1 outbox.so loads, its version string, rd_kafka_version(),
    its builtin.features: "oidc" where it was built with libcurl)."""
    pkglibdir = subprocess.run(["pg_config", "--pkglibdir"], stdout=subprocess.PIPE, text=True,
                               check=True).stdout.strip()
    ldd = subprocess.run(["ldd", f"{pkglibdir}/outbox.so"], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    found = re.search(r"^\s*librdkafka\.so\.\S+ => (\S+)", ldd, re.M)
    if not found:
        raise RuntimeError(f"outbox.so in {pkglibdir} resolves no librdkafka:\n{ldd}")
    version, number, features = subprocess.run([sys.executable, "-c", _ASK, found.group(1)], stdout=subprocess.PIPE,
                                     text=True, check=True).stdout.split()
    return ExtensionLibrdkafka(found.group(1), version, int(number), frozenset(features.split(",")))


# librdkafka 2.6.1 answers Kafka 4.x's SCRAM server-first message right (librdkafka#4895).
SCRAM_ON_KAFKA_4 = 0x020601ff


def relay_scrams_on_kafka_4():
    return extension_librdkafka().number >= SCRAM_ON_KAFKA_4
