-- Monitoring views: outbox.backlog, outbox.failed, outbox.workers.
TRUNCATE outbox.events;
SELECT count(*) FROM (
	SELECT outbox.enqueue(CASE WHEN i <= 6 THEN 'billing.invoices' ELSE 'billing.payments' END,
	                      'k' || i, '{}'::jsonb)
	FROM generate_series(1, 10) i) s;
UPDATE outbox.events SET created_at = now() - interval '2 hours' WHERE key = 'k1';
UPDATE outbox.events SET status = 'in_flight' WHERE key = 'k2';
UPDATE outbox.events SET status = 'published', published_at = now() WHERE key IN ('k3', 'k7');
UPDATE outbox.events SET status = 'failed', attempts = 10, last_error = 'TOPIC_AUTHORIZATION_FAILED: Broker: Topic authorization failed'
WHERE key IN ('k4', 'k8');

SELECT topic, pending, in_flight, failed, published,
       oldest_pending_age >= interval '2 hours' AS old_one_counts,
       oldest_pending_age < interval '1 minute' AS all_recent
FROM outbox.backlog ORDER BY topic;

-- Nothing pending: no age.
UPDATE outbox.events SET status = 'published', published_at = now() WHERE topic = 'billing.payments' AND status = 'pending';
SELECT topic, pending, oldest_pending_age FROM outbox.backlog WHERE topic = 'billing.payments';

SELECT topic, key, attempts, last_error, created_at <= now() AS has_created_at, event_id IS NOT NULL AS has_id
FROM outbox.failed ORDER BY key;

-- outbox.workers reads shared memory; with outbox.workers = 0 (this test cluster) it is empty,
-- and its columns are these.
SELECT * FROM outbox.workers;
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'outbox.workers'::regclass AND attnum > 0 ORDER BY attnum;

-- outbox.launcher: the launcher's databases (none here: outbox.max_workers = 0, no launcher).
SELECT * FROM outbox.launcher;
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'outbox.launcher'::regclass AND attnum > 0 ORDER BY attnum;
