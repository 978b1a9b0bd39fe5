-- outbox 0.2.0 -> 0.3.0: outbox.retry() and retry_failed() wake the relay when their transaction
-- commits (it waited up to outbox.poll_interval), and outbox.workers says whether last_error is
-- still current (recovered_at). (A new install runs 0.1.0, 0.1.0 -> 0.2.0, then this.)

\echo Use "ALTER EXTENSION outbox UPDATE" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- Retries wake the relay at commit
-- ---------------------------------------------------------------------------------------------

-- Every relay worker of this database is woken when the calling transaction commits (nothing at
-- rollback), as a committed enqueue wakes its lane's worker. Internal: only the retry functions
-- (SECURITY DEFINER) call it; granted to nobody.
CREATE FUNCTION outbox.wake_relay_at_commit()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_wake_relay_at_commit'
LANGUAGE C VOLATILE STRICT
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION outbox.wake_relay_at_commit() FROM PUBLIC;

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
	PERFORM outbox.wake_relay_at_commit();
	RETURN 1;
END
$$;

CREATE OR REPLACE FUNCTION outbox.retry_failed(topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	retried bigint;
BEGIN
	UPDATE outbox.events e
	SET status = 'pending', attempts = 0, next_attempt_at = NULL
	WHERE e.status = 'failed' AND (retry_failed.topic IS NULL OR e.topic = retry_failed.topic);
	GET DIAGNOSTICS retried = ROW_COUNT;
	IF retried > 0 THEN
		PERFORM outbox.wake_relay_at_commit();
	END IF;
	RETURN retried;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- New columns after the existing ones (unchanged): outbox.workers.recovered_at, and
-- outbox.worker_metrics.events_resent. A function's result columns cannot be changed in place,
-- so both functions and their views are created anew, with the rights they had (pg_monitor's
-- and any an operator added; docs/upgrading.md). (Kept for the transaction in a setting of a
-- prefix of its own: nothing is left behind.)
-- ---------------------------------------------------------------------------------------------
SELECT pg_catalog.set_config('outbox_upgrade.status_acl', coalesce(pg_catalog.jsonb_agg(g)::text, '[]'), true)
FROM (SELECT 'FUNCTION ' || p.oid::pg_catalog.regprocedure::text AS object, a.privilege_type AS privilege,
             CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee, a.is_grantable
      FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
      WHERE p.oid IN ('outbox.worker_status()'::pg_catalog.regprocedure, 'outbox.worker_metrics()'::pg_catalog.regprocedure)
        AND a.grantee <> p.proowner
      UNION ALL
      SELECT 'TABLE ' || c.oid::pg_catalog.regclass::text, a.privilege_type,
             CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END, a.is_grantable
      FROM pg_catalog.pg_class c, LATERAL pg_catalog.aclexplode(c.relacl) a
      WHERE c.oid IN ('outbox.workers'::pg_catalog.regclass, 'outbox.worker_metrics'::pg_catalog.regclass)
        AND a.grantee <> c.relowner) g;

DROP VIEW outbox.workers;
DROP FUNCTION outbox.worker_status();
DROP VIEW outbox.worker_metrics;
DROP FUNCTION outbox.worker_metrics();

-- Relay workers, from shared memory (one row per configured worker). recovered_at: when the
-- worker first completed a cycle without an error after last_error (the error is stale); NULL
-- while last_error is current.
CREATE FUNCTION outbox.worker_status(
	OUT worker integer, OUT pid integer, OUT state text, OUT published bigint, OUT failed bigint,
	OUT last_error text, OUT last_error_at timestamptz, OUT last_publish_at timestamptz,
	OUT broker_state text, OUT started_at timestamptz, OUT recovered_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_worker_status'
LANGUAGE C VOLATILE STRICT;

CREATE VIEW outbox.workers AS SELECT * FROM outbox.worker_status();

COMMENT ON VIEW outbox.workers IS
	'Relay workers: state, counters since start, last error and whether it is current (recovered_at), broker connection state';

-- events_resent: events Kafka acknowledged whose record was rolled back (they go to Kafka again).
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
	OUT record_seconds_sum double precision, OUT record_seconds_count bigint,
	OUT events_resent bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_worker_metrics'
LANGUAGE C VOLATILE STRICT;

CREATE VIEW outbox.worker_metrics AS SELECT * FROM outbox.worker_metrics();

COMMENT ON VIEW outbox.worker_metrics IS
	'Relay workers'' metrics since their start: events published, failed, retried, requeued, resent; batch size and publish, claim and record time histograms; broker and backoff state';

REVOKE ALL ON FUNCTION outbox.worker_status(), outbox.worker_metrics() FROM PUBLIC;
REVOKE ALL ON TABLE outbox.workers, outbox.worker_metrics FROM PUBLIC;

DO $$
DECLARE
	g record;
BEGIN
	FOR g IN SELECT * FROM pg_catalog.jsonb_to_recordset(current_setting('outbox_upgrade.status_acl')::jsonb)
	                       AS x(object text, privilege text, grantee text, is_grantable boolean) LOOP
		EXECUTE format('GRANT %s ON %s TO %s%s', g.privilege, g.object, g.grantee,
		               CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
	END LOOP;
END
$$;
