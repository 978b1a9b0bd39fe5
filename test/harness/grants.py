"""What PUBLIC may do in schema outbox: one query for every test that checks that nothing is
granted to PUBLIC by accident (0.3.0's objects and 0.4.0's ring alike)."""

# (kind, object, privilege) of every right PUBLIC holds on the schema or an object in it.
PUBLIC_GRANTS_SQL = """
    SELECT 'schema', n.nspname, a.privilege_type FROM pg_namespace n, aclexplode(n.nspacl) a
    WHERE n.nspname = 'outbox' AND a.grantee = 0
    UNION ALL
    SELECT 'relation', c.relname, p FROM pg_class c,
           unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p
    WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'f', 'p')
      AND has_table_privilege('public', c.oid, p)
    UNION ALL
    SELECT 'sequence', c.relname, p FROM pg_class c, unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) p
    WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'S' AND has_sequence_privilege('public', c.oid, p)
    UNION ALL
    SELECT 'function', p.oid::regprocedure::text, 'EXECUTE' FROM pg_proc p
    WHERE p.pronamespace = 'outbox'::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE')"""
