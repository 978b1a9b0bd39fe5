-- The regression suite is of 0.3.0's table, which existing installs keep until they update;
-- ring, the last file, makes the default version (0.4.0's ring) for itself (test/test_ring_*.py
-- test the ring in depth). What it made:
CREATE EXTENSION outbox VERSION '0.3.0';
SELECT extname, extversion, nspname
FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE extname = 'outbox';

SELECT c.relname, c.relkind
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'outbox'
ORDER BY c.relname;

-- The claim path is served by partial indexes over unfinished rows only.
SELECT indexrelid::regclass AS index, pg_get_expr(indpred, indrelid) AS predicate
FROM pg_index WHERE indrelid = 'outbox.events'::regclass AND indpred IS NOT NULL
ORDER BY 1;

\d outbox.events

-- Every function, with its security and pinned search_path.
SELECT p.oid::regprocedure AS function, p.prosecdef AS security_definer, p.proconfig
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'outbox'
ORDER BY p.oid::regprocedure::text;

-- The library refuses to be loaded any other way than shared_preload_libraries: loading it
-- again in a session is a no-op (already loaded), so this is checked by the worker tests.
SHOW shared_preload_libraries;

-- Test helper used by the later files: runs a statement that must fail and shows the SQLSTATE,
-- message, detail and hint (without source line numbers, which would make outputs brittle).
CREATE FUNCTION public.expect_error(statement text)
RETURNS TABLE (error_code text, message text, detail text, hint text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE statement;
	RAISE EXCEPTION 'expected an error from: %', statement;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS error_code = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
	                        detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
	IF message LIKE 'expected an error from:%' THEN
		RAISE;
	END IF;
	RETURN NEXT;
END
$$;
