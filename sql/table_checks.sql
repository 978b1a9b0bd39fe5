-- The table refuses rows that the relay could not publish as they are: every check fires on a
-- row written by hand, names its constraint, and inserts nothing. enqueue() never writes such
-- rows; the relay quarantines what gets past (integration tests).
\set VERBOSITY terse
TRUNCATE outbox.events;
\set good_id '''00000000-0000-4000-8000-000000000001'''

-- A row written by hand the way docs/sql-api.md "The table" shows is accepted.
INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x7b7d', '{"trace": "t"}');
SELECT topic, key, lane = outbox.lane_of(key, event_id) AS lane_matches FROM outbox.events;

-- A lane that is not the key's (two workers would publish one key).
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (gen_random_uuid(), 'billing', 'k1', (outbox.lane_of('k1', :good_id) + 1) % 1024, '\x00');
-- Unkeyed: the lane is the event id's.
SELECT outbox.lane_of(NULL, :good_id) = outbox.lane_of(NULL, :good_id) AS stable,
       outbox.lane_of(NULL, NULL) IS NULL AS null_id;
-- Headers: JSON null values, non-strings, non-objects, the reserved name.
INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', '{"trace": null}');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', '{"n": 1}');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', '{"o": {"a": "b"}}');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', '["a"]');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', '"a"');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', '{"event_id": "x"}');
-- Topics Kafka would refuse.
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (gen_random_uuid(), 'bad topic', 'k1', outbox.lane_of('k1', :good_id), '\x00');
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (gen_random_uuid(), '..', 'k1', outbox.lane_of('k1', :good_id), '\x00');
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (gen_random_uuid(), repeat('t', 250), 'k1', outbox.lane_of('k1', :good_id), '\x00');
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (gen_random_uuid(), 'caf' || chr(233), 'k1', outbox.lane_of('k1', :good_id), '\x00');
-- Timestamps that never come (or came before time): a retry wait could never be computed.
INSERT INTO outbox.events (event_id, topic, key, lane, payload, next_attempt_at)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', 'infinity');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, next_attempt_at)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', '-infinity');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, created_at)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', 'infinity');
-- Attempts out of range (the backoff would overflow).
INSERT INTO outbox.events (event_id, topic, key, lane, payload, attempts)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', -1);
INSERT INTO outbox.events (event_id, topic, key, lane, payload, attempts)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', 2147483647);
-- A tombstone needs a key; positions are never negative.
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (:good_id, 'billing', NULL, outbox.lane_of(NULL, :good_id), NULL);
INSERT INTO outbox.events (event_id, topic, key, lane, payload, kafka_partition)
VALUES (:good_id, 'billing', 'k1', outbox.lane_of('k1', :good_id), '\x00', -1);
-- A key longer than the per-key indexes take; a lane outside 0..1023; a status the relay does
-- not know; published_at without status 'published', and the reverse; a header value that is not
-- a string (an array of strings is not one either).
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (gen_random_uuid(), 'billing', repeat('k', 2049), outbox.lane_of(repeat('k', 2049), NULL), '\x00');
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (gen_random_uuid(), 'billing', 'k1', 1024, '\x00');
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (gen_random_uuid(), 'billing', 'k1', -1, '\x00');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, status)
VALUES (gen_random_uuid(), 'billing', 'k1', outbox.lane_of('k1', NULL), '\x00', 'sent');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, published_at)
VALUES (gen_random_uuid(), 'billing', 'k1', outbox.lane_of('k1', NULL), '\x00', now());
INSERT INTO outbox.events (event_id, topic, key, lane, payload, status)
VALUES (gen_random_uuid(), 'billing', 'k1', outbox.lane_of('k1', NULL), '\x00', 'published');
-- (published_at on an unknown status: the published rule comes first, by name)
INSERT INTO outbox.events (event_id, topic, key, lane, payload, status, published_at)
VALUES (gen_random_uuid(), 'billing', 'k1', outbox.lane_of('k1', NULL), '\x00', 'sent', now());
INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers)
VALUES (gen_random_uuid(), 'billing', 'k1', outbox.lane_of('k1', NULL), '\x00', '{"a": ["x"]}');
INSERT INTO outbox.events (event_id, topic, key, lane, payload, claimed_at)
VALUES (gen_random_uuid(), 'billing', 'k1', outbox.lane_of('k1', NULL), '\x00', '-infinity');
-- A row breaking several rules is refused for the first by name (the order PostgreSQL applied
-- them in as constraints of their own); the error says the rule and where the rules are.
\set VERBOSITY default
INSERT INTO outbox.events (event_id, topic, key, lane, payload, attempts)
VALUES (gen_random_uuid(), 'bad topic', 'k1', 0, '\x00', -1);
\set VERBOSITY terse
-- An UPDATE is held to the same checks.
UPDATE outbox.events SET key = 'k2';
UPDATE outbox.events SET next_attempt_at = 'infinity';
UPDATE outbox.events SET headers = '{"trace": null}';
-- Nothing but the first row got in, and it is unchanged.
SELECT count(*) AS rows, min(key) AS key, min(headers::text) AS headers FROM outbox.events;

-- The queue is part of a dump: the table's rows and the id sequence are configuration data.
SELECT c.relname FROM pg_extension x, unnest(x.extconfig) AS cfg(oid) JOIN pg_class c ON c.oid = cfg.oid
WHERE x.extname = 'outbox' ORDER BY 1;

