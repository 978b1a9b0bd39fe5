-- Schema 0.4.1, the default version (outbox.control): the insert-only ring of member tables
-- outbox.events_0 .. events_3 behind the view outbox.events. The files before this one run on
-- 0.3.0 (setup.sql); this one makes the default version for itself, runs last (after upgrade,
-- which leaves 0.3.0 installed) and puts setup's 0.3.0 back at its end. (test/test_ring_*.py test
-- the ring in depth, with the relay and with a database updated from 0.3.0.)
DROP EXTENSION outbox;
CREATE EXTENSION outbox;
SELECT e.extversion, e.extversion = a.default_version AS is_default_version
FROM pg_extension e JOIN pg_available_extensions a ON a.name = e.extname
WHERE e.extname = 'outbox';

SELECT c.relname, c.relkind
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'v')
ORDER BY c.relname;

-- A fresh ring: member 0 is current, the others free; no cursor, nothing waiting or landed.
SELECT member, is_current, opened_at IS NOT NULL AS opened, sealed_at IS NOT NULL AS sealed
FROM outbox.ring ORDER BY member;
SELECT (SELECT count(*) FROM outbox.cursors) AS cursors, (SELECT count(*) FROM outbox.event_state) AS event_state,
       (SELECT count(*) FROM outbox.landed) AS landed, (SELECT count(*) FROM outbox.ring_start) AS ring_start_rows;

