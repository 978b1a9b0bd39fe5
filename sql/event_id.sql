-- Deterministic event ids. The expected values were computed by an independent implementation
-- (Python's uuid.uuid5), see docs/sql-api.md (outbox.event_id) and test/vectors/.

-- Plain RFC 9562 version 5: the RFC's own example (DNS namespace, "www.example.com").
SELECT outbox.event_id('6ba7b810-9dad-11d1-80b4-00c04fd430c8'::uuid, 'www.example.com');
SELECT outbox.event_id('6ba7b810-9dad-11d1-80b4-00c04fd430c8'::uuid, 'python.org');
SELECT outbox.event_id('6ba7b811-9dad-11d1-80b4-00c04fd430c8'::uuid, 'https://example.com/ünïcode');

-- outbox.event_id(aggregate, discriminator) under the published namespace
-- d4e3f08c-32f8-4d92-844f-adced4c5bfb1 with name = netstring(aggregate) || netstring(discriminator).
SELECT a, d, outbox.event_id(a, d) AS id, outbox.event_id(a, d) = expected::uuid AS matches
FROM (VALUES
	('invoice-42', 'paid', '5f5149c4-5d91-5747-b479-d84c355ce43d'),
	('a:b', 'c', '14d043ee-2cd9-55e7-afae-539472ceac2b'),
	('a', 'b:c', '67d87e41-9041-5334-8bf6-6e21d72d319a'),
	('', '', '0540b958-46b5-58b0-94ed-45ededcd8016'),
	('Zürich', 'é', 'adb33b4a-6f35-56bf-85a1-4130884e1d2d'),
	('subscription/7', 'renewal:2026-11', '23f504e7-13f0-51d4-b4a0-e9842b35a99b')
) AS v(a, d, expected);

-- It is the v5 of the documented name, so both functions agree.
SELECT outbox.event_id('invoice-42', 'paid')
     = outbox.event_id('d4e3f08c-32f8-4d92-844f-adced4c5bfb1'::uuid, '10:invoice-42,4:paid,') AS recipe_holds;

-- Separators inside the parts cannot collide.
SELECT outbox.event_id('a:b', 'c') <> outbox.event_id('a', 'b:c') AS colon_safe,
       outbox.event_id('a,', 'b') <> outbox.event_id('a', ',b') AS comma_safe,
       outbox.event_id('1:a', '') <> outbox.event_id('', '1:a') AS prefix_safe;

-- Version and variant bits.
SELECT substr(outbox.event_id('x', 'y')::text, 15, 1) AS version,
       substr(outbox.event_id('x', 'y')::text, 20, 1) IN ('8', '9', 'a', 'b') AS variant_ok;

-- Immutable: usable in an index or a generated column.
SELECT provolatile FROM pg_proc WHERE oid = 'outbox.event_id(text, text)'::regprocedure;

-- A replay of the same business operation collapses into one event.
SELECT outbox.enqueue('billing.invoices', 'invoice-42', '{"paid": true}'::jsonb, NULL,
                      outbox.event_id('invoice-42', 'paid')) AS first_time;
SELECT outbox.enqueue('billing.invoices', 'invoice-42', '{"paid": true}'::jsonb, NULL,
                      outbox.event_id('invoice-42', 'paid')) AS replay;
SELECT count(*) FROM outbox.events WHERE event_id = outbox.event_id('invoice-42', 'paid');

-- Bad input.
SELECT * FROM expect_error($$SELECT outbox.event_id(NULL, 'paid')$$);
SELECT * FROM expect_error($$SELECT outbox.event_id('invoice-42', NULL)$$);
SELECT * FROM expect_error($$SELECT outbox.event_id(NULL::uuid, 'name')$$);
SELECT * FROM expect_error($$SELECT outbox.event_id('6ba7b810-9dad-11d1-80b4-00c04fd430c8'::uuid, NULL)$$);
SELECT * FROM expect_error($$SELECT outbox.event_id('not-a-uuid'::uuid, 'name')$$);
