-- outbox 0.1.0 -> 0.2.0: the table refuses rows the relay could not publish, the queue survives
-- pg_dump, the relay runs as a role of its own, publishes a (topic, key) in commit order and
-- writes each event once. (A new install runs 0.1.0, then this.)

\echo Use "ALTER EXTENSION outbox UPDATE" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- Row shapes. enqueue() only ever writes rows that pass these; the checks stop rows written by
-- hand (docs/sql-api.md "The table") that would otherwise make the relay loop on an error or misorder a
-- key. Validating them scans the table once; a row written by hand that breaks one makes the
-- update fail with the constraint's name, and nothing changes (docs/upgrading.md).
-- ---------------------------------------------------------------------------------------------

-- The lane a key (or, unkeyed, an event id) belongs to: the same 32-bit FNV-1a that enqueue
-- computes in C, so the check below and the relay agree on which worker owns a row.
CREATE FUNCTION outbox.lane_of(key text, event_id uuid)
RETURNS smallint
AS 'MODULE_PATHNAME', 'outbox_lane_of'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
-- Not for PUBLIC, like everything in the schema; a role writing rows by hand needs EXECUTE on it.
REVOKE ALL ON FUNCTION outbox.lane_of(text, uuid) FROM PUBLIC;

-- The rules of a row, for the table's one CHECK (events_row_check, below, once the envelope
-- columns exist): src/enqueue/row_check.cpp. One C function rather than a CHECK per rule: PostgreSQL
-- prepares every CHECK expression again for each INSERT and UPDATE statement, and a CHECK per rule
-- cost enqueue's one-row INSERT more than the row itself. A broken rule raises check_violation
-- with the rule's own constraint name (events_lane_of_key_check, events_topic_check, ...).
-- A CHECK rather than a generated lane column: enqueue passes the lane with every insert, so a
-- library and a schema of different versions keep working together while an upgrade is under
-- way, and the update rewrites no table.
CREATE FUNCTION outbox.events_row_check(status text, lane smallint, key text, event_id uuid, topic text,
                                        headers jsonb, has_payload boolean, attempts integer,
                                        created_at timestamptz, next_attempt_at timestamptz,
                                        claimed_at timestamptz, published_at timestamptz,
                                        kafka_partition integer, kafka_offset bigint,
                                        target_partition integer, ce_content_type text, ce_type text,
                                        ce_source text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_events_row_check'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
-- Like lane_of: a role writing rows by hand needs EXECUTE on it (a CHECK runs with the writer's
-- rights).
REVOKE ALL ON FUNCTION outbox.events_row_check(text, smallint, text, uuid, text, jsonb, boolean, integer,
                                               timestamptz, timestamptz, timestamptz, timestamptz,
                                               integer, bigint, integer, text, text, text) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- Commit order (DESIGN.md "Commit order"). The relay publishes a (topic, key)'s events in
-- order_lsn order. enqueue's insert stamps the WAL insert position; when another transaction
-- with events of the same (topic, key) committed after that stamp was taken, the enqueuing
-- transaction re-stamps its rows of that key at commit, under a per-(topic, key) lock held until
-- the commit is visible, so the order follows commit order whatever the identity's CACHE or the
-- wall clock does. Rows of 0.1.0 keep id order: they all read as 0/0 (no table rewrite), and id
-- breaks ties.
-- ---------------------------------------------------------------------------------------------
ALTER TABLE outbox.events ADD COLUMN order_lsn pg_lsn NOT NULL DEFAULT '0/0';
ALTER TABLE outbox.events ALTER COLUMN order_lsn SET DEFAULT pg_catalog.pg_current_wal_insert_lsn();

-- ---------------------------------------------------------------------------------------------
-- The hot path (DESIGN.md "Data path"): the relay keeps a batch's rows locked while it publishes
-- them and then writes each row once; nothing is in_flight any more (the status stays valid so
-- that rows of a 0.1.0 relay are put back to pending). next_attempt_at is NULL until the relay
-- makes an event wait (a retry's backoff, an unavailable partition): the waiting rows, and only
-- they, are in events_waiting_idx, whatever the wall clock did meanwhile.
-- ---------------------------------------------------------------------------------------------
ALTER TABLE outbox.events ALTER COLUMN next_attempt_at DROP NOT NULL,
                          ALTER COLUMN next_attempt_at DROP DEFAULT;
UPDATE outbox.events SET next_attempt_at = NULL
WHERE status IN ('pending', 'in_flight') AND next_attempt_at <= created_at;

DROP INDEX outbox.events_pending_idx;
DROP INDEX outbox.events_pending_key_idx;
DROP INDEX outbox.events_blocking_key_idx;
-- The claim: rows that still need a publish, in order_lsn order (one entry per event).
CREATE INDEX events_pending_idx ON outbox.events (order_lsn, id) WHERE status = 'pending';
-- Per-(topic, key) gating, probed per claimed row: "does an earlier event of this (topic, key)
-- wait or block?" Only waiting, failed and orphaned in_flight rows are in it, so the usual probe
-- finds nothing.
CREATE INDEX events_waiting_idx ON outbox.events (topic, key, order_lsn, id)
	WHERE status IN ('failed', 'in_flight') OR (status = 'pending' AND next_attempt_at IS NOT NULL);

CREATE OR REPLACE FUNCTION outbox.retry(event_id uuid)
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
	SET status = 'pending', attempts = 0, next_attempt_at = NULL
	WHERE e.event_id = retry.event_id;
	RETURN 1;
END
$$;

CREATE OR REPLACE FUNCTION outbox.retry_failed(topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	WITH retried AS (
		UPDATE outbox.events e
		SET status = 'pending', attempts = 0, next_attempt_at = NULL
		WHERE e.status = 'failed' AND (retry_failed.topic IS NULL OR e.topic = retry_failed.topic)
		RETURNING 1)
	SELECT count(*) FROM retried;
$$;

-- Orphans of a crash or an error: the relay puts its lanes' in-flight rows back to pending
-- before every claim, so this must not read the retained history.
CREATE INDEX events_in_flight_idx ON outbox.events (id) WHERE status = 'in_flight';

-- ---------------------------------------------------------------------------------------------
-- pg_dump: the queue is data, not extension scaffolding. Without these a dump and restore
-- recreates an empty table (and a sequence starting at 1 again).
-- ---------------------------------------------------------------------------------------------
SELECT pg_catalog.pg_extension_config_dump('outbox.events', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_id_seq', '');

-- ---------------------------------------------------------------------------------------------
-- The relay's role (outbox.relay_role, default outbox_relay): every relay statement runs as it,
-- never as a superuser, with exactly these rights. NOLOGIN: the relay switches to it inside its
-- own session (docs/privileges.md). A role that already exists is used as it is, unless it has
-- an attribute that reaches further (SUPERUSER, LOGIN, ...); the relay checks that again before
-- every step, and refuses it while other roles are members of it (they could act as it).
-- ---------------------------------------------------------------------------------------------
DO $$
DECLARE
	relay_role text := current_setting('outbox.relay_role');
	r record;
BEGIN
	SELECT * INTO r FROM pg_catalog.pg_roles WHERE rolname = relay_role;
	IF NOT FOUND THEN
		EXECUTE format('CREATE ROLE %I NOLOGIN', relay_role);
	ELSIF r.rolsuper OR r.rolcanlogin OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls THEN
		-- Someone could log in as it, or it reaches beyond outbox.events: it must not get the
		-- rights below (every event's payload).
		RAISE EXCEPTION 'outbox.relay_role "%" is a role with SUPERUSER, LOGIN, CREATEROLE, CREATEDB, REPLICATION or BYPASSRLS', relay_role
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'The relay runs as this role: name a plain NOLOGIN role, or drop the setting to use outbox_relay.';
	END IF;
	EXECUTE format('GRANT USAGE ON SCHEMA outbox TO %I', relay_role);
	EXECUTE format('GRANT SELECT, UPDATE, DELETE ON outbox.events TO %I', relay_role);
	-- The row check runs on every update of a row, with the updating role's rights.
	EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.events_row_check(text, smallint, text, uuid, text, jsonb, '
	               'boolean, integer, timestamptz, timestamptz, timestamptz, timestamptz, integer, bigint, '
	               'integer, text, text, text) TO %I', relay_role);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Consumer-side dedup (docs/consumers.md). Delivery is at least once; a
-- consumer that writes to Postgres gets each effect once by marking the event in the same
-- transaction as the effect: outbox.consume_once(consumer, event_id) is true the first time and
-- false for a duplicate. The marks are the dedup ledger: kept for outbox.consumed_retention,
-- then purged (a duplicate arriving later is applied again: the documented trade-off). The
-- consumer's database may be any database with the extension, without a relay.
-- ---------------------------------------------------------------------------------------------
-- The dedup window, read from the library rather than with current_setting(): calling it loads the
-- library, which refuses to run without shared_preload_libraries; without the preload
-- outbox.consumed_retention would be a placeholder any session can SET, and '1s' would purge
-- every consumer's marks.
CREATE FUNCTION outbox.consumed_retention()
RETURNS interval
AS 'MODULE_PATHNAME', 'outbox_consumed_retention'
LANGUAGE C STABLE PARALLEL SAFE;

CREATE TABLE outbox.consumed (
	consumer    text        NOT NULL,
	event_id    uuid        NOT NULL,
	consumed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, event_id),
	-- What consume_once refuses, for rows written by hand too.
	CONSTRAINT consumed_consumer_check CHECK (octet_length(consumer) BETWEEN 1 AND 255)
);
COMMENT ON TABLE outbox.consumed IS
	'Consumer dedup ledger: one row per (consumer, event_id) applied; write with outbox.consume_once()';
-- Retention: the oldest marks first.
CREATE INDEX consumed_consumed_at_idx ON outbox.consumed (consumed_at);
-- The ledger belongs with the effects it guards: a dump of the consumer's database keeps it.
SELECT pg_catalog.pg_extension_config_dump('outbox.consumed', '');

-- True when (consumer, event_id) was not marked yet: the mark is inserted in the caller's
-- transaction and commits or rolls back with the caller's effects. False for a duplicate. A
-- session marking the same pair concurrently waits for the first one's transaction (false if it
-- commits, true if it rolls back); at REPEATABLE READ or SERIALIZABLE that wait ends in a
-- serialization failure when the first commits (retry the transaction). At READ COMMITTED each
-- call also removes up to two marks older than outbox.consumed_retention (any consumer's; locked
-- ones are skipped), so the ledger stays bounded without a scheduler; above READ COMMITTED it
-- leaves that to outbox.purge_consumed(), since a mark another session purged meanwhile would be
-- a serialization failure there. SECURITY DEFINER: callers need EXECUTE, no table rights.
CREATE FUNCTION outbox.consume_once(consumer text, event_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	retention interval := outbox.consumed_retention();
	marked boolean;
BEGIN
	IF consume_once.consumer IS NULL OR consume_once.event_id IS NULL THEN
		RAISE EXCEPTION 'outbox.consume_once(): % must not be NULL',
			CASE WHEN consume_once.consumer IS NULL THEN 'consumer' ELSE 'event_id' END
			USING ERRCODE = 'null_value_not_allowed',
			      HINT = 'Pass the consuming service''s name and the record''s event_id header.';
	END IF;
	IF octet_length(consume_once.consumer) NOT BETWEEN 1 AND 255 THEN
		RAISE EXCEPTION 'outbox.consume_once(): consumer must be 1 to 255 bytes, not %',
			octet_length(consume_once.consumer)
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Name the consuming service, e.g. its Kafka consumer group id.';
	END IF;

	INSERT INTO outbox.consumed (consumer, event_id)
	VALUES (consume_once.consumer, consume_once.event_id)
	ON CONFLICT ON CONSTRAINT consumed_pkey DO NOTHING;
	marked := FOUND;

	-- Two per mark: a backlog of expired marks shrinks while consumers run.
	IF retention > interval '0' AND current_setting('transaction_isolation') = 'read committed' THEN
		PERFORM outbox.purge_consumed(retention, 2);
	END IF;
	RETURN marked;
END
$$;

-- Deletes at most batch_size marks older than older_than (NULL: outbox.consumed_retention) and
-- returns how many; call it until it returns less than batch_size (or let consume_once's
-- amortized purge keep up). For the consumer database's operator to schedule when consumers
-- run above READ COMMITTED or stop for a long time. Planned for each call's values: a generic
-- plan (LIMIT unknown) sorts the whole ledger, which made consume_once's two-row purge grow with
-- the table (150 us per call at 10,000 marks); with the values it walks consumed_at_idx.
CREATE FUNCTION outbox.purge_consumed(older_than interval DEFAULT NULL, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
	deleted bigint;
	retention interval := outbox.consumed_retention();
BEGIN
	IF older_than IS NULL THEN
		IF retention = interval '0' THEN
			RAISE EXCEPTION 'outbox.purge_consumed() needs older_than while outbox.consumed_retention is 0 (keep forever)'
				USING ERRCODE = 'null_value_not_allowed',
				      HINT = 'Pass the window, e.g. outbox.purge_consumed(interval ''30 days'').';
		END IF;
		older_than := retention;
	END IF;
	IF older_than < interval '0' THEN
		RAISE EXCEPTION 'older_than must not be negative: %', older_than
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Pass how old a consumer''s mark must be to be deleted, e.g. interval ''30 days''.';
	END IF;
	IF batch_size IS NULL OR batch_size < 1 THEN
		RAISE EXCEPTION 'batch_size must be a positive integer, not %', coalesce(batch_size::text, 'NULL')
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Use a batch of a few thousand rows and call outbox.purge_consumed() again until it returns less.';
	END IF;

	DELETE FROM outbox.consumed c
	WHERE c.ctid = ANY (ARRAY(SELECT e.ctid FROM outbox.consumed e
	                          WHERE e.consumed_at < now() - older_than
	                          ORDER BY e.consumed_at LIMIT batch_size
	                          FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS deleted = ROW_COUNT;
	RETURN deleted;
END
$$;

-- Like everything in the schema, nothing for PUBLIC: the operator grants EXECUTE on
-- consume_once to each consumer role (docs/privileges.md); purge_consumed stays with superusers.
REVOKE ALL ON TABLE outbox.consumed FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.consume_once(text, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.purge_consumed(interval, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.consumed_retention() FROM PUBLIC;

-- Envelopes (docs/envelopes.md): CloudEvents, W3C trace context, an explicit
-- partition, the record's timestamp. Nothing here costs a row that uses none of it: the new
-- columns are nullable without a default (no table rewrite, NULL in the row's null bitmap), the
-- trace context travels in headers, and the relay computes the ce_* headers at publish time.
-- ---------------------------------------------------------------------------------------------
ALTER TABLE outbox.events
	-- The partition enqueue was asked for; NULL: the partitioner picks (by key). Checked against
	-- the topic's partition count when published: a partition the topic lacks fails the event.
	ADD COLUMN target_partition integer,
	-- Set on CloudEvents only: the payload's content type (content-type header), and the ce_type
	-- and ce_source the event was given (NULL: the topic, outbox.cloudevents_source).
	ADD COLUMN ce_content_type text,
	ADD COLUMN ce_type text,
	ADD COLUMN ce_source text;

-- The one CHECK of the row rules (outbox.events_row_check above), in place of 0.1.0's three.
-- Validating it scans the table once: a row written by hand that breaks a rule makes the update
-- fail with the rule's name, and nothing changes (docs/upgrading.md).
ALTER TABLE outbox.events
	DROP CONSTRAINT IF EXISTS events_status_check,
	DROP CONSTRAINT IF EXISTS events_lane_check,
	DROP CONSTRAINT IF EXISTS events_published_check,
	ADD CONSTRAINT events_row_check
		CHECK (outbox.events_row_check(status, lane, key, event_id, topic, headers, payload IS NOT NULL, attempts,
		                               created_at, next_attempt_at, claimed_at, published_at, kafka_partition,
		                               kafka_offset, target_partition, ce_content_type, ce_type, ce_source));

-- enqueue gains optional arguments (named, defaults NULL, so every existing call works as it
-- did). A second function beside the old one would make every call that passes five arguments or
-- fewer ambiguous, so each is dropped and created anew, with the EXECUTE rights its old one had.
-- (Kept for the transaction in a setting of a prefix of its own: nothing is left behind.)
SELECT pg_catalog.set_config('outbox_upgrade.enqueue_acl', coalesce(pg_catalog.jsonb_agg(g)::text, '[]'), true)
FROM (SELECT p.proargtypes[2]::regtype::text AS payload_type,
             CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee,
             a.is_grantable
      FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
      WHERE p.pronamespace = 'outbox'::regnamespace AND p.proname = 'enqueue' AND p.pronargs = 5
        AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner) g;

DROP FUNCTION outbox.enqueue(text, text, jsonb, jsonb, uuid);
DROP FUNCTION outbox.enqueue(text, text, text, jsonb, uuid);
DROP FUNCTION outbox.enqueue(text, text, bytea, jsonb, uuid);

CREATE FUNCTION outbox.enqueue(topic text, key text, payload jsonb,
                               headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL,
                               partition integer DEFAULT NULL,
                               traceparent text DEFAULT NULL, tracestate text DEFAULT NULL,
                               cloudevents boolean DEFAULT NULL,
                               event_type text DEFAULT NULL, event_source text DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_enqueue_jsonb'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION outbox.enqueue(topic text, key text, payload text,
                               headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL,
                               partition integer DEFAULT NULL,
                               traceparent text DEFAULT NULL, tracestate text DEFAULT NULL,
                               cloudevents boolean DEFAULT NULL,
                               event_type text DEFAULT NULL, event_source text DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_enqueue_text'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION outbox.enqueue(topic text, key text, payload bytea,
                               headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL,
                               partition integer DEFAULT NULL,
                               traceparent text DEFAULT NULL, tracestate text DEFAULT NULL,
                               cloudevents boolean DEFAULT NULL,
                               event_type text DEFAULT NULL, event_source text DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_enqueue_bytea'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION outbox.enqueue(text, text, jsonb, jsonb, uuid, integer, text, text, boolean, text, text),
                       outbox.enqueue(text, text, text, jsonb, uuid, integer, text, text, boolean, text, text),
                       outbox.enqueue(text, text, bytea, jsonb, uuid, integer, text, text, boolean, text, text)
	FROM PUBLIC;

DO $$
DECLARE
	g record;
BEGIN
	FOR g IN SELECT * FROM pg_catalog.jsonb_to_recordset(current_setting('outbox_upgrade.enqueue_acl')::jsonb)
	                       AS x(payload_type text, grantee text, is_grantable boolean) LOOP
		EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, %s, jsonb, uuid, integer, text, text, '
		               'boolean, text, text) TO %s%s',
		               g.payload_type, g.grantee, CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
	END LOOP;
END
$$;


-- ---------------------------------------------------------------------------------------------
-- Metrics (docs/metrics.md): per-worker counters and histograms from shared memory and
-- per-topic backlog gauges, in the shape postgres_exporter reads (docs/metrics/queries.yaml).
-- Callable by pg_monitor (what monitoring roles are given), by nobody else unless granted.
-- ---------------------------------------------------------------------------------------------

-- One row per configured relay worker. Each histogram is NAME (upper bounds of the finite
-- buckets), NAME_bucket (cumulative counts), NAME_sum and NAME_count.
CREATE FUNCTION outbox.worker_metrics(
	OUT database text, OUT worker integer, OUT pid integer, OUT state text, OUT broker_state text,
	OUT broker_up integer, OUT backing_off integer, OUT backoff_remaining_seconds double precision,
	OUT started_at timestamptz,
	OUT events_published bigint, OUT events_failed bigint, OUT events_retried bigint,
	OUT events_requeued bigint, OUT backoffs bigint, OUT batches bigint,
	OUT batch_size double precision[], OUT batch_size_bucket bigint[],
	OUT batch_size_sum double precision, OUT batch_size_count bigint,
	OUT publish_seconds double precision[], OUT publish_seconds_bucket bigint[],
	OUT publish_seconds_sum double precision, OUT publish_seconds_count bigint,
	OUT claim_seconds double precision[], OUT claim_seconds_bucket bigint[],
	OUT claim_seconds_sum double precision, OUT claim_seconds_count bigint,
	OUT record_seconds double precision[], OUT record_seconds_bucket bigint[],
	OUT record_seconds_sum double precision, OUT record_seconds_count bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_worker_metrics'
LANGUAGE C VOLATILE STRICT;

CREATE VIEW outbox.worker_metrics AS SELECT * FROM outbox.worker_metrics();

COMMENT ON VIEW outbox.worker_metrics IS
	'Relay workers'' metrics since their start: events published, failed, retried, requeued; batch size and publish, claim and record time histograms; broker and backoff state';

-- Per topic with events waiting or failed: how many, and the age of the oldest one not yet
-- published. Reads only the pending, in-flight and failed rows (through their partial indexes),
-- never the retained published history, so its cost follows the backlog, not the table.
CREATE FUNCTION outbox.topic_metrics(
	OUT topic text, OUT pending bigint, OUT failed bigint, OUT oldest_pending_age_seconds double precision)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT t.topic, sum(t.pending)::bigint, sum(t.failed)::bigint,
	       coalesce(max(t.age), 0)::double precision
	FROM (SELECT e.topic, count(*) AS pending, 0 AS failed,
	             extract(epoch FROM now() - min(e.created_at)) AS age
	      FROM outbox.events e WHERE e.status = 'pending' GROUP BY e.topic
	      UNION ALL
	      -- A 0.1.0 relay's rows (status IN (...) would not match the partial indexes: a full scan).
	      SELECT e.topic, count(*), 0, extract(epoch FROM now() - min(e.created_at))
	      FROM outbox.events e WHERE e.status = 'in_flight' GROUP BY e.topic
	      UNION ALL
	      SELECT e.topic, 0, count(*), NULL
	      FROM outbox.events e WHERE e.status = 'failed' GROUP BY e.topic) t
	GROUP BY t.topic;
$$;

CREATE VIEW outbox.topic_metrics AS SELECT * FROM outbox.topic_metrics();

COMMENT ON VIEW outbox.topic_metrics IS
	'Per topic with events waiting or failed: pending, failed, age in seconds of the oldest event not yet published';

REVOKE ALL ON FUNCTION outbox.worker_metrics(), outbox.topic_metrics() FROM PUBLIC;
GRANT USAGE ON SCHEMA outbox TO pg_monitor;
GRANT EXECUTE ON FUNCTION outbox.worker_metrics(), outbox.topic_metrics() TO pg_monitor;
GRANT SELECT ON outbox.worker_metrics, outbox.topic_metrics TO pg_monitor;


-- ---------------------------------------------------------------------------------------------
-- One install, many databases: the launcher (docs/many-databases.md). outbox.workers shows
-- this database's workers (unchanged columns); outbox.launcher shows every database the
-- launcher serves, with the cluster's worker budget, so a database left without a worker slot
-- is visible from any of them.
CREATE FUNCTION outbox.launcher_status(
	OUT database text, OUT state text, OUT workers integer, OUT running integer,
	OUT last_error text, OUT last_error_at timestamptz, OUT max_workers integer)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_launcher_status'
LANGUAGE C VOLATILE STRICT;

CREATE VIEW outbox.launcher AS SELECT * FROM outbox.launcher_status();

COMMENT ON VIEW outbox.launcher IS
	'Databases the relay launcher serves: state, workers wanted (outbox.workers) and running, '
	'why a database has none (no worker slot), the cluster budget (outbox.max_workers)';

REVOKE ALL ON FUNCTION outbox.launcher_status() FROM PUBLIC;
REVOKE ALL ON TABLE outbox.launcher FROM PUBLIC;
