"""src/'s folders are the relay's parts (DESIGN.md "Source layout"), and the #include lines say
which part uses which. This keeps them honest, from the source alone (no build, no cluster): every
file sits in a part (only the module's two files at the top), every include of the project's own
headers is written from src/ (so a dependency is visible where it is made), a part includes only
what its rules allow, and nothing in kafka/ reaches a PostgreSQL header."""

import os
import re
import sys

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

# The module: _PG_init and the settings' definitions, which take their check hooks from the parts.
# It may use every part; no part uses it (it has no header).
TOP = {"module.cpp", "guc.cpp", "README.md"}

# What each part may include besides itself: a part by name, or one header of another part.
ALLOWED = {
    "shared": set(),
    "kafka": {"shared/no_postgres.hpp"},
    "enqueue": {"shared"},
    "relay": {"shared", "kafka/kafka_producer.hpp", "kafka/kafka_transactions.hpp", "launcher/launcher.hpp"},
    "launcher": {"shared", "relay/worker.hpp"},
}

# Includes that break the rules, each with why it stays for now. A new one is a design decision:
# it goes here with its reason, or the code moves.
EXCEPTIONS: dict = {}

# PostgreSQL's server headers: the top-level names of its include directory.
POSTGRES_HEADERS = re.compile(
    r"^(postgres|postgres_ext|postgres_fe|c|pg_config|pg_config_manual|pg_config_os|port|fmgr|funcapi|"
    r"miscadmin|pgstat|pgtar|pgtime|getopt_long|windowapi|rusagestub|libpq-fe)\.h$|"
    r"^(access|archive|bootstrap|catalog|commands|common|datatype|executor|fe_utils|foreign|jit|lib|libpq|"
    r"mb|nodes|optimizer|parser|partitioning|port|portability|postmaster|regex|replication|"
    r"rewrite|snowball|statistics|storage|tcop|tsearch|utils)/")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def source_files():
    for directory, subdirs, files in os.walk(SRC):
        subdirs.sort()
        for name in sorted(files):
            if name.endswith((".cpp", ".hpp", ".h", ".c")):
                yield os.path.relpath(os.path.join(directory, name), SRC)


def includes(path):
    """(quoted, name) of each #include of src/<path>, in order."""
    with open(os.path.join(SRC, path), encoding="utf-8") as f:
        return [(kind == '"', name) for kind, name in INCLUDE.findall(f.read())]


def own_header(path, name):
    """Whether `name` (a quoted include in src/<path>) means one of the project's files: found from
    src/ (the -Isrc path), beside the including file (where the compiler looks first), or named
    like one of them."""
    beside = os.path.join(SRC, os.path.dirname(path), name)
    known = {os.path.basename(p) for p in source_files()}
    return os.path.isfile(os.path.join(SRC, name)) or os.path.isfile(beside) or os.path.basename(name) in known


def part_of(path):
    return path.split("/")[0] if "/" in path else None


def layout_problems():
    problems = []
    for path in source_files():
        part = part_of(path)
        if part is None:
            if path not in TOP:
                problems.append(f"{path}: sits directly in src/; it belongs in one of {sorted(ALLOWED)}")
        elif part not in ALLOWED:
            problems.append(f"{path}: {part}/ is not a part of the layout ({sorted(ALLOWED)})")
        elif path.count("/") > 1:
            problems.append(f"{path}: parts have no sub-folders")
        for quoted, name in includes(path):
            if not (quoted and own_header(path, name)):
                if part == "kafka" and POSTGRES_HEADERS.search(name):
                    problems.append(f"{path}: includes PostgreSQL's {name}; kafka/ owns C++ objects (no_postgres.hpp)")
                continue
            if not os.path.isfile(os.path.join(SRC, name)) or part_of(name) is None:
                problems.append(f'{path}: #include "{name}" is not written from src/ (#include "<part>/{os.path.basename(name)}")')
                continue
            used = part_of(name)
            if part is None or used == part or (path, name) in EXCEPTIONS:
                continue
            if used not in ALLOWED.get(part, set()) and name not in ALLOWED.get(part, set()):
                problems.append(f"{path}: {part}/ may not include {name} (it may use {sorted(ALLOWED.get(part, ())) or 'nothing else'})")
    return problems


def test_every_file_sits_in_a_part_and_includes_only_what_its_part_may_use():
    problems = layout_problems()
    assert not problems, "\n".join(problems)


def test_kafka_files_ask_the_compiler_to_refuse_postgres_headers():
    """Every kafka/ source ends its includes with shared/no_postgres.hpp, whose static_assert
    fires when postgres.h came in by any way, a header's header included."""
    kafka = [p for p in source_files() if part_of(p) == "kafka" and p.endswith(".cpp")]
    assert kafka, "no kafka/ sources found"
    missing = [p for p in kafka if (True, "shared/no_postgres.hpp") not in includes(p)]
    assert missing == []


def test_every_rule_and_exception_names_a_file_that_exists():
    named = {n for allowed in ALLOWED.values() for n in allowed if "/" in n}
    named |= {n for pair in EXCEPTIONS for n in pair}
    assert sorted(n for n in named if not os.path.isfile(os.path.join(SRC, n))) == []
    stale = [pair for pair in EXCEPTIONS if (True, pair[1]) not in includes(pair[0])]
    assert stale == [], "an exception no longer needed: remove it"


@pytest.mark.parametrize("path, line, expected", [
    ("enqueue/commit_wake.cpp", '#include "relay/relay_sql.hpp"', "enqueue/ may not include relay/relay_sql.hpp"),
    ("relay/worker.cpp", '#include "enqueue/commit_order.hpp"', "relay/ may not include enqueue/commit_order.hpp"),
    ("shared/shmem.cpp", '#include "launcher/launcher.hpp"', "shared/ may not include launcher/launcher.hpp"),
    ("launcher/launcher.cpp", '#include "kafka/kafka_producer.hpp"', "launcher/ may not include kafka/kafka_producer.hpp"),
    ("kafka/secret_mask.cpp", '#include "shared/pg_include.hpp"', "kafka/ may not include shared/pg_include.hpp"),
    ("kafka/secret_mask.cpp", '#include "utils/elog.h"', "includes PostgreSQL's utils/elog.h"),
    ("kafka/secret_mask.cpp", "#include <postgres.h>", "includes PostgreSQL's postgres.h"),
    ("relay/worker.cpp", '#include "relay_sql.hpp"', "is not written from src/"),
    ("enqueue/enqueue.cpp", '#include "shmem.hpp"', "is not written from src/"),
])
def test_a_forbidden_include_is_found(tmp_path, monkeypatch, path, line, expected):
    """The check on a copy of src/ with one forbidden include added: it must be reported."""
    copy = tmp_path / "src"
    for rel in source_files():
        target = copy / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(os.path.join(SRC, rel), encoding="utf-8") as f:
            text = f.read()
        target.write_text(line + "\n" + text if rel == path else text, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "SRC", str(copy))
    found = layout_problems()
    assert any(p.startswith(path + ":") and expected in p for p in found), found


def test_a_file_directly_in_src_is_found(tmp_path, monkeypatch):
    copy = tmp_path / "src"
    copy.mkdir()
    (copy / "module.cpp").write_text("", encoding="utf-8")
    (copy / "outbox_helpers.cpp").write_text("", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "SRC", str(copy))
    assert [p.split(":")[0] for p in layout_problems()] == ["outbox_helpers.cpp"]
