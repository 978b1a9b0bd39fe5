-- The upgrade path exists: at 0.1.0 an update is a no-op; DROP EXTENSION cleans up.
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
ALTER EXTENSION outbox UPDATE;
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
-- The extension is not relocatable.
ALTER EXTENSION outbox SET SCHEMA public;
