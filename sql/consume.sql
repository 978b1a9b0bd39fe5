-- Consumer-side dedup: outbox.consume_once(consumer, event_id) in the caller's transaction,
-- its bad inputs, its retention (outbox.consumed_retention, outbox.purge_consumed) and who may
-- call it. (Concurrent calls: test/specs/consume_once_concurrent.spec.)
TRUNCATE outbox.consumed;
SHOW outbox.consumed_retention;

-- True the first time, false for a duplicate, per consumer.
SELECT outbox.consume_once('invoice-projector', '5f5149c4-5d91-5747-b479-d84c355ce43d') AS first;
SELECT outbox.consume_once('invoice-projector', '5f5149c4-5d91-5747-b479-d84c355ce43d') AS duplicate;
SELECT outbox.consume_once('dunning', '5f5149c4-5d91-5747-b479-d84c355ce43d') AS other_consumer;
SELECT consumer, event_id FROM outbox.consumed ORDER BY consumer;

-- The mark is part of the caller's transaction: a rollback forgets it, so a redelivery is
-- applied then; within one transaction the second call is already a duplicate.
BEGIN;
SELECT outbox.consume_once('invoice-projector', '14d043ee-2cd9-55e7-afae-539472ceac2b') AS in_txn;
SELECT outbox.consume_once('invoice-projector', '14d043ee-2cd9-55e7-afae-539472ceac2b') AS again_in_txn;
ROLLBACK;
SELECT count(*) AS after_rollback FROM outbox.consumed WHERE event_id = '14d043ee-2cd9-55e7-afae-539472ceac2b';
SELECT outbox.consume_once('invoice-projector', '14d043ee-2cd9-55e7-afae-539472ceac2b') AS redelivered;

-- Bad input: a clear error, nothing marked.
SELECT * FROM expect_error($$SELECT outbox.consume_once(NULL, '67d87e41-9041-5334-8bf6-6e21d72d319a')$$);
SELECT * FROM expect_error($$SELECT outbox.consume_once('invoice-projector', NULL)$$);
SELECT * FROM expect_error($$SELECT outbox.consume_once(NULL, NULL)$$);
SELECT * FROM expect_error($$SELECT outbox.consume_once('', '67d87e41-9041-5334-8bf6-6e21d72d319a')$$);
SELECT * FROM expect_error($$SELECT outbox.consume_once(repeat('x', 256), '67d87e41-9041-5334-8bf6-6e21d72d319a')$$);
-- The limit is in bytes (128 two-byte characters are 256 bytes); 255 bytes are fine.
SELECT * FROM expect_error($$SELECT outbox.consume_once(repeat('é', 128), '67d87e41-9041-5334-8bf6-6e21d72d319a')$$);
SELECT outbox.consume_once(repeat('x', 255), '67d87e41-9041-5334-8bf6-6e21d72d319a') AS longest_name;
SELECT count(*) AS marks FROM outbox.consumed;
-- The table refuses such names written by hand too.
\set VERBOSITY terse
INSERT INTO outbox.consumed (consumer, event_id) VALUES ('', gen_random_uuid());
\set VERBOSITY default