-- Like expect_error (setup), with the fields a row rule's error names: the member, the rule and
-- the column.
CREATE FUNCTION public.expect_error_fields(statement text)
RETURNS TABLE (error_code text, table_name text, constraint_name text, column_name text, message text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE statement;
	RAISE EXCEPTION 'expected an error from: %', statement;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS error_code = RETURNED_SQLSTATE, table_name = TABLE_NAME,
	                        constraint_name = CONSTRAINT_NAME, column_name = COLUMN_NAME, message = MESSAGE_TEXT;
	IF message LIKE 'expected an error from:%' THEN
		RAISE;
	END IF;
	RETURN NEXT;
END
$$;

-- enqueue goes into the current member; the view shows the events pending.
SELECT outbox.enqueue('ring.orders', 'o-1', '{"n": 1}'::jsonb, NULL, outbox.event_id('ring-test', 'o-1')) AS event_id;
SELECT outbox.enqueue('ring.orders', NULL, 'unkeyed'::text, partition => 3) IS NOT NULL AS unkeyed_ok;
SELECT (SELECT count(*) FROM outbox.events_0) AS events_0, (SELECT count(*) FROM outbox.events_1) AS events_1,
       (SELECT count(*) FROM outbox.events_2) AS events_2, (SELECT count(*) FROM outbox.events_3) AS events_3;
SELECT key, convert_from(payload, 'UTF8') AS payload, status, attempts, published_at, kafka_partition,
       kafka_offset, target_partition, order_lsn IS NOT NULL AS stamped
FROM outbox.events ORDER BY id;
SELECT bool_and(writer <> '0') AS writers_stamped FROM outbox.events_0;

-- 1. Bad input to enqueue: a clear error with its SQLSTATE, and nothing changes (no member row,
-- no event_state row).
SELECT count(*) AS before FROM outbox.events \gset
SELECT * FROM expect_error($$SELECT outbox.enqueue(NULL, 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('', 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('has space', 'k', '{}'::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', '{}'::jsonb, '[1, 2]')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', '{}'::jsonb, '{"n": 1}')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', '{}'::jsonb, '{"event_id": "mine"}')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', NULL, NULL::jsonb)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('t', 'k', '{}'::jsonb, partition => -1)$$);
SELECT count(*) - :before AS added_by_bad_input,
       (SELECT count(*) FROM outbox.events_0) + (SELECT count(*) FROM outbox.events_1)
       + (SELECT count(*) FROM outbox.events_2) + (SELECT count(*) FROM outbox.events_3) AS member_rows,
       (SELECT count(*) FROM outbox.event_state) AS event_state
FROM outbox.events;

-- 2. A caller's event_id twice: the first call returns it, the second NULL and writes nothing;
-- the view shows one event, the first payload. The view's INSERT of that id is refused.
SELECT outbox.enqueue('ring.dedup', 'd', 'first'::text, NULL, outbox.event_id('ring-test', 'dup'))
     = outbox.event_id('ring-test', 'dup') AS first_returns_the_id;
SELECT outbox.enqueue('ring.dedup', 'd', 'second'::text, NULL, outbox.event_id('ring-test', 'dup')) IS NULL
    AS duplicate_returns_null;
SELECT count(*), min(convert_from(payload, 'UTF8')) AS payload FROM outbox.events
WHERE event_id = outbox.event_id('ring-test', 'dup');
SELECT count(*) AS member_rows FROM outbox.events_0 WHERE event_id = outbox.event_id('ring-test', 'dup');
SELECT * FROM expect_error($$INSERT INTO outbox.events (event_id, topic, key, lane, payload)
                             VALUES (outbox.event_id('ring-test', 'dup'), 'ring.dedup', 'd', outbox.lane_of('d', NULL), 'third')$$);

-- 3. Writes through the view. A row by hand goes into the current member, pending, stamped.
INSERT INTO outbox.events (event_id, topic, key, lane, payload)
VALUES (outbox.event_id('ring-test', 'hand'), 'ring.hand', 'h', outbox.lane_of('h', NULL), 'by hand')
RETURNING event_id, status, attempts, order_lsn IS NOT NULL AS stamped;
SELECT count(*) AS in_events_0 FROM outbox.events_0 WHERE event_id = outbox.event_id('ring-test', 'hand') AND writer <> '0';
-- One that breaks a row rule is refused by the member's stamp trigger (23514, naming the member,
-- the rule and the column), and nothing goes in; so is one that sets the relay's columns.
SELECT count(*) AS before FROM outbox.events \gset
SELECT * FROM expect_error_fields($$INSERT INTO outbox.events (event_id, topic, key, lane, payload)
                                    VALUES (outbox.event_id('ring-test', 'bad-topic'), 'bad topic', 'h', outbox.lane_of('h', NULL), 'x')$$);
SELECT * FROM expect_error_fields($$INSERT INTO outbox.events (event_id, topic, key, lane, payload)
                                    VALUES (outbox.event_id('ring-test', 'bad-lane'), 'ring.hand', 'h', (outbox.lane_of('h', NULL) + 1) % 1024, 'x')$$);
SELECT * FROM expect_error($$INSERT INTO outbox.events (event_id, topic, key, lane, payload, status)
                             VALUES (outbox.event_id('ring-test', 'failed-by-hand'), 'ring.hand', 'h', outbox.lane_of('h', NULL), 'x', 'failed')$$);
SELECT count(*) - :before AS added_by_bad_rows FROM outbox.events;

-- enqueue writes an event with a generated id straight into the member, without an INSERT
-- statement (src/enqueue/member_insert.cpp); into a member of another shape (here an
-- administrator's INSERT trigger on it) it runs the statement, which fires that trigger. The
-- rows of both ways alike: an id from the sequence, the transaction's created_at, the lane of the
-- key, the stamp and the transaction as writer, ids and stamps rising in enqueue order.
CREATE TABLE public.ring_insert_seen (event_id uuid);
CREATE FUNCTION public.ring_insert_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.ring_insert_seen VALUES (NEW.event_id);
	RETURN NEW;
END
$$;
BEGIN;
SELECT outbox.enqueue('ring.paths', 'p', 'direct'::text) AS direct_id \gset
CREATE TRIGGER a_seen BEFORE INSERT ON outbox.events_0 FOR EACH ROW EXECUTE FUNCTION public.ring_insert_seen();
SELECT outbox.enqueue('ring.paths', 'p', 'statement'::text) AS statement_id \gset
DROP TRIGGER a_seen ON outbox.events_0;
SELECT outbox.enqueue('ring.paths', NULL, 'direct, unkeyed, a CloudEvent'::text, partition => 1, cloudevents => true,
                      event_type => 'com.example.path') IS NOT NULL AS enqueued;
SELECT array_agg(event_id = :'statement_id') AS the_trigger_saw_the_statement_only FROM public.ring_insert_seen;
SELECT convert_from(payload, 'UTF8') AS payload, key, id > lag(id) OVER w AS id_rises,
       order_lsn > lag(order_lsn) OVER w AS stamp_rises, created_at = now() AS created_now,
       writer = pg_current_xact_id() AS written_by_this_transaction, lane = outbox.lane_of(key, event_id) AS lane_of_key,
       target_partition, ce_content_type, ce_type, ce_source IS NOT NULL AS has_source
FROM outbox.events_0 WHERE topic = 'ring.paths' WINDOW w AS (ORDER BY id) ORDER BY id;
SELECT (SELECT count(*) FROM outbox.events_0 WHERE event_id IN (:'direct_id', :'statement_id')) AS member_rows,
       (SELECT count(*) FROM outbox.events WHERE event_id IN (:'direct_id', :'statement_id') AND status = 'pending') AS pending;
COMMIT;
DROP TABLE public.ring_insert_seen;
DROP FUNCTION public.ring_insert_seen();
-- In a read-only transaction enqueue is refused as an INSERT is (25006), and writes nothing.
SELECT count(*) AS before FROM outbox.events \gset
BEGIN READ ONLY;
SELECT * FROM expect_error($$SELECT outbox.enqueue('ring.paths', 'p', 'read only'::text)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('ring.paths', NULL, 'read only'::text)$$);
ROLLBACK;
SELECT count(*) - :before AS added_read_only FROM outbox.events;

-- UPDATE and DELETE of an event that is not failed: refused (55000), nothing changes.
SELECT * FROM expect_error($$UPDATE outbox.events SET payload = 'changed' WHERE event_id = outbox.event_id('ring-test', 'o-1')$$);
SELECT * FROM expect_error($$DELETE FROM outbox.events WHERE event_id = outbox.event_id('ring-test', 'o-1')$$);
SELECT convert_from(payload, 'UTF8') AS payload, status FROM outbox.events WHERE event_id = outbox.event_id('ring-test', 'o-1');

-- A failed event (its event_state row, as the relay's quarantine writes it) and a later event of
-- its key (which the relay holds behind it).
SELECT outbox.enqueue('ring.poison', 'bad-key', 'poison'::text, NULL, outbox.event_id('ring-test', 'poison')) IS NOT NULL AS poison;
SELECT outbox.enqueue('ring.poison', 'bad-key', 'after'::text, NULL, outbox.event_id('ring-test', 'after')) IS NOT NULL AS after;
INSERT INTO outbox.event_state (id, member, event_id, topic, key, lane, payload, headers, created_at, order_lsn,
                                member_lsn, writer, status, attempts, last_error)
SELECT id, 0, event_id, topic, key, lane, payload, headers, created_at, order_lsn, order_lsn, writer, 'failed', 3,
       'MSG_SIZE_TOO_LARGE'
FROM outbox.events_0 WHERE event_id = outbox.event_id('ring-test', 'poison');
SELECT key, convert_from(payload, 'UTF8') AS payload, status, attempts, last_error FROM outbox.events
WHERE topic = 'ring.poison' ORDER BY id;
SELECT topic, key, attempts, last_error FROM outbox.failed;
-- Its content can be corrected (the copy the relay publishes; the member row stays as it was),
-- its identity and the relay's columns cannot, nor content the relay could not publish.
UPDATE outbox.events SET payload = 'corrected', headers = '{"fixed": "yes"}'
WHERE event_id = outbox.event_id('ring-test', 'poison')
RETURNING key, convert_from(payload, 'UTF8') AS payload, headers;
SELECT convert_from(payload, 'UTF8') AS payload, headers, status FROM outbox.events
WHERE event_id = outbox.event_id('ring-test', 'poison');
SELECT convert_from(payload, 'UTF8') AS member_payload, headers AS member_headers FROM outbox.events_0
WHERE event_id = outbox.event_id('ring-test', 'poison');
SELECT * FROM expect_error($$UPDATE outbox.events SET key = 'other' WHERE event_id = outbox.event_id('ring-test', 'poison')$$);
SELECT * FROM expect_error($$UPDATE outbox.events SET status = 'pending' WHERE event_id = outbox.event_id('ring-test', 'poison')$$);
SELECT error_code, message FROM expect_error($$UPDATE outbox.events SET headers = '{"event_id": "x"}' WHERE event_id = outbox.event_id('ring-test', 'poison')$$);
-- A statement that matches the failed event and a pending one is refused whole.
SELECT error_code, message FROM expect_error($$UPDATE outbox.events SET payload = 'y' WHERE key = 'bad-key'$$);
SELECT error_code, message FROM expect_error($$DELETE FROM outbox.events WHERE key = 'bad-key'$$);
SELECT key, convert_from(payload, 'UTF8') AS payload, status FROM outbox.events WHERE topic = 'ring.poison' ORDER BY id;
-- DELETE gives it up: no longer shown, failed or retried; its member row stays (insert-only),
-- hidden by its event_state row, now 'discarded'. The later event of its key is as it was.
DELETE FROM outbox.events WHERE event_id = outbox.event_id('ring-test', 'poison') AND status = 'failed'
RETURNING key, status;
SELECT key, convert_from(payload, 'UTF8') AS payload, status FROM outbox.events WHERE topic = 'ring.poison' ORDER BY id;
SELECT count(*) AS failed FROM outbox.failed;
SELECT status FROM outbox.event_state WHERE event_id = outbox.event_id('ring-test', 'poison');
SELECT count(*) AS member_rows FROM outbox.events_0 WHERE event_id = outbox.event_id('ring-test', 'poison');
SELECT * FROM expect_error($$SELECT outbox.retry(outbox.event_id('ring-test', 'poison'))$$);
-- Given up once: a second DELETE finds nothing.
DELETE FROM outbox.events WHERE event_id = outbox.event_id('ring-test', 'poison') RETURNING key;

-- 5. outbox.ring_status: its columns, and one row per member of the fresh ring (member 0 current;
-- outbox.retention is 7 days: nothing sealed, nothing overdue).
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'outbox.ring_status'::regclass AND attnum > 0 ORDER BY attnum;
SHOW outbox.retention;
SELECT member, is_current, opened_at IS NOT NULL AS opened, sealed_at IS NOT NULL AS sealed, overdue, kept_because
FROM outbox.ring_status;
SELECT * FROM expect_error($$SELECT * FROM outbox.ring_status(interval '-1 day')$$);
-- No cursor made on another system: the re-base has nothing to do.
SELECT * FROM outbox.ring_rebase();

-- 4. outbox.purge(): its arguments, then one round of the ring's retention.
SELECT * FROM expect_error($$SELECT outbox.purge(interval '-1 day')$$);
SELECT * FROM expect_error($$SELECT outbox.purge(interval '7 days', 0)$$);
SELECT * FROM expect_error($$SELECT outbox.purge(interval '7 days', NULL)$$);
-- Within the window nothing is sealed or emptied (the current member is younger than a third of
-- it); without older_than the window is outbox.retention.
SELECT outbox.purge(interval '7 days') AS removed;
SELECT outbox.purge() AS removed;
SELECT member, is_current, sealed_at IS NOT NULL AS sealed FROM outbox.ring ORDER BY member;
-- A window of 0 seals the current member (it holds rows) and makes the next one current; no relay
-- cursor has passed the sealed one, so it keeps its rows: 0 published events removed.
SELECT count(*) AS before FROM outbox.events \gset
SELECT outbox.purge(interval '0') AS removed;
SELECT member, is_current, sealed_at IS NOT NULL AS sealed FROM outbox.ring ORDER BY member;
SELECT count(*) - :before AS events_lost, (SELECT count(*) FROM outbox.events_0) > 0 AS events_0_kept FROM outbox.events;
SELECT outbox.enqueue('ring.orders', 'o-2', '{"n": 2}'::jsonb) IS NOT NULL AS enqueued;
SELECT (SELECT count(*) FROM outbox.events_1) AS in_events_1;
SELECT member, is_current, sealed_at IS NOT NULL AS sealed, overdue, kept_because FROM outbox.ring_status;
SELECT member, overdue, kept_because FROM outbox.ring_status(interval '0') ORDER BY member;

-- With outbox.retention = 0 (the relay never purges) purge() needs its window; ring_status has
-- none (overdue and kept_because NULL). outbox.retention is a reload setting: a new session
-- started after the reload has it.
ALTER SYSTEM SET outbox.retention = 0;
SELECT pg_reload_conf();
\c
SHOW outbox.retention;
SELECT * FROM expect_error($$SELECT outbox.purge()$$);
SELECT outbox.purge(interval '7 days') AS removed;
SELECT member, is_current, overdue, kept_because FROM outbox.ring_status;
ALTER SYSTEM RESET outbox.retention;
SELECT pg_reload_conf();
\c
SHOW outbox.retention;
SELECT count(*) AS left_in_auto_conf FROM pg_file_settings WHERE name LIKE 'outbox.%' AND sourcefile LIKE '%auto.conf';

-- A relay cursor of this system (at ring_start, where a relay makes it) is no reason to re-base;
-- one made on another system identifier is: every cursor row goes to this system, and every
-- event neither published nor in event_state is copied there, pending.
INSERT INTO outbox.cursors (n_workers, worker, order_lsn, id, system_identifier, updated_at)
SELECT 1, 0, r.order_lsn, 0, s.system_identifier, now() FROM outbox.ring_start r, pg_control_system() s;
SELECT * FROM outbox.ring_rebase();
SELECT count(*) AS event_state_rows FROM outbox.event_state;
UPDATE outbox.cursors SET system_identifier = system_identifier + 1;
SELECT count(*) AS expected_copies FROM outbox.events WHERE status = 'pending' \gset
SELECT rebased, copied, copied = :expected_copies AS copied_every_pending_event FROM outbox.ring_rebase();
SELECT status, count(*) FROM outbox.event_state GROUP BY status ORDER BY status;
SELECT count(*) AS foreign_cursors FROM outbox.cursors c, pg_control_system() s
WHERE c.system_identifier <> s.system_identifier;
SELECT status, count(*) FROM outbox.events GROUP BY status ORDER BY status;
SELECT * FROM outbox.ring_rebase();

-- Event-id index entries for a caller's id only (0.4.1): the member's unique index on event_id is
-- partial, WHERE caller_event_id; a row whose id enqueue generated says so (false) and is not in
-- it, nor deduplicated. Such an id carries enqueue's mark (version 8, ...-80b0-...): given again
-- to enqueue or the view it is refused (22023, nothing written), so no second event shares it. A
-- caller's id is deduplicated, once. A row written into a member by hand leaves the column out
-- (true) and is unique-checked; it may say false only for a marked id (23514 naming the rule); a
-- marked id with true is indexed (enqueue made it before the update; a 0.4.0 dump's, restored).
SELECT pg_get_indexdef('outbox.events_0_event_id_key'::regclass) AS event_id_index;
SELECT outbox.enqueue('ring.ids', 'g', 'generated'::text) AS generated \gset
CREATE TEMP VIEW ring_ids AS
SELECT event_id, topic, caller_event_id FROM outbox.events_0 UNION ALL SELECT event_id, topic, caller_event_id FROM outbox.events_1
UNION ALL SELECT event_id, topic, caller_event_id FROM outbox.events_2 UNION ALL SELECT event_id, topic, caller_event_id FROM outbox.events_3;
SELECT caller_event_id, substr(event_id::text, 15, 4) AS version_and_mark FROM ring_ids WHERE event_id = :'generated';
SELECT error_code, message = format('event_id %s was generated by outbox.enqueue() and cannot be given to another event',
                                    :'generated') AS message_names_the_id
FROM expect_error_fields(format($$SELECT outbox.enqueue('ring.ids', 'g', 'again'::text, NULL, %L)$$, :'generated'));
SELECT error_code FROM expect_error_fields(format(
    $$INSERT INTO outbox.events (event_id, topic, key, lane, payload) VALUES (%L, 'ring.ids', 'g', outbox.lane_of('g', NULL), 'x')$$,
    :'generated'));
SELECT outbox.enqueue('ring.ids', 'g', 'given'::text, NULL, outbox.event_id('ring-test', 'given')) IS NOT NULL AS given,
       outbox.enqueue('ring.ids', 'g', 'given'::text, NULL, outbox.event_id('ring-test', 'given')) IS NULL AS given_again_is_null;
SELECT caller_event_id, count(*) FROM ring_ids WHERE topic = 'ring.ids' GROUP BY 1 ORDER BY 1;
SELECT * FROM expect_error_fields($$INSERT INTO outbox.events_0 (event_id, topic, key, lane, payload, caller_event_id)
                                    VALUES (outbox.event_id('ring-test', 'says-generated'), 'ring.ids', 'g', outbox.lane_of('g', NULL), 'x', false)$$);
SELECT left(:'generated', 24) || '000000000001' AS marked \gset
INSERT INTO outbox.events_0 (event_id, topic, key, lane, payload) VALUES (:'marked', 'ring.ids', 'g', outbox.lane_of('g', NULL), 'x');
SELECT caller_event_id AS marked_id_left_at_default_reads FROM ring_ids WHERE event_id = :'marked';
SELECT outbox.enqueue('ring.ids', 'g', 'again'::text, NULL, :'marked') IS NULL AS indexed_so_a_duplicate;
SELECT caller_event_id, count(*) FROM ring_ids WHERE topic = 'ring.ids' GROUP BY 1 ORDER BY 1;

-- Setup's state for any file after this one: 0.3.0, no events.
DROP VIEW ring_ids;
DROP FUNCTION public.expect_error_fields(text);
DROP EXTENSION outbox;
SELECT count(*) AS objects_left FROM pg_namespace WHERE nspname = 'outbox';
CREATE EXTENSION outbox VERSION '0.3.0';
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
