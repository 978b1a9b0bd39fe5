-- outbox 0.1.0 -> 0.2.0: the table refuses rows the relay could not publish, the queue survives
-- pg_dump, the relay runs as a role of its own, publishes a (topic, key) in commit order and
-- writes each event once. (A new install runs 0.1.0, then this.)

\echo Use "ALTER EXTENSION outbox UPDATE" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- Row shapes. enqueue() only ever writes rows that pass these; the checks stop rows written by
-- hand (README "The table") that would otherwise make the relay loop on an error or misorder a
-- key. Validating them scans the table once; a row written by hand that breaks one makes the
-- update fail with the constraint's name, and nothing changes (README "Upgrading").
-- ---------------------------------------------------------------------------------------------

-- The lane a key (or, unkeyed, an event id) belongs to: the same 32-bit FNV-1a that enqueue
-- computes in C, so the check below and the relay agree on which worker owns a row.
CREATE FUNCTION outbox.lane_of(key text, event_id uuid)
RETURNS smallint
AS 'MODULE_PATHNAME', 'outbox_lane_of'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
-- Not for PUBLIC, like everything in the schema; a role writing rows by hand needs EXECUTE on it.
REVOKE ALL ON FUNCTION outbox.lane_of(text, uuid) FROM PUBLIC;

-- A CHECK rather than a generated column: enqueue passes the lane with every insert, so a
-- library and a schema of different versions keep working together while an upgrade is under
-- way, and the update rewrites no table.
ALTER TABLE outbox.events
	ADD CONSTRAINT events_lane_of_key_check CHECK (lane = outbox.lane_of(key, event_id)),
	-- Kafka's legal topic names. (ltrim with the legal characters leaves nothing of a legal name:
	-- a tenth of the cost of the equivalent regular expression, which every UPDATE of a row, the
	-- relay's record included, would evaluate.)
	ADD CONSTRAINT events_topic_check
		CHECK (octet_length(topic) BETWEEN 1 AND 249 AND topic NOT IN ('.', '..')
		       AND ltrim(topic, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-') = ''),
	ADD CONSTRAINT events_headers_check
		CHECK (headers IS NULL
		       OR (jsonb_typeof(headers) = 'object'
		           AND NOT headers ? 'event_id'
		           AND NOT jsonb_path_exists(headers, '$.* ? (@.type() != "string")'))),
	ADD CONSTRAINT events_times_check
		CHECK (isfinite(created_at) AND (next_attempt_at IS NULL OR isfinite(next_attempt_at))
		       AND (claimed_at IS NULL OR isfinite(claimed_at))
		       AND (published_at IS NULL OR isfinite(published_at))),
	ADD CONSTRAINT events_attempts_check CHECK (attempts >= 0 AND attempts <= 1000000),
	ADD CONSTRAINT events_kafka_position_check
		CHECK ((kafka_partition IS NULL OR kafka_partition >= 0) AND (kafka_offset IS NULL OR kafka_offset >= 0)),
	ADD CONSTRAINT events_tombstone_check CHECK (payload IS NOT NULL OR key IS NOT NULL),
	-- Keys are in the per-key indexes, whose entries have a size limit (enqueue: kMaxKeyBytes).
	ADD CONSTRAINT events_key_length_check CHECK (octet_length(key) <= 2048);

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
-- own session (README "Privileges"). A role that already exists is used as it is, unless it has
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
	-- The lane check runs on every update of a row, with the updating role's rights.
	EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.lane_of(text, uuid) TO %I', relay_role);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Consumer-side dedup (README "Consumers: exactly-once effects"). Delivery is at least once; a
-- consumer that writes to Postgres gets each effect once by marking the event in the same
-- transaction as the effect: outbox.consume_once(consumer, event_id) is true the first time and
-- false for a duplicate. The marks are the dedup ledger: kept for outbox.consumed_retention,
-- then purged (a duplicate arriving later is applied again: the documented trade-off). The
-- consumer's database may be any database with the extension, without a relay.
-- ---------------------------------------------------------------------------------------------
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
	retention interval := current_setting('outbox.consumed_retention')::interval;
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
	retention interval := current_setting('outbox.consumed_retention')::interval;
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
-- consume_once to each consumer role (README "Privileges"); purge_consumed stays with superusers.
REVOKE ALL ON TABLE outbox.consumed FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.consume_once(text, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.purge_consumed(interval, integer) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- One install, many databases: the launcher (README "Many databases"). outbox.workers shows
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
