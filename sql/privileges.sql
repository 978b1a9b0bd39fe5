-- Nothing is granted to PUBLIC; docs/privileges.md's grants give an application role enqueue only and a
-- monitoring role the views only.
SELECT has_schema_privilege('public', 'outbox', 'USAGE') AS public_usage;
SELECT p.oid::regprocedure, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace ORDER BY p.oid::regprocedure::text;
SELECT c.relname, has_table_privilege('public', c.oid, 'SELECT') AS public_select
FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'v') ORDER BY 1;

CREATE ROLE outbox_test_nobody;
CREATE ROLE outbox_test_app;
CREATE ROLE outbox_test_monitor;

-- docs/privileges.md's grants, verbatim.
GRANT USAGE ON SCHEMA outbox TO outbox_test_app;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, jsonb, uuid, integer, text, text, boolean, text, text),
                          outbox.enqueue(text, text, text, jsonb, uuid, integer, text, text, boolean, text, text),
                          outbox.enqueue(text, text, bytea, jsonb, uuid, integer, text, text, boolean, text, text),
                          outbox.event_id(text, text),
                          outbox.event_id(uuid, text)
      TO outbox_test_app;
GRANT USAGE ON SCHEMA outbox TO outbox_test_monitor;
GRANT SELECT ON outbox.backlog, outbox.failed, outbox.workers TO outbox_test_monitor;
GRANT EXECUTE ON FUNCTION outbox.worker_status() TO outbox_test_monitor;

TRUNCATE outbox.events;

-- A role with no grants can do nothing.
SET ROLE outbox_test_nobody;
SELECT outbox.enqueue('t', 'k', '{}'::jsonb);
SELECT count(*) FROM outbox.events;
SELECT * FROM outbox.backlog;
RESET ROLE;

-- The application role enqueues (through SECURITY DEFINER) but reads no payloads and cannot
-- purge or retry.
SET ROLE outbox_test_app;
SELECT outbox.enqueue('t', 'k', '{"secret": 1}'::jsonb) IS NOT NULL AS enqueued;
SELECT outbox.enqueue('t', 'k', '{}'::jsonb, NULL, outbox.event_id('k', 'x')) IS NOT NULL AS with_derived_id;
SELECT payload FROM outbox.events;
SELECT * FROM outbox.backlog;
SELECT outbox.purge(interval '0');
SELECT outbox.retry_failed();
UPDATE outbox.events SET status = 'published';
-- Nor call the function the retry functions wake the relay with (to wake it in a loop).
SELECT outbox.wake_relay_at_commit();
RESET ROLE;
SET ROLE outbox_test_nobody;
SELECT outbox.wake_relay_at_commit();
RESET ROLE;

-- The monitoring role reads the views, not the table, and cannot enqueue.
SET ROLE outbox_test_monitor;
SELECT topic, pending FROM outbox.backlog;
SELECT count(*) FROM outbox.failed;
SELECT count(*) FROM outbox.workers;
SELECT payload FROM outbox.events;
SELECT outbox.enqueue('t', 'k', '{}'::jsonb);
RESET ROLE;

-- A hostile search_path does not reach into the SECURITY DEFINER functions.
CREATE SCHEMA outbox_test_evil;
CREATE FUNCTION outbox_test_evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$;
GRANT USAGE ON SCHEMA outbox_test_evil TO outbox_test_app;
GRANT EXECUTE ON FUNCTION outbox_test_evil.now() TO outbox_test_app;
SET ROLE outbox_test_app;
SET search_path = outbox_test_evil, public;
SELECT outbox.enqueue('t', 'evil', '{}'::jsonb) IS NOT NULL;
RESET search_path;
RESET ROLE;
SELECT created_at > '2001-01-01' AS real_now FROM outbox.events WHERE key = 'evil';

-- The secret-holding setting is superuser-only and hidden.
SELECT name FROM pg_settings WHERE name = 'outbox.kafka_properties';
SET ROLE outbox_test_app;
-- 42501 (insufficient privilege); the message's wording changed in PostgreSQL 15 and 16.
\set VERBOSITY sqlstate
SHOW outbox.kafka_properties;
\set VERBOSITY default
SELECT count(*) FROM pg_settings WHERE name = 'outbox.kafka_properties';
SET outbox.max_payload_bytes = '10MB';
RESET ROLE;

DROP SCHEMA outbox_test_evil CASCADE;
REVOKE ALL ON SCHEMA outbox FROM outbox_test_app, outbox_test_monitor;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM outbox_test_app, outbox_test_monitor;
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM outbox_test_app, outbox_test_monitor;
DROP ROLE outbox_test_nobody, outbox_test_app, outbox_test_monitor;