-- The relay's role: no superuser, no login, exactly these rights.
SELECT rolsuper, rolcanlogin, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles WHERE rolname = 'outbox_relay';
SELECT has_schema_privilege('outbox_relay', 'outbox', 'USAGE') AS usage,
       has_schema_privilege('outbox_relay', 'outbox', 'CREATE') AS create;
SELECT c.relname, p.privilege, has_table_privilege('outbox_relay', c.oid, p.privilege) AS granted
FROM pg_class c, unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p(privilege)
WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'v')
  AND has_table_privilege('outbox_relay', c.oid, p.privilege)
ORDER BY 1, 2;
SELECT p.oid::regprocedure AS executable
FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace AND has_function_privilege('outbox_relay', p.oid, 'EXECUTE')
ORDER BY p.oid::regprocedure::text;
-- The relay's statements (as in src/relay/relay_sql.cpp) read partial indexes of unfinished rows, never
-- the retained history, and walk them in order: with the planner settings the relay pins
-- (src/relay/worker.cpp), the claim's plan is the same without statistics as with them.
TRUNCATE outbox.events;
INSERT INTO outbox.events (event_id, topic, key, lane, payload, status, published_at, kafka_partition, kafka_offset)
SELECT e, 'billing', 'k' || (i % 100), outbox.lane_of('k' || (i % 100), e), '\x00', 'published', now(), 0, i
FROM (SELECT gen_random_uuid() AS e, i FROM generate_series(1, 20000) i) s;
SET enable_seqscan = off;
SET enable_sort = off;
-- EXPLAIN (COSTS OFF) with subplans in the filters spelled as before PostgreSQL 17 (which writes
-- "NOT EXISTS(SubPlan 1)" for "NOT (SubPlan 1)", and a hashed subplan's test column by column),
-- so one expected file serves every major.
CREATE FUNCTION pg_temp.plan_of(statement text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
	line text;
BEGIN
	FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || statement LOOP
		line := regexp_replace(line, 'EXISTS\((SubPlan \d+)\)', '(\1)', 'g');
		line := regexp_replace(line, '\(ANY \(\(topic = \((hashed SubPlan \d+)\)\.col1\) AND \(key = \(\1\)\.col2\)\)\)',
		                       '(\1)', 'g');
		RETURN NEXT line;
	END LOOP;
END
$$;
PREPARE candidates(int, int, int, boolean, text[], text[]) AS
	SELECT e.ctid, e.id, e.topic, e.key,
	       (coalesce(octet_length(e.payload), 0) + coalesce(octet_length(e.key), 0)
	        + coalesce(octet_length(e.headers::text), 0))::bigint
	FROM outbox.events e
	WHERE e.status = 'pending' AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())
	  AND (e.lane::integer % $1 + $1) % $1 = $2
	  AND (e.key IS NULL OR NOT EXISTS (
	        SELECT 1 FROM outbox.events b
	        WHERE b.topic = e.topic AND b.key = e.key AND (b.order_lsn, b.id) < (e.order_lsn, e.id)
	          AND (b.status = 'in_flight' OR (b.status = 'failed' AND $4)
	               OR (b.status = 'pending' AND b.next_attempt_at IS NOT NULL AND b.next_attempt_at > now()))))
	  AND (e.key IS NULL OR $5::text[] IS NULL OR NOT EXISTS (
	        SELECT 1 FROM ROWS FROM (unnest($5::text[]), unnest($6::text[])) AS s(topic, key)
	        WHERE s.topic = e.topic AND s.key = e.key))
	ORDER BY e.order_lsn, e.id
	LIMIT $3;
SELECT pg_temp.plan_of($$EXECUTE candidates(1, 0, 5000, true, NULL, NULL)$$);
ANALYZE outbox.events;
SELECT pg_temp.plan_of($$EXECUTE candidates(2, 1, 5000, true, '{orders}', '{k1}')$$);
PREPARE lock(tid[]) AS
	SELECT e.id, e.status = 'pending' FROM outbox.events e WHERE e.ctid = ANY ($1) FOR UPDATE OF e SKIP LOCKED;
SELECT pg_temp.plan_of($$EXECUTE lock('{"(0,1)","(0,2)"}')$$);
PREPARE requeue(int, int) AS
	UPDATE outbox.events e SET status = 'pending'
	WHERE e.id IN (SELECT o.id FROM outbox.events o
	               WHERE o.status = 'in_flight' AND (o.lane::integer % $1 + $1) % $1 = $2
	               FOR UPDATE OF o SKIP LOCKED);
SELECT pg_temp.plan_of($$EXECUTE requeue(1, 0)$$);
PREPARE next_retry(int, int) AS
	SELECT (extract(epoch FROM least(min(next_attempt_at), now() + interval '1 hour') - now()) * 1000::numeric)::bigint
	FROM outbox.events
	WHERE status = 'pending' AND next_attempt_at IS NOT NULL AND next_attempt_at > now()
	  AND (lane::integer % $1 + $1) % $1 = $2;
SELECT pg_temp.plan_of($$EXECUTE next_retry(1, 0)$$);
DEALLOCATE candidates;
DEALLOCATE lock;
DEALLOCATE requeue;
DEALLOCATE next_retry;
RESET enable_seqscan;
RESET enable_sort;
TRUNCATE outbox.events;
