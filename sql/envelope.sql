-- outbox.enqueue()'s envelope arguments (docs/envelopes.md): an explicit
-- partition, the W3C trace context, CloudEvents. Each bad input is refused with its SQLSTATE and
-- hint, and nothing is inserted.
\set tp '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
\set tp2 '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00'

-- Old calls work as they did and write none of the envelope columns.
SELECT outbox.enqueue('env', 'plain', '{}'::jsonb, NULL, NULL) IS NOT NULL AS five_arguments;
SELECT headers, target_partition, ce_content_type, ce_type, ce_source FROM outbox.events WHERE key = 'plain';

-- Partition: stored, checked against the topic's partition count when published.
SELECT outbox.enqueue('env', 'p', '{}'::jsonb, partition => 2) IS NOT NULL AS with_partition;
SELECT outbox.enqueue('env', NULL, 'x'::text, partition => 0) IS NOT NULL AS unkeyed_with_partition;
SELECT key, target_partition FROM outbox.events WHERE target_partition IS NOT NULL ORDER BY id;

-- Trace context from the arguments: the traceparent and tracestate headers.
SELECT outbox.enqueue('env', 'tp-arg', '{}'::jsonb, '{"h": "v"}', traceparent => :'tp',
                      tracestate => 'congo=t61rcWkgMzE, rojo=00f067aa0ba902b7') IS NOT NULL AS with_trace;
SELECT headers FROM outbox.events WHERE key = 'tp-arg';

-- From the session: set once per transaction (SET LOCAL), gone after it.
BEGIN;
SET LOCAL outbox.traceparent = :'tp';
SET LOCAL outbox.tracestate = 'vendor=value';
SELECT outbox.enqueue('env', 'tp-session', '{}'::jsonb) IS NOT NULL AS from_session;
-- The argument overrides the session's (and takes no tracestate from it).
SELECT outbox.enqueue('env', 'tp-override', '{}'::jsonb, traceparent => :'tp2') IS NOT NULL AS overridden;
-- So do the event's own headers.
SELECT outbox.enqueue('env', 'tp-header', '{}'::jsonb, jsonb_build_object('traceparent', :'tp2')) IS NOT NULL AS own_header;
COMMIT;
SHOW outbox.traceparent;
SELECT outbox.enqueue('env', 'tp-after', '{}'::jsonb) IS NOT NULL AS after_transaction;
SELECT key, headers FROM outbox.events WHERE key LIKE 'tp-%' AND key <> 'tp-arg' ORDER BY id;

-- A later traceparent version may carry more fields.
SELECT outbox.enqueue('env', 'tp-v1', '{}'::jsonb, traceparent => '01' || substr(:'tp', 3) || '-more') IS NOT NULL AS later_version;

