"""The SQL floor: the relay's own claim (candidates, lock) and record statements, read from
src/relay/relay_sql.cpp, run in a loop with no Kafka at all (every claimed event is recorded as
published at once), claim and record in one transaction as the relay runs them.

They run server-side in a PL/pgSQL procedure, the way the relay worker runs them through SPI:
static statements prepared once and cached (the same plan-cache choice between custom and generic
plans as SPI_prepare + SPI_keepplan). Only
the parameter placeholders $1..$9 are renamed to the procedure's variables. No client round trip
per row, so the floor is not flattered by psycopg overhead."""

import re
from pathlib import Path

RELAY_SQL = Path(__file__).resolve().parents[1] / "src" / "relay" / "relay_sql.cpp"


def relay_statements(path=RELAY_SQL):
    """{'candidates': sql, 'lock': sql, 'published': sql} exactly as the relay runs them."""
    text = Path(path).read_text()
    found = dict(re.findall(r'const char \*const (k\w+Sql) = R"SQL\((.*?)\)SQL";', text, re.S))
    return {"candidates": found["kCandidatesSql"], "lock": found["kLockSql"], "published": found["kPublishedSql"]}


# The relay's parameters, in order (relay_sql.cpp ClaimBatch / RecordOutcomes).
CANDIDATES_PARAMS = ["p_n_workers", "p_worker", "p_batch_size", "p_block_failed", "v_no_keys", "v_no_keys"]
LOCK_PARAMS = ["v_tids"]
PUBLISHED_PARAMS = ["v_ids", "v_partitions", "v_offsets"]


def _bind(sql, names):
    return re.sub(r"\$(\d+)", lambda m: names[int(m.group(1)) - 1], sql)


def procedure_sql():
    st = relay_statements()
    candidates = _bind(st["candidates"], CANDIDATES_PARAMS)
    lock = _bind(st["lock"], LOCK_PARAMS)
    # Inside one CALL, statement_timestamp() is the CALL's start for every batch; the relay runs
    # each record as a statement of its own. The drain's end is read from published_at.
    published = _bind(st["published"], PUBLISHED_PARAMS).replace("statement_timestamp()", "clock_timestamp()")
    return f"""
CREATE SCHEMA IF NOT EXISTS bench;
CREATE OR REPLACE PROCEDURE bench.sql_floor(p_n_workers int, p_worker int, p_batch_size int,
                                            p_batch_max_bytes bigint)
LANGUAGE plpgsql AS $proc$
DECLARE
	p_block_failed boolean := true;
	v_no_keys text[] := NULL;
	v_ids bigint[];
	v_tids tid[];
	v_partitions int[];
	v_offsets bigint[];
	v_n int;
	r record;
BEGIN
	LOOP
		v_ids := '{{}}';
		v_tids := '{{}}';
		-- claim, one transaction with the record (src/relay/relay_sql.cpp kCandidatesSql, kLockSql)
		FOR r IN {candidates}
		LOOP
			v_tids := v_tids || r.ctid;
		END LOOP;
		FOR r IN {lock}
		LOOP
			v_ids := v_ids || r.id;
		END LOOP;
		v_n := cardinality(v_ids);
		EXIT WHEN v_n = 0;
		v_partitions := array_fill(0, ARRAY[v_n]);
		v_offsets := ARRAY(SELECT generate_series(1, v_n)::bigint);
		-- The relay runs its record statement's generic plan (relay_sql.cpp published_stmt).
		PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
		-- record (src/relay/relay_sql.cpp kPublishedSql)
		{published};
		COMMIT;
	END LOOP;
END
$proc$;
"""