-- Retention. Marks older than outbox.consumed_retention (30 days by default) are removed: at
-- READ COMMITTED each consume_once call removes up to two of them (the oldest first), and
-- outbox.purge_consumed() removes them in bounded batches.
TRUNCATE outbox.consumed;
INSERT INTO outbox.consumed (consumer, event_id, consumed_at)
SELECT 'invoice-projector', outbox.event_id('retention-test', i::text), now() - (i * 10 - 5) * interval '1 day'
FROM generate_series(1, 7) i;   -- 5 .. 65 days old: 4 to 7 (35 .. 65 days) are past 30 days
SELECT outbox.consume_once('dunning', outbox.event_id('retention-test', 'new')) AS new_mark;
SELECT round(extract(epoch FROM now() - consumed_at) / 86400) AS days_old FROM outbox.consumed ORDER BY consumed_at;
-- Above READ COMMITTED consume_once leaves expired marks to purge_consumed (a mark another
-- session purged meanwhile would be a serialization failure there).
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT outbox.consume_once('dunning', outbox.event_id('retention-test', 'rr')) AS repeatable_read;
COMMIT;
SELECT count(*) AS marks_after_repeatable_read FROM outbox.consumed;
-- purge_consumed: bounded batches, the default window is the setting.
SELECT outbox.purge_consumed(interval '30 days', 1) AS first_batch;
SELECT outbox.purge_consumed(interval '30 days', 1) AS second_batch;
SELECT outbox.purge_consumed(interval '30 days', 1) AS nothing_left;
SELECT outbox.purge_consumed(interval '20 days') AS older_than_20_days;
SELECT outbox.purge_consumed() AS default_window;
SELECT round(extract(epoch FROM now() - consumed_at) / 86400) AS days_old FROM outbox.consumed ORDER BY consumed_at;
-- The documented trade-off: a duplicate delivered after its mark was purged is applied again.
SELECT outbox.consume_once('invoice-projector', outbox.event_id('retention-test', '7')) AS late_duplicate;
-- Until then it is a duplicate, however old its mark.
INSERT INTO outbox.consumed (consumer, event_id, consumed_at)
VALUES ('invoice-projector', outbox.event_id('retention-test', 'old'), now() - interval '1 year');
SELECT outbox.consume_once('invoice-projector', outbox.event_id('retention-test', 'old')) AS expired_but_not_purged;

-- purge_consumed's bad input changes nothing.
SELECT count(*) AS marks_before FROM outbox.consumed;
SELECT * FROM expect_error($$SELECT outbox.purge_consumed(interval '-1 day')$$);
SELECT * FROM expect_error($$SELECT outbox.purge_consumed(interval '0', 0)$$);
SELECT * FROM expect_error($$SELECT outbox.purge_consumed(interval '0', NULL)$$);
SELECT count(*) AS marks_after FROM outbox.consumed;
-- The window is the operator's: a session cannot shorten it.
SET outbox.consumed_retention = '1s';

-- Privileges: nothing for PUBLIC; docs/privileges.md's grant lets a consumer role mark events, through
-- the SECURITY DEFINER function only.
SELECT has_table_privilege('public', 'outbox.consumed', 'SELECT') AS public_select,
       has_function_privilege('public', 'outbox.consume_once(text, uuid)', 'EXECUTE') AS public_consume_once,
       has_function_privilege('public', 'outbox.purge_consumed(interval, integer)', 'EXECUTE') AS public_purge_consumed,
       has_table_privilege('outbox_relay', 'outbox.consumed', 'SELECT') AS relay_select;
CREATE ROLE outbox_test_consumer;
CREATE ROLE outbox_test_stranger;
GRANT USAGE ON SCHEMA outbox TO outbox_test_consumer;
GRANT EXECUTE ON FUNCTION outbox.consume_once(text, uuid) TO outbox_test_consumer;
TRUNCATE outbox.consumed;
SET ROLE outbox_test_stranger;
SELECT outbox.consume_once('invoice-projector', '23f504e7-13f0-51d4-b4a0-e9842b35a99b');
RESET ROLE;
-- A hostile search_path does not reach into it.
CREATE SCHEMA outbox_test_evil;
CREATE FUNCTION outbox_test_evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$;
GRANT USAGE ON SCHEMA outbox_test_evil TO outbox_test_consumer;
SET ROLE outbox_test_consumer;
SET search_path = outbox_test_evil, public;
SELECT outbox.consume_once('invoice-projector', '23f504e7-13f0-51d4-b4a0-e9842b35a99b') AS consumer_first;
SELECT outbox.consume_once('invoice-projector', '23f504e7-13f0-51d4-b4a0-e9842b35a99b') AS consumer_duplicate;
RESET search_path;
-- It cannot read, delete or purge the marks (that would re-apply events).
SELECT count(*) FROM outbox.consumed;
DELETE FROM outbox.consumed;
SELECT outbox.purge_consumed(interval '0');
RESET ROLE;
SELECT consumer, consumed_at > '2001-01-01' AS real_now FROM outbox.consumed;

DROP SCHEMA outbox_test_evil CASCADE;
REVOKE ALL ON SCHEMA outbox FROM outbox_test_consumer;
REVOKE ALL ON FUNCTION outbox.consume_once(text, uuid) FROM outbox_test_consumer;
DROP ROLE outbox_test_consumer, outbox_test_stranger;
TRUNCATE outbox.consumed;
