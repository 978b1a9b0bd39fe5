-- outbox 0.4.0 -> 0.4.1, the default version (outbox.control): event-id index entries only for
-- the ids callers give (DESIGN.md "The insert-only queue", "Event ids: only a caller's is
-- indexed"). 0.4.0 gave every member row an entry in its member's unique index on event_id,
-- though uniqueness is only asked of an id a caller passes (enqueue's dedup: NULL for a
-- duplicate). An id enqueue generates (the millisecond, outbox's mark, 62 random bits: event_id.hpp)
-- cannot collide in practice, and its entry was a quarter of the WAL the member wrote per event.
--
-- Each member gains caller_event_id: true (the default) for a row whose event_id was given to
-- enqueue by its caller or written by hand (through the view, an INSERT or COPY into a member, a
-- restore of a 0.4.0 dump): unique-checked as before; false only for a row whose id enqueue
-- generated (the stamp trigger refuses false for an id without enqueue's mark). The unique index on event_id becomes a partial one, WHERE caller_event_id, under its
-- old name. Rows already in the members keep true (they have their entries, and stay
-- deduplicated, their generated ids included): no row is
-- rewritten, each member's index is built once more from its caller rows (the update holds the
-- members' ACCESS EXCLUSIVE locks meanwhile: enqueues and the relay's claim wait for it).
-- `CREATE EXTENSION outbox` gives it (through this script, at the end of the update chain), and
-- `ALTER EXTENSION outbox UPDATE` takes a 0.4.0 database to it (docs/upgrading.md "0.4.0 to
-- 0.4.1").

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.4.1'" to load this file. \quit

DO $$
DECLARE
	n int;
BEGIN
	FOR n IN 0..3 LOOP
		-- A constant default: no rewrite (PostgreSQL 11 on), existing rows read true.
		EXECUTE format('ALTER TABLE outbox.events_%s ADD COLUMN caller_event_id boolean NOT NULL DEFAULT true', n);
		EXECUTE format('COMMENT ON COLUMN outbox.events_%s.caller_event_id IS %L', n,
		               'false only for an event_id outbox.enqueue() generated (not deduplicated, not indexed); '
		               'true (the default, e.g. for a row written by hand) for a caller''s: unique in the member');
		EXECUTE format('ALTER TABLE outbox.events_%s DROP CONSTRAINT events_%s_event_id_key', n, n);
		-- enqueue's ON CONFLICT (event_id) WHERE caller_event_id infers it; the dedup probes of the
		-- other members name the predicate too (src/enqueue/ring_dedup.cpp), so they use it.
		EXECUTE format('CREATE UNIQUE INDEX events_%s_event_id_key ON outbox.events_%s (event_id) '
		               'WHERE caller_event_id', n, n);
	END LOOP;
END
$$;
