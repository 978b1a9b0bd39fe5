"""The claim's plan does not depend on statistics (issue: a burst after a quiet night lands in a
table nobody analyzed): the relay's own candidates and lock statements, read from
src/relay/relay_sql.cpp, planned with the settings the relay's session pins (src/relay/worker.cpp), walk
events_pending_idx in order and fetch by TID, for a backlog of 10 rows and of 200,000, over a
retained history, before and after ANALYZE, as custom and as generic plans."""

import json
import os
import re

import pytest

# 0.3.0's claim over its pending index (0.4.0's claim walks the members' order indexes:
# test_ring_relay.py).
pytestmark = pytest.mark.schema("0.3.0")

SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def source(name):
    with open(os.path.join(SRC, name)) as f:
        return f.read()


def relay_statement(name):
    return re.search(r'const char \*const ' + name + r' = R"SQL\((.*?)\)SQL"', source("relay/relay_sql.cpp"), re.S).group(1)


def relay_planner_pins():
    """The planner settings the relay pins, from worker.cpp's table of pins."""
    pins = dict(re.findall(r'\{"(enable_\w+)", "(\w+)"\}', source("relay/worker.cpp")))
    assert pins == {"enable_seqscan": "off", "enable_sort": "off"}, pins
    return pins


def nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def plan_of(c, statement, args):
    return json.loads(json.dumps(c.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {statement}({args})").fetchone()[0]))[0]["Plan"]


def assert_index_walk(c):
    for mode in ("force_custom_plan", "force_generic_plan"):
        c.execute(f"SET plan_cache_mode = {mode}")
        plan = plan_of(c, "candidates", "1, 0, 5000, true, NULL, NULL")
        assert plan["Node Type"] == "Limit", plan
        scan = plan["Plans"][0]
        assert scan["Node Type"] == "Index Scan" and scan["Index Name"] == "events_pending_idx", (mode, scan)
        assert not any(n["Node Type"] in ("Seq Scan", "Sort", "Bitmap Heap Scan") for n in nodes(plan)), (mode, plan)
        lock = plan_of(c, "lock", "'{\"(0,1)\"}'")
        assert lock["Node Type"] == "LockRows" and lock["Plans"][0]["Node Type"] == "Tid Scan", (mode, lock)
        # (Below the scan only the headers' ordered arrays, per row: a sort of one row's headers.)
        assert not any(n["Node Type"] in ("Seq Scan", "Index Scan", "Bitmap Heap Scan") for n in nodes(lock)), lock


@pytest.mark.parametrize("backlog", [10, 200_000])
def test_claim_walks_the_pending_index_with_or_without_statistics(make_relay, backlog):
    pg = make_relay("localhost:9", workers=0)
    with pg.connect() as c:
        c.execute("ALTER TABLE outbox.events SET (autovacuum_enabled = false)")
        # Retained history the claim must not read, then the burst, committed at once.
        c.execute("INSERT INTO outbox.events (event_id, topic, key, lane, payload, status, published_at, "
                  "kafka_partition, kafka_offset) SELECT e, 'billing', 'k' || (i % 1000), "
                  "outbox.lane_of('k' || (i % 1000), e), '\\x00', 'published', now(), 0, i "
                  "FROM (SELECT gen_random_uuid() AS e, i FROM generate_series(1, 100000) i) s")
        c.execute("SELECT count(outbox.enqueue((ARRAY['invoice','payment','refund','dunning'])[1 + i %% 4], "
                  "'k' || (i %% 1000), '{}'::jsonb)) FROM generate_series(1, %s) i", (backlog,))
        assert c.execute("SELECT last_analyze IS NULL AND last_autoanalyze IS NULL FROM pg_stat_user_tables "
                         "WHERE relid = 'outbox.events'::regclass").fetchone()[0]
        c.execute("SET search_path = pg_catalog, pg_temp")
        for name, setting in relay_planner_pins().items():
            c.execute(f"SET {name} = {setting}")
        c.execute("PREPARE candidates(integer, integer, integer, boolean, text[], text[]) AS "
                  + relay_statement("kCandidatesSql"))
        c.execute("PREPARE lock(tid[]) AS " + relay_statement("kLockSql"))
        assert_index_walk(c)
        c.execute("ANALYZE outbox.events")
        assert_index_walk(c)
