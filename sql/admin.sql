-- Retention (outbox.purge) and poison handling (outbox.retry, outbox.retry_failed).
-- No relay runs in these tests (outbox.workers = 0): rows are put into states by hand.
TRUNCATE outbox.events;
SELECT count(*) FROM (
	SELECT outbox.enqueue('billing.invoices', 'k' || (i % 3), jsonb_build_object('i', i), NULL,
	                      outbox.event_id('admin-test', i::text))
	FROM generate_series(1, 12) i) s;

-- 1-5: published long ago, 6-7: published just now, 8: pending, 9: in flight, 10-11: failed (t1, t2), 12: failed t3.
UPDATE outbox.events SET status = 'published', published_at = now() - interval '30 days' WHERE id IN (SELECT id FROM outbox.events ORDER BY id LIMIT 5);
UPDATE outbox.events SET status = 'published', published_at = now() WHERE id IN (SELECT id FROM outbox.events ORDER BY id OFFSET 5 LIMIT 2);
UPDATE outbox.events SET status = 'in_flight' WHERE id = (SELECT id FROM outbox.events ORDER BY id OFFSET 8 LIMIT 1);
UPDATE outbox.events SET status = 'failed', attempts = 10, last_error = 'MSG_SIZE_TOO_LARGE: Broker: Message size too large'
WHERE id IN (SELECT id FROM outbox.events ORDER BY id OFFSET 9);
UPDATE outbox.events SET topic = 'billing.payments' WHERE id = (SELECT max(id) FROM outbox.events);
SELECT status, count(*) FROM outbox.events GROUP BY status ORDER BY status;

-- Purge deletes old published rows in bounded batches and returns how many; it never touches
-- pending, in-flight or failed rows, nor recent published ones.
SELECT outbox.purge(interval '7 days', 2) AS first_batch;
SELECT outbox.purge(interval '7 days', 2) AS second_batch;
SELECT outbox.purge(interval '7 days', 2) AS last_batch;
SELECT outbox.purge(interval '7 days', 2) AS nothing_left;
SELECT status, count(*) FROM outbox.events GROUP BY status ORDER BY status;
-- The default window is outbox.retention (7 days by default).
SELECT outbox.purge() AS default_window;
-- Zero keeps nothing that is published.
SELECT outbox.purge(interval '0') AS everything_published;
SELECT status, count(*) FROM outbox.events GROUP BY status ORDER BY status;
-- purge_all commits between batches.
UPDATE outbox.events SET status = 'published', published_at = now() - interval '30 days' WHERE status = 'pending';
CALL outbox.purge_all(interval '1 day', 1);
SELECT status, count(*) FROM outbox.events GROUP BY status ORDER BY status;

-- Bad input to purge: an error, and nothing deleted.
UPDATE outbox.events SET status = 'published', published_at = now() - interval '30 days' WHERE status = 'in_flight';
SELECT * FROM expect_error($$SELECT outbox.purge(interval '-1 day')$$);
SELECT * FROM expect_error($$SELECT outbox.purge(interval '1 day', 0)$$);
SELECT * FROM expect_error($$SELECT outbox.purge(interval '1 day', -5)$$);
SELECT * FROM expect_error($$SELECT outbox.purge(interval '1 day', NULL)$$);
SELECT status, count(*) FROM outbox.events GROUP BY status ORDER BY status;
-- NULL means "the retention setting".
SELECT outbox.purge(NULL) AS null_is_default;

-- Retry one failed event: back to pending with attempts reset.
SELECT event_id AS failed_id FROM outbox.events WHERE status = 'failed' AND topic = 'billing.invoices' ORDER BY id LIMIT 1 \gset
SELECT outbox.retry(:'failed_id');
SELECT status, attempts, coalesce(next_attempt_at <= now(), true) AS due, last_error IS NOT NULL AS error_kept
FROM outbox.events WHERE event_id = :'failed_id';

-- Bad input to retry.
SELECT * FROM expect_error(format('SELECT outbox.retry(%L)', :'failed_id'));
SELECT * FROM expect_error($$SELECT outbox.retry('00000000-0000-4000-8000-000000000000')$$);
SELECT * FROM expect_error($$SELECT outbox.retry(NULL)$$);

-- retry_failed by topic, then all.
SELECT outbox.retry_failed('no.such.topic') AS none;
SELECT outbox.retry_failed('billing.payments') AS payments;
SELECT outbox.retry_failed() AS rest;
SELECT outbox.retry_failed() AS nothing_left;
SELECT status, count(*) FROM outbox.events GROUP BY status ORDER BY status;