-- CloudEvents per event: the content type comes from the payload's type; type and source are
-- optional: the type is then the topic (at publish time), the source outbox.cloudevents_source or
-- /outbox/<database>, stored in the row at enqueue (fixed for the event's life).
SELECT outbox.enqueue('env', 'ce-json', '{"a": 1}'::jsonb, cloudevents => true, event_type => 'invoice.paid',
                      event_source => 'https://billing.example.com/invoices') IS NOT NULL AS cloudevent_json;
SELECT outbox.enqueue('env', 'ce-text', 'hello'::text, cloudevents => true) IS NOT NULL AS cloudevent_text;
SELECT outbox.enqueue('env', 'ce-bytes', '\x00ff'::bytea, cloudevents => true) IS NOT NULL AS cloudevent_bytea;
SELECT outbox.enqueue('env', 'ce-tomb', NULL::jsonb, cloudevents => true) IS NOT NULL AS cloudevent_tombstone;
-- cloudevents => false on a topic that is not listed: a plain record.
SELECT outbox.enqueue('env', 'ce-off', '{}'::jsonb, cloudevents => false) IS NOT NULL AS plain_record;
-- Sources of every URI-reference form java.net.URI parses, and a type beyond ASCII.
SELECT outbox.enqueue('env', 'ce-src-' || n, '{}'::jsonb, cloudevents => true, event_source => source,
                      event_type => 'rechnung.bezahlt.ü') IS NOT NULL AS accepted, source
FROM (VALUES (1, 'urn:billing:invoices'), (2, '/outbox/billing%20eu'), (3, 'https://user@[::1]:8443/a?x=1#f'),
             (4, 'file:///var/outbox'), (5, '../relative/path'), (6, 'tag:example.com,2026:x'),
             (7, 'mailto:billing@example.com'), (8, 'https://[::1]:0065535/x')) AS s (n, source);
-- A header named CE_ID on an event that is no CloudEvent is just a header.
SELECT outbox.enqueue('env', 'ce-plain-header', '{}'::jsonb, '{"CE_ID": "x"}') IS NOT NULL AS plain_with_ce_header;
SELECT key, ce_content_type, ce_type, ce_source FROM outbox.events WHERE key LIKE 'ce-%' ORDER BY id;

-- Bad input: a clear error with its SQLSTATE, and nothing changes.
SELECT count(*) AS before FROM outbox.events \gset
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, partition => -1)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => 'garbage')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => 'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00-00000000000000000000000000000000-b7ad6b7169203331-01')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', tracestate => 'no-equals')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', tracestate => 'Upper=x')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', tracestate => 'k=a,b')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', tracestate => (SELECT string_agg('k' || i || '=v', ',') FROM generate_series(1, 33) i))$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, tracestate => 'vendor=value')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}', traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, '{"traceparent": "nope"}')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, '{"tracestate": "vendor=value"}')$$);
SELECT * FROM expect_error($$SET outbox.traceparent = 'not-a-traceparent'$$);
SELECT * FROM expect_error($$SET outbox.tracestate = '=x'$$);
SHOW outbox.traceparent;
SET outbox.tracestate = 'vendor=value';
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb)$$);
RESET outbox.tracestate;
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => false, event_type => 'x')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, event_source => 'x')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_type => '')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => '')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, '{"ce_type": "x"}', cloudevents => true)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, '{"content-type": "text/xml"}', cloudevents => true)$$);
-- Every attribute must be one the SDKs read (the Java SDK refuses a record whose ce_source
-- java.net.URI cannot parse): a source that is no URI-reference, a type with a control
-- character, a header naming an attribute in another case (SDKs lowercase header names).
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => 'not a uri')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => '/outbox/billing eu')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => 'https://[zz]/x')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => 'https://h/a[b]')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => 'urn:')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => 'http://')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => '1a:b')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => '/a%zz')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => 'a#b#c')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => 'urn:bücher')$$);
-- A port above 65535 (java.net.URI refuses a bracketed host's port beyond 2^31-1).
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => 'https://[::1]:2147483648/x')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_source => 'http://h:65536/')$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_type => E'invoice\npaid')$$);
SELECT error_code, detail FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, cloudevents => true, event_type => E'invoice\u0085paid')$$);
SELECT error_code, message FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, '{"CE_ID": "x"}', cloudevents => true)$$);
SELECT error_code, message FROM expect_error($$SELECT outbox.enqueue('env', 'k', '{}'::jsonb, '{"Content-Type": "text/xml"}', cloudevents => true)$$);
-- The default source setting: refused when set (the GUC machinery's 22023), nothing written.
-- (ALTER SYSTEM cannot run inside expect_error's function: psql shows the error and its code.)
ALTER SYSTEM SET outbox.cloudevents_source = 'not a uri';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.cloudevents_source = 'https://billing.example.com/out box';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.cloudevents_source = 'https://[zz]/outbox';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.cloudevents_source = 'https://[::1]:2147483648/outbox';
\echo :LAST_ERROR_SQLSTATE
-- The envelope counts toward outbox.max_payload_bytes.
SET outbox.max_payload_bytes = 200;
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', repeat('x', 150), cloudevents => true)$$);
SELECT * FROM expect_error($$SELECT outbox.enqueue('env', 'k', repeat('x', 150), traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')$$);
SELECT count(*) - :before AS added_by_bad_input FROM outbox.events;
SELECT outbox.enqueue('env', 'fits', repeat('x', 150)) IS NOT NULL AS plain_fits;
RESET outbox.max_payload_bytes;
SELECT count(*) AS before FROM outbox.events \gset

-- The table refuses envelope columns the relay could not publish, for rows written by hand.
SELECT error_code, message FROM expect_error($$INSERT INTO outbox.events (event_id, topic, key, lane, payload, target_partition) VALUES ('a7c0f2a6-0000-4000-8000-0000000000e1', 't', 'k', outbox.lane_of('k', NULL), '\x00', -1)$$);
SELECT error_code, message FROM expect_error($$INSERT INTO outbox.events (event_id, topic, key, lane, payload, ce_type) VALUES ('a7c0f2a6-0000-4000-8000-0000000000e1', 't', 'k', outbox.lane_of('k', NULL), '\x00', 'orphan')$$);
SELECT error_code, message FROM expect_error($$INSERT INTO outbox.events (event_id, topic, key, lane, payload, ce_content_type, ce_type) VALUES ('a7c0f2a6-0000-4000-8000-0000000000e1', 't', 'k', outbox.lane_of('k', NULL), '\x00', 'application/json', '')$$);
SELECT error_code, message FROM expect_error($$INSERT INTO outbox.events (event_id, topic, key, lane, payload, headers, ce_content_type) VALUES ('a7c0f2a6-0000-4000-8000-0000000000e1', 't', 'k', outbox.lane_of('k', NULL), '\x00', '{"ce_id": "x"}', 'application/json')$$);
SELECT count(*) - :before AS added_by_bad_rows FROM outbox.events;
DELETE FROM outbox.events WHERE topic = 'env';
