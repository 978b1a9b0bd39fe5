-- The upgrade path exists: at 0.1.0 an update is a no-op; DROP EXTENSION cleans up.
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT version, installed FROM pg_available_extension_versions WHERE name = 'outbox' ORDER BY version;

DROP EXTENSION outbox;
SELECT count(*) AS objects_left FROM pg_namespace WHERE nspname = 'outbox';
SELECT count(*) AS functions_left FROM pg_proc WHERE proname IN ('enqueue', 'event_id', 'purge', 'retry', 'retry_failed', 'worker_status');

CREATE EXTENSION outbox VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT outbox.enqueue('t', 'k', '{}'::jsonb) IS NOT NULL AS works_again;
-- The extension is not relocatable.
ALTER EXTENSION outbox SET SCHEMA public;