# --------------------------------------------------------------------------------------------
# Design-independent floors: what any relay of this table shape must pay in SQL, whatever its
# design, with no Kafka. They run on a table of their own, bench.floor_events: the columns of
# outbox.events as of 0.1.0 plus order_lsn, its primary key, UNIQUE (event_id) and one partial
# index on id WHERE status = 'pending' (the least a claim in id order needs); none of the relay's
# other indexes or checks, so that they do not move when the relay's schema does. Each batch:
# the tuned baseline's locking claim, then
#   delete:   DELETE ... WHERE id = ANY(claimed), COMMIT (a relay that keeps no history);
#   update:   one UPDATE to published, COMMIT (the tuned baseline's shape);
#   update2:  UPDATE to in_flight, COMMIT, then UPDATE to published, COMMIT (a claim transaction
#             and a record transaction, the relay's shape of 0.1.0).
# --------------------------------------------------------------------------------------------

FLOOR_MODES = {"delete": "claim + DELETE", "update": "claim + 1 UPDATE", "update2": "claim + 2 UPDATEs"}

FLOOR_TABLE_SQL = """
DROP TABLE IF EXISTS bench.floor_events;
CREATE TABLE bench.floor_events (
	id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_id        uuid        NOT NULL UNIQUE,
	topic           text        NOT NULL,
	key             text,
	lane            smallint    NOT NULL,
	payload         bytea,
	headers         jsonb,
	status          text        NOT NULL DEFAULT 'pending',
	attempts        integer     NOT NULL DEFAULT 0,
	next_attempt_at timestamptz NOT NULL DEFAULT now(),
	last_error      text,
	created_at      timestamptz NOT NULL DEFAULT now(),
	claimed_at      timestamptz,
	published_at    timestamptz,
	kafka_partition integer,
	kafka_offset    bigint,
	order_lsn       pg_lsn      NOT NULL DEFAULT pg_current_wal_insert_lsn()
) WITH (autovacuum_enabled = false);
CREATE INDEX floor_events_pending_idx ON bench.floor_events (id) WHERE status = 'pending';
"""

FLOOR_PROCEDURE_SQL = """
CREATE OR REPLACE PROCEDURE bench.floor_claim(p_mode text, p_batch int)
LANGUAGE plpgsql AS $proc$
DECLARE
	v_ids bigint[];
	v_bytes bigint;
BEGIN
	LOOP
		-- The tuned baseline's claim (bench/batched_relay.py --tuned); the payload bytes are read.
		SELECT array_agg(c.id), sum(octet_length(c.payload))
		  INTO v_ids, v_bytes
		  FROM (SELECT id, topic, key, payload, headers
		          FROM bench.floor_events
		         WHERE status = 'pending'
		         ORDER BY id
		         LIMIT p_batch
		           FOR UPDATE SKIP LOCKED) c;
		EXIT WHEN v_ids IS NULL;
		IF p_mode = 'delete' THEN
			DELETE FROM bench.floor_events WHERE id = ANY(v_ids);
		ELSIF p_mode = 'update' THEN
			UPDATE bench.floor_events SET status = 'published', published_at = now() WHERE id = ANY(v_ids);
		ELSE
			UPDATE bench.floor_events SET status = 'in_flight', claimed_at = now() WHERE id = ANY(v_ids);
			COMMIT;
			UPDATE bench.floor_events SET status = 'published', published_at = now(),
			       kafka_partition = 0, kafka_offset = id WHERE id = ANY(v_ids);
		END IF;
		COMMIT;
	END LOOP;
END
$proc$;
"""


def floor_load_sql(dataset):
    """INSERT of the first %(n)s events of bench.<dataset> into bench.floor_events, topics as in
    common.load (event n to topics[n % len])."""
    return (f"INSERT INTO bench.floor_events (event_id, topic, key, lane, payload, headers) "
            f"SELECT s.event_id, (%(topics)s::text[])[1 + s.n %% %(n_topics)s], s.key, "
            f"abs(hashtext(coalesce(s.key, s.event_id::text))) %% 1024, s.payload, s.headers "
            f"FROM (SELECT * FROM bench.{dataset} WHERE n <= %(n)s ORDER BY n) s")
