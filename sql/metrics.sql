-- Metrics: outbox.topic_metrics (per-topic backlog gauges) and outbox.worker_metrics (shared
-- memory; empty here: outbox.workers = 0), readable by pg_monitor members, nobody else.
TRUNCATE outbox.events;
SELECT count(*) FROM (
	SELECT outbox.enqueue(CASE WHEN i <= 6 THEN 'billing.invoices' ELSE 'billing.payments' END,
	                      'k' || i, '{}'::jsonb)
	FROM generate_series(1, 10) i) s;
UPDATE outbox.events SET created_at = now() - interval '2 hours' WHERE key = 'k1';
UPDATE outbox.events SET created_at = now() - interval '1 hour' WHERE key = 'k3';
UPDATE outbox.events SET status = 'published', published_at = now() WHERE key = 'k3';
UPDATE outbox.events SET status = 'failed', attempts = 10, last_error = 'e' WHERE key IN ('k4', 'k7', 'k8', 'k9', 'k10');
-- Published rows neither count nor age a topic; a topic with only failed rows has age 0.
SELECT topic, pending, failed,
       oldest_pending_age_seconds BETWEEN 7200 AND 7200 + 600 AS two_hours
FROM outbox.topic_metrics ORDER BY topic;
UPDATE outbox.events SET status = 'published', published_at = now() WHERE status <> 'published';
SELECT count(*) AS topics_with_nothing_waiting FROM outbox.topic_metrics;

SELECT * FROM outbox.worker_metrics;
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'outbox.worker_metrics'::regclass AND attnum > 0 ORDER BY attnum;

-- A monitoring login in pg_monitor, no superuser, reads both; it reads no payloads. A role
-- outside pg_monitor reads neither.
CREATE ROLE outbox_test_scraper IN ROLE pg_monitor;
CREATE ROLE outbox_test_other;
GRANT USAGE ON SCHEMA outbox TO outbox_test_other; -- to see the functions' own refusal
SELECT outbox.enqueue('billing.invoices', 'k', '{"secret": 1}'::jsonb) IS NOT NULL AS enqueued;
SET ROLE outbox_test_scraper;
SELECT topic, pending, failed FROM outbox.topic_metrics;
SELECT count(*) FROM outbox.worker_metrics;
SELECT count(*) FROM outbox.worker_metrics();
SELECT payload FROM outbox.events;
SELECT count(*) FROM outbox.workers;
RESET ROLE;
SET ROLE outbox_test_other;
SELECT * FROM outbox.topic_metrics;
SELECT * FROM outbox.topic_metrics();
SELECT * FROM outbox.worker_metrics();
RESET ROLE;
-- docs/privileges.md's grants for a role outside pg_monitor.
GRANT SELECT ON outbox.worker_metrics, outbox.topic_metrics TO outbox_test_other;
GRANT EXECUTE ON FUNCTION outbox.worker_metrics(), outbox.topic_metrics() TO outbox_test_other;
SET ROLE outbox_test_other;
SELECT topic, pending FROM outbox.topic_metrics;
SELECT count(*) FROM outbox.worker_metrics;
RESET ROLE;
REVOKE ALL ON outbox.worker_metrics, outbox.topic_metrics FROM outbox_test_other;
REVOKE ALL ON FUNCTION outbox.worker_metrics(), outbox.topic_metrics() FROM outbox_test_other;
REVOKE USAGE ON SCHEMA outbox FROM outbox_test_other;
DROP ROLE outbox_test_scraper, outbox_test_other;
TRUNCATE outbox.events;
