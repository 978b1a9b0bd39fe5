"""The SQL floor: the relay's own claim and record statements, read from src/relay_sql.cpp, run
in a loop with no Kafka at all (every claimed event is recorded as published at once).

They run server-side in a PL/pgSQL procedure, the way the relay worker runs them through SPI:
static statements prepared once and cached (the same plan-cache choice between custom and generic
plans as SPI_prepare + SPI_keepplan), claim and record each in a transaction of their own. Only
the parameter placeholders $1..$9 are renamed to the procedure's variables. No client round trip
per row, so the floor is not flattered by psycopg overhead."""

import re
from pathlib import Path

RELAY_SQL = Path(__file__).resolve().parents[1] / "src" / "relay_sql.cpp"


def relay_statements(path=RELAY_SQL):
    """{'claim': sql, 'record': sql} exactly as the relay runs them."""
    text = Path(path).read_text()
    found = dict(re.findall(r'const char \*const (k\w+Sql) = R"SQL\((.*?)\)SQL";', text, re.S))
    return {"claim": found["kClaimSql"], "record": found["kRecordSql"]}


# The relay's parameters, in order (relay_sql.cpp ClaimBatch / RecordOutcomes).
CLAIM_PARAMS = ["p_n_workers", "p_worker", "p_batch_size", "p_block_failed", "p_batch_max_bytes"]
RECORD_PARAMS = ["v_ids", "v_outcomes", "v_partitions", "v_offsets", "v_errors",
                 "p_max_attempts", "p_backoff_base_ms", "p_backoff_max_ms", "p_defer_ms"]


def _bind(sql, names):
    return re.sub(r"\$(\d+)", lambda m: names[int(m.group(1)) - 1], sql)


def procedure_sql():
    st = relay_statements()
    claim = _bind(st["claim"], CLAIM_PARAMS)
    record = _bind(st["record"], RECORD_PARAMS)
    return f"""
CREATE SCHEMA IF NOT EXISTS bench;
CREATE OR REPLACE PROCEDURE bench.sql_floor(p_n_workers int, p_worker int, p_batch_size int,
                                            p_batch_max_bytes bigint)
LANGUAGE plpgsql AS $proc$
DECLARE
	p_block_failed boolean := true;
	p_max_attempts int := 10;
	p_backoff_base_ms int := 1000;
	p_backoff_max_ms int := 300000;
	p_defer_ms bigint := 1000;
	v_ids bigint[];
	v_outcomes text[];
	v_partitions int[];
	v_offsets bigint[];
	v_errors text[];
	v_n int;
	r record;
BEGIN
	LOOP
		v_ids := '{{}}';
		-- The relay commits its claims without waiting for the WAL flush (relay_sql.cpp).
		PERFORM set_config('synchronous_commit', 'off', true);
		-- claim (src/relay_sql.cpp kClaimSql)
		FOR r IN {claim}
		LOOP
			v_ids := v_ids || r.id;
		END LOOP;
		COMMIT;
		v_n := cardinality(v_ids);
		EXIT WHEN v_n = 0;
		v_outcomes := array_fill('p'::text, ARRAY[v_n]);
		v_partitions := array_fill(0, ARRAY[v_n]);
		v_offsets := ARRAY(SELECT generate_series(1, v_n)::bigint);
		v_errors := array_fill(NULL::text, ARRAY[v_n]);
		-- The relay runs its record statement's generic plan (relay_sql.cpp record_stmt).
		PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
		-- record (src/relay_sql.cpp kRecordSql)
		FOR r IN {record}
		LOOP
			NULL;
		END LOOP;
		COMMIT;
	END LOOP;
END
$proc$;
"""
