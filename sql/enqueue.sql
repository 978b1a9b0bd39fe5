-- outbox.enqueue(): the three payload types, ids, duplicates, atomicity, bad input.
SET outbox.max_payload_bytes = '1MB';

-- jsonb, text and bytea payloads are stored as the bytes that will be published.
SELECT outbox.enqueue('billing.invoices', 'inv-1', '{"amount": 42, "currency": "EUR"}'::jsonb) IS NOT NULL AS jsonb_ok;
SELECT outbox.enqueue('billing.invoices', 'inv-1', 'plain text'::text) IS NOT NULL AS text_ok;
SELECT outbox.enqueue('billing.invoices', 'inv-2', '\xdeadbeef'::bytea) IS NOT NULL AS bytea_ok;
-- An untyped literal resolves to the text variant.
SELECT outbox.enqueue('billing.invoices', 'inv-2', 'untyped') IS NOT NULL AS untyped_ok;
SELECT topic, key, payload, CASE WHEN key = 'inv-1' THEN convert_from(payload, 'UTF8') END AS as_text, headers, status, attempts,
       coalesce(next_attempt_at <= now(), true) AS due, last_error, published_at, kafka_partition, kafka_offset
FROM outbox.events ORDER BY id;

-- Ids follow enqueue order.
SELECT bool_and(id > 0) AND count(DISTINCT id) = count(*) AS ids_distinct FROM outbox.events;

-- A given event_id is returned; the same id again inserts nothing, raises nothing and returns
-- NULL: that is how a caller tells a duplicate.
SELECT outbox.enqueue('billing.invoices', 'inv-3', '{}'::jsonb, NULL, 'a7c0f2a6-0000-4000-8000-000000000001');
SELECT outbox.enqueue('billing.invoices', 'inv-3', '{"other": true}'::jsonb, NULL, 'a7c0f2a6-0000-4000-8000-000000000001');
SELECT count(*), min(convert_from(payload, 'UTF8')) FROM outbox.events
WHERE event_id = 'a7c0f2a6-0000-4000-8000-000000000001';

-- Generated ids are RFC 9562 version 8, laid out as version 7 with outbox's mark: the Unix time in
-- milliseconds first (between the clock read before and after; the later id's never below the
-- earlier's), then version 8 and the mark 0b0, then random bits.
CREATE TEMP TABLE made AS SELECT clock_timestamp() AS before, outbox.enqueue('t', NULL, 'x') AS a,
                                 outbox.enqueue('t', NULL, 'x') AS b, clock_timestamp() AS after;
SELECT substr(a::text, 15, 4) AS version_and_mark, substr(b::text, 15, 4) AS version_and_mark_b,
       substr(a::text, 20, 1) IN ('8', '9', 'a', 'b') AS variant_ok,
       substr(a::text, 1, 13) <= substr(b::text, 1, 13) AS ms_in_order_made, a <> b AS distinct_ids,
       ('x' || substr(replace(a::text, '-', ''), 1, 12))::bit(48)::bigint
         BETWEEN floor(extract(epoch FROM before) * 1000) AND ceil(extract(epoch FROM after) * 1000) AS unix_ms_ok
FROM made;
DROP TABLE made;
-- Unkeyed events take their lane from their id: ids of one millisecond (one time prefix, random
-- tails) still spread over every lane (20,000 over 1,024 lanes: about 20 each; an empty or a
-- crowded lane means the hash does not see the random bits).
CREATE TEMP TABLE spread AS
SELECT outbox.lane_of(NULL, encode(overlay(uuid_send(gen_random_uuid()) PLACING '\x0190aabbccdd'::bytea
                                           FROM 1 FOR 6), 'hex')::uuid) AS lane
FROM generate_series(1, 20000);
SELECT count(DISTINCT lane) AS lanes, max(n) < 60 AS none_crowded
FROM (SELECT lane, count(*) AS n FROM spread GROUP BY lane) l;
DROP TABLE spread;

-- Headers: a JSON object of strings.
SELECT outbox.enqueue('billing.invoices', 'inv-4', '{}'::jsonb, '{"trace_id": "abc", "source": "billing"}') IS NOT NULL;
SELECT headers FROM outbox.events WHERE key = 'inv-4';

-- Tombstone: a NULL payload with a key is allowed (deletes the key in a compacted topic).
SELECT outbox.enqueue('billing.invoices', 'inv-5', NULL::jsonb) IS NOT NULL AS tombstone_ok;
SELECT payload IS NULL AS is_tombstone FROM outbox.events WHERE key = 'inv-5';

-- Lanes: the same key always maps to the same lane; lanes are in [0, 1024).
SELECT count(DISTINCT lane) FROM outbox.events WHERE key = 'inv-1';
SELECT bool_and(lane BETWEEN 0 AND 1023) FROM outbox.events;

-- Atomicity: a rolled-back transaction or savepoint leaves no row; a committed one exactly one.
SELECT count(*) AS before FROM outbox.events \gset
BEGIN;
SELECT outbox.enqueue('billing.invoices', 'rollback-me', '{}'::jsonb) IS NOT NULL;
ROLLBACK;
BEGIN;
SELECT outbox.enqueue('billing.invoices', 'keep-me', '{}'::jsonb) IS NOT NULL;
SAVEPOINT s;
SELECT outbox.enqueue('billing.invoices', 'savepoint-rollback', '{}'::jsonb) IS NOT NULL;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) - :before AS added,
       count(*) FILTER (WHERE key = 'keep-me') AS kept,
       count(*) FILTER (WHERE key IN ('rollback-me', 'savepoint-rollback')) AS rolled_back
FROM outbox.events;

-- Bad input: a clear error with its SQLSTATE, and nothing changes.
SELECT count(*) AS before FROM outbox.events \gset
SELECT * FROM expect_error($$SELECT outbox.enqueue(NULL, 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('', 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('.', 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('..', 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('has space', 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('slash/topic', 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('ünicode', 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue(repeat('a', 250), 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', NULL, NULL::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', NULL, NULL::bytea)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', '{}'::jsonb, '[1, 2]')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', '{}'::jsonb, '"just a string"')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', '{}'::jsonb, '{"n": 1}')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', '{}'::jsonb, '{"nested": {"a": "b"}}')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', '{}'::jsonb, '{"event_id": "mine"}')$$);
SET outbox.max_payload_bytes = 100;
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', repeat('x', 101))$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', repeat('x', 90), '{"h": "0123456789"}')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', repeat('k', 101), 'x')$$);
RESET outbox.max_payload_bytes;
-- Keys are indexed: longer than 2048 bytes is refused with a reason, not an index error.
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', repeat('k', 2049), 'x')$$);
SELECT outbox.enqueue('t', repeat('k', 2048), 'x') IS NOT NULL AS longest_key_accepted;
DELETE FROM outbox.events WHERE octet_length(key) = 2048;
SELECT count(*) - :before AS added_by_bad_input FROM outbox.events;

-- The edges that are legal.
SELECT outbox.enqueue(repeat('a', 249), 'k', '{}'::jsonb) IS NOT NULL AS longest_legal_topic;
SELECT outbox.enqueue('.hidden', 'k', '{}'::jsonb) IS NOT NULL AS dot_prefix_legal;
SET outbox.max_payload_bytes = 100;
SELECT outbox.enqueue('t', 'k', repeat('x', 99)) IS NOT NULL AS at_limit_ok;
RESET outbox.max_payload_bytes;
