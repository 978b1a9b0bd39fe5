-- outbox 0.1.0: transactional outbox relayed to Apache Kafka.
-- The data path and state machine are described in DESIGN.md; the SQL reference in docs/sql-api.md.

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

-- The schema belongs to the extension (DROP EXTENSION removes it). Nothing in it is for PUBLIC:
-- CREATE EXTENSION runs as a superuser, who owns it; USAGE, table privileges and EXECUTE are
-- granted explicitly by the operator (docs/privileges.md).
CREATE SCHEMA outbox;
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;

-- A new install, for the rest of this transaction: nothing else can write its queue before it
-- commits, so the update chain's steps that move committed events (0.3.0 -> 0.4.0) need not ask
-- for READ COMMITTED (CREATE EXTENSION outbox runs the chain).
SELECT pg_catalog.set_config('outbox_install.new', 'on', true);

-- The events table. One row per event; `id` is the enqueue order.
--
-- State machine (status):
--   pending   --claim-->        in_flight   (worker committed the claim; lease held by the worker)
--   in_flight --acked-->        published   (partition, offset, published_at set)
--   in_flight --per-event err-> pending     (attempts + 1, next_attempt_at = now() + backoff)
--                            -> failed      (when attempts reaches outbox.max_attempts)
--   in_flight --broker-wide / unknown outcome / worker restart--> pending (attempts unchanged)
--   failed    --outbox.retry()-->            pending (attempts reset)
--   published --outbox.purge()-->            (deleted)
CREATE TABLE outbox.events (
	id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_id        uuid        NOT NULL UNIQUE,
	topic           text        NOT NULL,
	key             text,
	-- Which relay worker owns this key: a stable hash of the key (or of event_id for unkeyed
	-- events) in [0, 1024). Worker i of N claims the lanes with lane % N = i, so one key is only
	-- ever published by one worker at a time (DESIGN.md "Per-key order").
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
	CONSTRAINT events_status_check
		CHECK (status IN ('pending', 'in_flight', 'published', 'failed')),
	CONSTRAINT events_lane_check CHECK (lane >= 0 AND lane < 1024),
	CONSTRAINT events_published_check
		CHECK ((status = 'published') = (published_at IS NOT NULL))
);

COMMENT ON TABLE outbox.events IS
	'Outbox events; write with outbox.enqueue(), watch with outbox.backlog and outbox.failed';

-- The claim path: rows that still need a publish, in enqueue order. Partial, so its size follows
-- the live backlog, not the history.
CREATE INDEX events_pending_idx ON outbox.events (id) WHERE status = 'pending';
-- Per-key gating, probed for every claimed row: "does an earlier event of this key block it?"
-- Only blocking rows are in it (failed, or waiting for a retry: a pending row whose
-- next_attempt_at was moved past its created_at), so it stays tiny, the usual probe is empty,
-- and the claim/publish churn of healthy events never touches it.
CREATE INDEX events_blocking_key_idx ON outbox.events (key, id)
	WHERE status = 'failed' OR (status = 'pending' AND next_attempt_at > created_at);
-- "Did SKIP LOCKED pass over an earlier pending row of this key?" (one probe per key and claim).
CREATE INDEX events_pending_key_idx ON outbox.events (key, id) WHERE status = 'pending';
-- Retention: the oldest published rows first.
CREATE INDEX events_published_idx ON outbox.events (published_at) WHERE status = 'published';

-- The table is the queue: keep autovacuum close behind the relay's updates and purges.
ALTER TABLE outbox.events SET (autovacuum_vacuum_scale_factor = 0.01,
                               autovacuum_analyze_scale_factor = 0.02);

