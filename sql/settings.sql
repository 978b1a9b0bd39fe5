-- The outbox.* settings, their defaults, contexts and bounds.
SELECT name, setting, unit, context, vartype, min_val, max_val, enumvals
FROM pg_settings WHERE name LIKE 'outbox.%' ORDER BY name;

-- Bad values are refused, and nothing is written. (The bounds are in the listing above; the
-- messages of settings with units spell the bounds differently from PostgreSQL 17 on, so those
-- two show only their SQLSTATE.) The reserved prefix is tested in reserved_prefix.
\set VERBOSITY sqlstate
SET outbox.max_payload_bytes = -1;
ALTER SYSTEM SET outbox.publish_timeout = '10ms';
\set VERBOSITY default
ALTER SYSTEM SET outbox.on_failed_event = 'drop';
ALTER SYSTEM SET outbox.workers = 33;
ALTER SYSTEM SET outbox.batch_size = 0;
ALTER SYSTEM SET outbox.message_timestamp = 'create';
ALTER SYSTEM SET outbox.traceparent = '00-00000000000000000000000000000000-b7ad6b7169203331-01';
ALTER SYSTEM SET outbox.failover_standbys = 'ANY 3 (a, b)';
ALTER SYSTEM SET outbox.failover_standby_lsn = 'write';
SELECT count(*) AS nothing_written FROM pg_file_settings WHERE name LIKE 'outbox.%' AND sourcefile LIKE '%auto.conf';
-- Superusers can read the secret-holding setting (roles without privileges cannot, see privileges).
SHOW outbox.kafka_properties;
-- Relay settings are not per session.
SET outbox.batch_size = 10;
SET outbox.workers = 2;
SET outbox.cloudevents_topics = 'billing.*';
SET outbox.message_timestamp = 'publish';
-- Per database instead: ALTER DATABASE ... SET outbox.workers (the launcher restarts that
-- database's workers with it); its bounds apply there too.
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET outbox.workers = 33', current_database()); END $$;
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET outbox.workers = 2', current_database()); END $$;
SELECT item FROM pg_db_role_setting, unnest(setconfig) AS item
WHERE setrole = 0 AND setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND item LIKE 'outbox.%';
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET outbox.workers', current_database()); END $$;

-- The defaults agree with PostgreSQL's: the launcher and outbox.max_workers fit in the built-in
-- max_worker_processes with room left for parallel query and other background workers.
SELECT b.boot_val::int AS default_max_workers, p.boot_val::int AS default_max_worker_processes,
       b.boot_val::int + 1 < p.boot_val::int AS default_budget_fits_with_room
FROM pg_settings b, pg_settings p
WHERE b.name = 'outbox.max_workers' AND p.name = 'max_worker_processes';
