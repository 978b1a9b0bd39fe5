-- The upgrade path exists: an update to the installed version is a no-op, every version is
-- available; DROP EXTENSION cleans up.
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
ALTER EXTENSION outbox UPDATE TO '0.3.0';
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT version, installed FROM pg_available_extension_versions WHERE name = 'outbox' ORDER BY version;

DROP EXTENSION outbox;
SELECT count(*) AS objects_left FROM pg_namespace WHERE nspname = 'outbox';
SELECT count(*) AS functions_left FROM pg_proc WHERE proname IN ('enqueue', 'event_id', 'purge', 'retry', 'retry_failed', 'worker_status');

-- 0.1.0 -> 0.2.0 with events in the table: pending and failed rows survive, and a row written by
-- hand that 0.2.0's checks refuse stops the update with the constraint's name, changing nothing.
CREATE EXTENSION outbox VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT outbox.enqueue('t', 'k', '{"n": 1}'::jsonb) IS NOT NULL AS works_again;
SELECT outbox.enqueue('t', NULL, 'unkeyed'::text) IS NOT NULL AS unkeyed;
UPDATE outbox.events SET status = 'failed', attempts = 10, last_error = 'e' WHERE key IS NULL;
-- EXECUTE on 0.1.0's enqueue carries over to 0.2.0's (which has more, optional, arguments).
CREATE ROLE outbox_test_upgrade_app;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, jsonb, uuid) TO outbox_test_upgrade_app WITH GRANT OPTION;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, bytea, jsonb, uuid) TO outbox_test_upgrade_app;
INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers)
VALUES (gen_random_uuid(), 't', 'k', 0, '\x00', '{"trace": null}');
\set VERBOSITY terse
ALTER EXTENSION outbox UPDATE TO '0.2.0';
\set VERBOSITY default
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
DELETE FROM outbox.events WHERE headers IS NOT NULL;
ALTER EXTENSION outbox UPDATE TO '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT topic, key, status, attempts, lane = outbox.lane_of(key, event_id) AS lane_ok FROM outbox.events ORDER BY id;
SELECT count(*) AS config_tables FROM pg_extension x, unnest(x.extconfig) WHERE x.extname = 'outbox';
SELECT outbox.enqueue('t', 'k', '{"n": 2}'::jsonb) IS NOT NULL AS enqueues_after_update;
SELECT p.oid::regprocedure AS function, p.prosecdef AS security_definer, p.proconfig,
       has_function_privilege('outbox_test_upgrade_app', p.oid, 'EXECUTE') AS app,
       has_function_privilege('outbox_test_upgrade_app', p.oid, 'EXECUTE WITH GRANT OPTION') AS app_grants,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public
FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace AND p.proname = 'enqueue'
ORDER BY p.oid::regprocedure::text;
SELECT current_setting('outbox_upgrade.enqueue_acl', true) AS left_behind;
REVOKE ALL ON FUNCTION outbox.enqueue(text, text, jsonb, jsonb, uuid, integer, text, text, boolean, text, text),
                       outbox.enqueue(text, text, bytea, jsonb, uuid, integer, text, text, boolean, text, text)
	FROM outbox_test_upgrade_app CASCADE;
-- The grants the update carried over are the extension's initial privileges (pg_init_privs):
-- from PostgreSQL 17 on, only DROP OWNED BY lets the role go (docs/upgrading.md).
DROP OWNED BY outbox_test_upgrade_app;
DROP ROLE outbox_test_upgrade_app;

-- 0.2.0 -> 0.3.0: outbox.workers gains recovered_at after its columns (unchanged); the rights on
-- the view and on worker_status(), which are created anew, carry over; the retry functions wake
-- the relay through a function nobody may call directly.
CREATE ROLE outbox_test_upgrade_monitor;
GRANT USAGE ON SCHEMA outbox TO outbox_test_upgrade_monitor;
GRANT SELECT ON outbox.workers TO outbox_test_upgrade_monitor;
GRANT EXECUTE ON FUNCTION outbox.worker_status() TO outbox_test_upgrade_monitor WITH GRANT OPTION;
ALTER EXTENSION outbox UPDATE TO '0.3.0';
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'outbox.workers'::regclass AND attnum > 0 ORDER BY attnum;
SELECT has_table_privilege('outbox_test_upgrade_monitor', 'outbox.workers', 'SELECT') AS monitor_view,
       has_function_privilege('outbox_test_upgrade_monitor', 'outbox.worker_status()', 'EXECUTE WITH GRANT OPTION') AS monitor_function,
       has_table_privilege('public', 'outbox.workers', 'SELECT') AS public_view,
       has_function_privilege('public', 'outbox.worker_status()', 'EXECUTE') AS public_function;
SELECT p.oid::regprocedure AS function, p.prosecdef AS security_definer, p.proconfig,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public,
       has_function_privilege('outbox_test_upgrade_monitor', p.oid, 'EXECUTE') AS monitor
FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace AND p.proname IN ('retry', 'retry_failed', 'wake_relay_at_commit')
ORDER BY p.oid::regprocedure::text;
SET ROLE outbox_test_upgrade_monitor;
SELECT count(*) AS workers FROM outbox.workers;
RESET ROLE;
SELECT current_setting('outbox_upgrade.workers_acl', true) AS left_behind;
-- The failed row of 0.1.0 is retried by 0.3.0's function.
SELECT outbox.retry_failed() AS retried;
SELECT status, attempts FROM outbox.events WHERE key IS NULL;
DROP OWNED BY outbox_test_upgrade_monitor;
DROP ROLE outbox_test_upgrade_monitor;
-- The extension is not relocatable.
ALTER EXTENSION outbox SET SCHEMA public;