-- ---------------------------------------------------------------------------------------------
-- Enqueue. C functions: they validate, insert in the caller's transaction and wake a relay
-- worker when that transaction commits. They return the event id, or NULL when an event with the
-- given event_id already existed (nothing inserted, nothing raised).
-- SECURITY DEFINER so that an application role needs EXECUTE only, never table privileges.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION outbox.enqueue(topic text, key text, payload jsonb,
                               headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_enqueue_jsonb'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION outbox.enqueue(topic text, key text, payload text,
                               headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_enqueue_text'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION outbox.enqueue(topic text, key text, payload bytea,
                               headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_enqueue_bytea'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------------------------------------
-- Deterministic event ids: RFC 9562 UUID version 5 (docs/sql-api.md, outbox.event_id).
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION outbox.event_id(namespace uuid, name text)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_uuid_v5'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION outbox.event_id(aggregate text, discriminator text)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_event_id'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- ---------------------------------------------------------------------------------------------
-- Retention.
-- ---------------------------------------------------------------------------------------------

-- Deletes at most one batch of published rows older than `older_than` and returns how many.
-- One bounded statement: the caller (the relay worker, or purge_all below) commits between
-- batches, so no transaction holds a large set of row locks or a long xmin.
CREATE FUNCTION outbox.purge(older_than interval DEFAULT NULL, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	deleted bigint;
	retention interval := current_setting('outbox.retention')::interval;
BEGIN
	IF older_than IS NULL THEN
		IF retention = interval '0' THEN
			RAISE EXCEPTION 'outbox.purge() needs older_than while outbox.retention is 0 (off)'
				USING ERRCODE = 'null_value_not_allowed',
				      HINT = 'Pass the window, e.g. outbox.purge(interval ''7 days'').';
		END IF;
		older_than := retention;
	END IF;
	IF older_than < interval '0' THEN
		RAISE EXCEPTION 'older_than must not be negative: %', older_than
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Pass how old a published event must be to be deleted, e.g. interval ''7 days''.';
	END IF;
	IF batch_size IS NULL OR batch_size < 1 THEN
		RAISE EXCEPTION 'batch_size must be a positive integer, not %', coalesce(batch_size::text, 'NULL')
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Use a batch of a few thousand rows and call outbox.purge() again until it returns less.';
	END IF;

	DELETE FROM outbox.events e
	WHERE e.id IN (SELECT p.id FROM outbox.events p
	               WHERE p.status = 'published' AND p.published_at < now() - older_than
	               ORDER BY p.published_at
	               LIMIT batch_size);
	GET DIAGNOSTICS deleted = ROW_COUNT;
	RETURN deleted;
END
$$;

-- Deletes every published row older than `older_than`, committing after each batch.
-- (No SET clause: a procedure with one cannot COMMIT. It runs with the caller's rights and
-- names everything schema-qualified.)
CREATE PROCEDURE outbox.purge_all(older_than interval DEFAULT NULL, batch_size integer DEFAULT 10000)
LANGUAGE plpgsql
AS $$
BEGIN
	LOOP
		EXIT WHEN outbox.purge(older_than, batch_size) OPERATOR(pg_catalog.<) batch_size;
		COMMIT;
	END LOOP;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Poison events: put failed events back to pending.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION outbox.retry(event_id uuid)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	current_status text;
BEGIN
	IF retry.event_id IS NULL THEN
		RAISE EXCEPTION 'event_id must not be NULL'
			USING ERRCODE = 'null_value_not_allowed',
			      HINT = 'Pass the event_id shown by outbox.failed.';
	END IF;
	SELECT e.status INTO current_status FROM outbox.events e WHERE e.event_id = retry.event_id
	FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'no outbox event with event_id %', retry.event_id
			USING ERRCODE = 'no_data_found',
			      HINT = 'outbox.failed lists the events that can be retried.';
	END IF;
	IF current_status <> 'failed' THEN
		RAISE EXCEPTION 'outbox event % is %, not failed', retry.event_id, current_status
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      HINT = 'Only events in outbox.failed can be retried.';
	END IF;
	UPDATE outbox.events e
	SET status = 'pending', attempts = 0, next_attempt_at = now()
	WHERE e.event_id = retry.event_id;
	RETURN 1;
END
$$;

CREATE FUNCTION outbox.retry_failed(topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	WITH retried AS (
		UPDATE outbox.events e
		SET status = 'pending', attempts = 0, next_attempt_at = now()
		WHERE e.status = 'failed' AND (retry_failed.topic IS NULL OR e.topic = retry_failed.topic)
		RETURNING 1)
	SELECT count(*) FROM retried;
$$;

-- ---------------------------------------------------------------------------------------------
-- Monitoring.
-- ---------------------------------------------------------------------------------------------

-- One row per topic with anything in the table. The alert metric is oldest_pending_age.
CREATE VIEW outbox.backlog AS
SELECT topic,
       count(*) FILTER (WHERE status = 'pending')   AS pending,
       count(*) FILTER (WHERE status = 'in_flight') AS in_flight,
       count(*) FILTER (WHERE status = 'failed')    AS failed,
       count(*) FILTER (WHERE status = 'published') AS published,
       now() - min(created_at) FILTER (WHERE status IN ('pending', 'in_flight'))
           AS oldest_pending_age
FROM outbox.events
GROUP BY topic;

COMMENT ON VIEW outbox.backlog IS
	'Per topic: events waiting, being published, failed (poison) and published but not yet purged';

CREATE VIEW outbox.failed AS
SELECT event_id, topic, key, attempts, last_error, created_at
FROM outbox.events
WHERE status = 'failed';

COMMENT ON VIEW outbox.failed IS 'Poison events: failed outbox.max_attempts times; see outbox.retry()';

-- Relay workers, from shared memory (one row per configured worker).
CREATE FUNCTION outbox.worker_status(
	OUT worker integer, OUT pid integer, OUT state text, OUT published bigint, OUT failed bigint,
	OUT last_error text, OUT last_error_at timestamptz, OUT last_publish_at timestamptz,
	OUT broker_state text, OUT started_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_worker_status'
LANGUAGE C VOLATILE STRICT;

CREATE VIEW outbox.workers AS SELECT * FROM outbox.worker_status();

COMMENT ON VIEW outbox.workers IS
	'Relay workers: state, counters since start, last error, broker connection state';

-- With outbox.database set (deprecated), the relay publishes from that database only: say so
-- where nothing would be published. Empty (the default): every database is relayed.
DO $$
BEGIN
	IF current_setting('outbox.workers')::int > 0
	   AND current_setting('outbox.database') NOT IN ('', current_database()) THEN
		RAISE WARNING 'outbox events in database "%" will not be published', current_database()
			USING DETAIL = format('The relay publishes from outbox.database = "%s".', current_setting('outbox.database')),
			      HINT = 'Set outbox.database = '''' and restart to relay every database where the extension is installed.';
	END IF;
END
$$;

-- Explicitly nothing for PUBLIC (functions default to EXECUTE for PUBLIC). Grants that the
-- installing role's ALTER DEFAULT PRIVILEGES add to specific roles are not undone here.
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL PROCEDURES IN SCHEMA outbox FROM PUBLIC;
