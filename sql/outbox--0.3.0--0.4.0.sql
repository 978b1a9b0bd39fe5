-- outbox 0.3.0 -> 0.4.0, the default version (outbox.control): the insert-only queue's tables
-- (DESIGN.md "The insert-only queue: the protocol to build", build step 2). Events go into a ring
-- of generation tables, outbox.events_0 .. events_3, that are only ever INSERTed into (the
-- commit-order re-stamp, which only raises order_lsn, is the one UPDATE); where an event landed
-- goes into outbox.landed, what waits, failed or was passed unpublished into outbox.event_state,
-- and each relay slot's position into outbox.cursors. outbox.events becomes a view with 0.3.0's
-- columns. Retention rotates the current member along the ring and empties sealed members with
-- TRUNCATE (outbox.ring_retention()); a cursor row keeps its slot's holes (open writers it
-- passed); cursors of another system (a restored dump, pg_upgrade) are re-based by the relay's
-- claim (outbox.ring_rebase()). Not built in this version: a re-base on a changed outbox.workers
-- (a new worker count's slots start at the lowest old cursor, so events between it and a lane's
-- own old cursor are sent again: duplicates, never a loss; kCursorCreateSql in
-- src/relay/ring_claim.cpp).
-- `CREATE EXTENSION outbox` gives it (through this script, at the end of the update chain), and
-- `ALTER EXTENSION outbox UPDATE` takes a 0.3.0 database to it (docs/upgrading.md "0.3.0 to
-- 0.4.0").

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.4.0'" to load this file. \quit

-- The update moves every committed event into the new tables, reading them with its statements'
-- snapshots. At REPEATABLE READ or SERIALIZABLE that is one snapshot, taken before the lock
-- below is granted: an event committed while the update waited for it would be left behind in
-- member 0, below ring_start, where no relay cursor looks (never sent). Refused there, before
-- anything changes (a new install has no other writer: outbox--0.1.0.sql says so with an internal
-- setting, outbox_install.new, that nobody else is to set). READ UNCOMMITTED runs as READ
-- COMMITTED in PostgreSQL: a snapshot per statement.
DO $$
BEGIN
	IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable')
	   AND pg_catalog.current_setting('outbox_install.new', true) IS DISTINCT FROM 'on' THEN
		RAISE EXCEPTION 'ALTER EXTENSION outbox UPDATE to 0.4.0 must run at READ COMMITTED, not %',
			pg_catalog.upper(pg_catalog.current_setting('transaction_isolation'))
			USING ERRCODE = 'feature_not_supported',
			      DETAIL = 'It moves the events committed before it into the new tables, and at this '
			               'isolation level it would not see those committed while it waited for its lock '
			               'on outbox.events.',
			      HINT = 'Run BEGIN ISOLATION LEVEL READ COMMITTED; ALTER EXTENSION outbox UPDATE; COMMIT; '
			             '(or SET default_transaction_isolation = ''read committed'' in the session first).';
	END IF;
END
$$;

-- Nothing enqueues until the update commits, and every enqueue already under way has ended,
-- before the ids given so far are read (below): an enqueue that held the table from before the
-- update, or reached it between that read and the first ALTER TABLE, would otherwise draw an id
-- the new sequence gives a second time, and two rows of one id share one landed row (one of
-- them recorded as published and never sent). The lock the ALTER TABLEs below take anyway.
LOCK TABLE outbox.events IN ACCESS EXCLUSIVE MODE;

-- ---------------------------------------------------------------------------------------------
-- What 0.3.0's table carried that the new objects take over, read before anything changes: the
-- rights on outbox.events (its own and per column; they go to the view of that name), and the
-- identity's position. (Kept for the transaction in settings of a prefix of its own: nothing is
-- left behind.)
-- ---------------------------------------------------------------------------------------------
SELECT pg_catalog.set_config('outbox_upgrade.events_acl', coalesce(pg_catalog.jsonb_agg(g)::text, '[]'), true)
FROM (SELECT NULL::text AS column_name, a.privilege_type AS privilege,
             CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee, a.is_grantable
      FROM pg_catalog.pg_class c, LATERAL pg_catalog.aclexplode(c.relacl) a
      WHERE c.oid = 'outbox.events'::pg_catalog.regclass AND a.grantee <> c.relowner
      UNION ALL
      SELECT t.attname::text, a.privilege_type,
             CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END, a.is_grantable
      FROM pg_catalog.pg_attribute t, pg_catalog.pg_class c, LATERAL pg_catalog.aclexplode(t.attacl) a
      WHERE t.attrelid = 'outbox.events'::pg_catalog.regclass AND c.oid = t.attrelid AND t.attnum > 0
        AND NOT t.attisdropped AND a.grantee <> c.relowner) g;

SELECT pg_catalog.set_config('outbox_upgrade.next_id',
                             (SELECT pg_catalog.max(x)::text
                              FROM (SELECT pg_catalog.max(e.id) AS x FROM outbox.events e
                                    UNION ALL
                                    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
                                    FROM outbox.events_id_seq s) m),
                             true);

-- ---------------------------------------------------------------------------------------------
-- The first ring member is 0.3.0's table. Its outcome columns move out (below) and are dropped;
-- its rows stay where they are (no rewrite).
-- ---------------------------------------------------------------------------------------------
ALTER TABLE outbox.events RENAME TO events_0;
COMMENT ON TABLE outbox.events_0 IS
	'Ring member 0 of the outbox queue (insert-only); read outbox.events, write with outbox.enqueue()';

-- Where 0.3.0 published rows landed: one landed row each. A published row written by hand
-- without a partition or offset keeps -1 there (landed's columns are NOT NULL; Kafka's are never
-- negative), which outbox.events shows as NULL again.
CREATE TABLE outbox.landed (
	member          smallint    NOT NULL,
	topic           text        NOT NULL,
	kafka_partition integer     NOT NULL,
	first_offset    bigint      NOT NULL,
	-- ids[k] (k from 1) landed at first_offset + k - 1.
	ids             bigint[]    NOT NULL,
	published_at    timestamptz NOT NULL
);
COMMENT ON TABLE outbox.landed IS
	'Where events landed: per batch, member, topic and partition, the ids in offset order from first_offset';

INSERT INTO outbox.landed (member, topic, kafka_partition, first_offset, ids, published_at)
SELECT 0, e.topic, coalesce(e.kafka_partition, -1), coalesce(e.kafka_offset, -1), ARRAY[e.id], e.published_at
FROM outbox.events_0 e
WHERE e.status = 'published'
ORDER BY e.id;

-- A copy of every event that waits for a retry, failed, was quarantined or was passed by a
-- cursor unpublished, with its attempts; the relay deletes the row when it publishes the event.
-- 'discarded': a failed event given up (a DELETE of it from outbox.events, README's runbook):
-- never published, shown nowhere, holding no key; the row hides its member row from the view
-- and goes when the retention empties that member.
CREATE TABLE outbox.event_state (
	id               bigint      PRIMARY KEY,
	member           smallint    NOT NULL,
	event_id         uuid        NOT NULL,
	topic            text        NOT NULL,
	key              text,
	lane             smallint    NOT NULL,
	payload          bytea,
	headers          jsonb,
	created_at       timestamptz NOT NULL,
	order_lsn        pg_lsn      NOT NULL,
	-- The member row's own stamp (order_lsn until a re-base renumbers that): the view finds the
	-- member row by (member_lsn, id), its member's order index.
	member_lsn       pg_lsn      NOT NULL,
	writer           xid8        NOT NULL,
	target_partition integer,
	ce_content_type  text,
	ce_type          text,
	ce_source        text,
	status           text        NOT NULL,
	attempts         integer     NOT NULL DEFAULT 0,
	next_attempt_at  timestamptz,
	last_error       text,
	CONSTRAINT event_state_status_check CHECK (status IN ('pending', 'failed', 'discarded')),
	CONSTRAINT event_state_attempts_check CHECK (attempts BETWEEN 0 AND 1000000)
);
CREATE INDEX event_state_lane_idx ON outbox.event_state (lane, order_lsn, id);
CREATE INDEX event_state_key_idx ON outbox.event_state (topic, key, order_lsn, id);
-- outbox.retry(event_id), and enqueue's dedup of a caller's id: an event whose member was
-- emptied while it still waits or failed is known by its event_state row alone.
CREATE INDEX event_state_event_id_idx ON outbox.event_state (event_id);
COMMENT ON TABLE outbox.event_state IS
	'Events waiting for a retry, failed (see outbox.retry()) or held behind an earlier event of their key';

-- Every 0.3.0 row not published: failed ones stay failed, the others are pending (an orphaned
-- in_flight row of a 0.1.0 relay too), with their attempts, their retry time (NULL: due now) and
-- last error. 0.3.0's rows had no writer: 0.
INSERT INTO outbox.event_state (id, member, event_id, topic, key, lane, payload, headers, created_at, order_lsn,
                                member_lsn, writer, target_partition, ce_content_type, ce_type, ce_source,
                                status, attempts, next_attempt_at, last_error)
SELECT e.id, 0, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at, e.order_lsn,
       e.order_lsn, '0', e.target_partition, e.ce_content_type, e.ce_type, e.ce_source,
       CASE WHEN e.status = 'failed' THEN 'failed' ELSE 'pending' END, e.attempts, e.next_attempt_at, e.last_error
FROM outbox.events_0 e
WHERE e.status <> 'published';

-- ---------------------------------------------------------------------------------------------
-- Monitoring and retries on the tables, before the columns they read go. Same names, columns and
-- results as 0.3.0's.
-- ---------------------------------------------------------------------------------------------

-- The events, as 0.3.0's table showed them (same columns, names and order). status: the
-- event_state row's, else 'published' when a landed row names the event, else 'pending'.
-- published_at, kafka_partition and kafka_offset from landed; attempts, next_attempt_at and
-- last_error from event_state; claimed_at is NULL (nothing is claimed by a lease any more).
-- It reads every member and every landed row: a view for people and retries, not for the
-- relay. INSERT goes into the current member (rows written by hand); UPDATE corrects a failed
-- event's copy in event_state and DELETE gives a failed event up; any other UPDATE or DELETE is
-- refused (triggers below). Where an event has an event_state row, its content columns are the
-- copy's (what the relay publishes).
CREATE VIEW outbox.events AS
SELECT m.id, m.event_id, m.topic, m.key, m.lane, m.payload, m.headers,
       CASE WHEN s.id IS NOT NULL THEN s.status WHEN p.id IS NOT NULL THEN 'published' ELSE 'pending' END AS status,
       coalesce(s.attempts, 0) AS attempts,
       s.next_attempt_at,
       s.last_error,
       m.created_at,
       NULL::timestamptz AS claimed_at,
       CASE WHEN s.id IS NULL THEN p.published_at END AS published_at,
       CASE WHEN s.id IS NULL THEN p.kafka_partition END AS kafka_partition,
       CASE WHEN s.id IS NULL THEN p.kafka_offset END AS kafka_offset,
       m.order_lsn, m.target_partition, m.ce_content_type, m.ce_type, m.ce_source
FROM (SELECT 0::smallint AS member, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at,
             e.order_lsn, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
      FROM outbox.events_0 e) m
LEFT JOIN outbox.event_state s ON s.id = m.id
LEFT JOIN (SELECT DISTINCT ON (l.member, u.id) l.member, u.id,
                  nullif(l.kafka_partition, -1) AS kafka_partition,
                  CASE WHEN l.first_offset >= 0 THEN l.first_offset + u.k - 1 END AS kafka_offset,
                  l.published_at
           FROM outbox.landed l, pg_catalog.unnest(l.ids) WITH ORDINALITY AS u(id, k)
           ORDER BY l.member, u.id, l.published_at) p
       ON p.member = m.member AND p.id = m.id;
-- (The members 1 to 3 join the view once they exist, below.)

CREATE OR REPLACE VIEW outbox.backlog AS
SELECT topic,
       count(*) FILTER (WHERE status = 'pending')   AS pending,
       count(*) FILTER (WHERE status = 'in_flight') AS in_flight,
       count(*) FILTER (WHERE status = 'failed')    AS failed,
       count(*) FILTER (WHERE status = 'published') AS published,
       now() - min(created_at) FILTER (WHERE status IN ('pending', 'in_flight'))
           AS oldest_pending_age
FROM outbox.events
GROUP BY topic;

CREATE OR REPLACE VIEW outbox.failed AS
SELECT event_id, topic, key, attempts, last_error, created_at
FROM outbox.event_state
WHERE status = 'failed';

-- ---------------------------------------------------------------------------------------------
-- The member's shape: 0.3.0's outcome columns go (they are in landed and event_state now) with
-- their indexes and the row check that read them; id becomes a plain bigint drawn from a
-- sequence every member shares; writer (the inserting top-level transaction) is new.
-- ---------------------------------------------------------------------------------------------
DROP INDEX outbox.events_pending_idx;
DROP INDEX outbox.events_waiting_idx;
DROP INDEX outbox.events_in_flight_idx;
DROP INDEX outbox.events_published_idx;
ALTER TABLE outbox.events_0
	DROP CONSTRAINT events_row_check,
	DROP CONSTRAINT events_pkey,
	DROP COLUMN status,
	DROP COLUMN attempts,
	DROP COLUMN next_attempt_at,
	DROP COLUMN last_error,
	DROP COLUMN claimed_at,
	DROP COLUMN published_at,
	DROP COLUMN kafka_partition,
	DROP COLUMN kafka_offset;
ALTER TABLE outbox.events_0 RENAME CONSTRAINT events_event_id_key TO events_0_event_id_key;

-- The identity's sequence (outbox.events_id_seq) goes with the identity; a plain sequence of the
-- same name follows it, above every id given so far.
ALTER EXTENSION outbox DROP SEQUENCE outbox.events_id_seq;
ALTER TABLE outbox.events_0 ALTER COLUMN id DROP IDENTITY;
CREATE SEQUENCE outbox.events_id_seq AS bigint;
SELECT pg_catalog.setval('outbox.events_id_seq',
                         greatest(coalesce(current_setting('outbox_upgrade.next_id')::bigint, 0), 0) + 1, false);
ALTER TABLE outbox.events_0
	ALTER COLUMN id SET NOT NULL,
	ALTER COLUMN id SET DEFAULT pg_catalog.nextval('outbox.events_id_seq'),
	-- The stamp trigger sets it (a default would hide a row that bypassed the trigger).
	ALTER COLUMN order_lsn DROP DEFAULT,
	ADD COLUMN writer xid8 NOT NULL DEFAULT '0';
ALTER TABLE outbox.events_0 ALTER COLUMN writer DROP DEFAULT;
SELECT pg_catalog.set_config('outbox_upgrade.next_id', '', true);

-- The other members: the same columns in the same order (events_0's physical order may differ:
-- it keeps its dropped columns; every statement names columns).
CREATE TABLE outbox.events_1 (
	id               bigint      NOT NULL DEFAULT pg_catalog.nextval('outbox.events_id_seq'),
	event_id         uuid        NOT NULL,
	topic            text        NOT NULL,
	key              text,
	lane             smallint    NOT NULL,
	payload          bytea,
	headers          jsonb,
	created_at       timestamptz NOT NULL DEFAULT now(),
	order_lsn        pg_lsn      NOT NULL,
	writer           xid8        NOT NULL,
	target_partition integer,
	ce_content_type  text,
	ce_type          text,
	ce_source        text
);
CREATE TABLE outbox.events_2 (LIKE outbox.events_1 INCLUDING DEFAULTS);
CREATE TABLE outbox.events_3 (LIKE outbox.events_1 INCLUDING DEFAULTS);

-- Per member: the claim's index, dedup of event ids, the stamp and the guard. The stamp trigger
-- also holds every new row to the row rules (0.3.0's events_row_check, the same C code, with what
-- a member row always is: pending, no outcome) instead of a CHECK, whose expression PostgreSQL
-- would parse again at every statement. events_0's rows passed the same rules under 0.3.0's
-- check (dropped above); the guard lets no UPDATE through but the re-stamp's raise of order_lsn.
CREATE FUNCTION outbox.generation_stamp()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_generation_stamp'
LANGUAGE C VOLATILE;

-- Refuses UPDATE and DELETE of a member row (and TRUNCATE of a member): the queue is insert-only.
-- The one exception is the commit-order re-stamp of the extension's own commit path, which may
-- only raise order_lsn (src/enqueue/generation_guard.cpp).
CREATE FUNCTION outbox.generation_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_generation_guard'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION outbox.generation_stamp(), outbox.generation_guard() FROM PUBLIC;

DO $$
DECLARE
	n int;
BEGIN
	FOR n IN 0..3 LOOP
		EXECUTE format('CREATE INDEX events_%s_order_idx ON outbox.events_%s (order_lsn, id)', n, n);
		IF n > 0 THEN
			EXECUTE format('ALTER TABLE outbox.events_%s ADD CONSTRAINT events_%s_event_id_key UNIQUE (event_id)', n, n);
		END IF;
		-- "~" sorts after letters: the stamp is the last BEFORE INSERT trigger, the guard the last
		-- BEFORE UPDATE/DELETE one (it sees the row as the other triggers left it).
		EXECUTE format('CREATE TRIGGER "~outbox_stamp" BEFORE INSERT ON outbox.events_%s '
		               'FOR EACH ROW EXECUTE FUNCTION outbox.generation_stamp()', n);
		EXECUTE format('CREATE TRIGGER "~outbox_guard" BEFORE UPDATE OR DELETE ON outbox.events_%s '
		               'FOR EACH ROW EXECUTE FUNCTION outbox.generation_guard()', n);
		EXECUTE format('CREATE TRIGGER "~outbox_guard_truncate" BEFORE TRUNCATE ON outbox.events_%s '
		               'FOR EACH STATEMENT EXECUTE FUNCTION outbox.generation_guard()', n);
		-- Also under session_replication_role = replica (a restore, logical replication).
		EXECUTE format('ALTER TABLE outbox.events_%s ENABLE ALWAYS TRIGGER "~outbox_stamp", '
		               'ENABLE ALWAYS TRIGGER "~outbox_guard", ENABLE ALWAYS TRIGGER "~outbox_guard_truncate"', n);
		IF n > 0 THEN
			EXECUTE format('COMMENT ON TABLE outbox.events_%s IS %L', n,
			               format('Ring member %s of the outbox queue (insert-only); read outbox.events, write with outbox.enqueue()', n));
		END IF;
	END LOOP;
END
$$;

-- The view over every member.
CREATE OR REPLACE VIEW outbox.events AS
SELECT m.id, m.event_id, m.topic, m.key, m.lane,
       CASE WHEN s.id IS NOT NULL THEN s.payload ELSE m.payload END AS payload,
       CASE WHEN s.id IS NOT NULL THEN s.headers ELSE m.headers END AS headers,
       CASE WHEN s.id IS NOT NULL THEN s.status WHEN p.id IS NOT NULL THEN 'published' ELSE 'pending' END AS status,
       coalesce(s.attempts, 0) AS attempts,
       s.next_attempt_at,
       s.last_error,
       m.created_at,
       NULL::timestamptz AS claimed_at,
       CASE WHEN s.id IS NULL THEN p.published_at END AS published_at,
       CASE WHEN s.id IS NULL THEN p.kafka_partition END AS kafka_partition,
       CASE WHEN s.id IS NULL THEN p.kafka_offset END AS kafka_offset,
       m.order_lsn,
       CASE WHEN s.id IS NOT NULL THEN s.target_partition ELSE m.target_partition END AS target_partition,
       CASE WHEN s.id IS NOT NULL THEN s.ce_content_type ELSE m.ce_content_type END AS ce_content_type,
       CASE WHEN s.id IS NOT NULL THEN s.ce_type ELSE m.ce_type END AS ce_type,
       CASE WHEN s.id IS NOT NULL THEN s.ce_source ELSE m.ce_source END AS ce_source
FROM (SELECT 0::smallint AS member, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at,
             e.order_lsn, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
      FROM outbox.events_0 e
      UNION ALL
      SELECT 1::smallint, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at,
             e.order_lsn, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
      FROM outbox.events_1 e
      UNION ALL
      SELECT 2::smallint, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at,
             e.order_lsn, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
      FROM outbox.events_2 e
      UNION ALL
      SELECT 3::smallint, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at,
             e.order_lsn, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
      FROM outbox.events_3 e) m
LEFT JOIN outbox.event_state s ON s.id = m.id
LEFT JOIN (SELECT DISTINCT ON (l.member, u.id) l.member, u.id,
                  nullif(l.kafka_partition, -1) AS kafka_partition,
                  CASE WHEN l.first_offset >= 0 THEN l.first_offset + u.k - 1 END AS kafka_offset,
                  l.published_at
           FROM outbox.landed l, pg_catalog.unnest(l.ids) WITH ORDINALITY AS u(id, k)
           ORDER BY l.member, u.id, l.published_at) p
       ON p.member = m.member AND p.id = m.id
WHERE s.status IS DISTINCT FROM 'discarded'
-- An event whose member was emptied by the retention (outbox.ring_retention()) while it still
-- waits for a retry or is failed: its event_state row is a whole copy, shown on its own. (Matched
-- by member_lsn, the member row's stamp, not order_lsn, which a re-base renumbers
-- (outbox.ring_rebase()): a probe of the member's order index.)
UNION ALL
SELECT s.id, s.event_id, s.topic, s.key, s.lane, s.payload, s.headers, s.status, s.attempts, s.next_attempt_at,
       s.last_error, s.created_at, NULL::timestamptz, NULL::timestamptz, NULL::integer, NULL::bigint,
       s.order_lsn, s.target_partition, s.ce_content_type, s.ce_type, s.ce_source
FROM outbox.event_state s
WHERE s.status <> 'discarded'
  AND NOT EXISTS (SELECT 1
                  FROM (SELECT 0::smallint AS member, e.order_lsn, e.id FROM outbox.events_0 e
                        UNION ALL SELECT 1::smallint, e.order_lsn, e.id FROM outbox.events_1 e
                        UNION ALL SELECT 2::smallint, e.order_lsn, e.id FROM outbox.events_2 e
                        UNION ALL SELECT 3::smallint, e.order_lsn, e.id FROM outbox.events_3 e) k
                  WHERE k.member = s.member AND (k.order_lsn, k.id) = (s.member_lsn, s.id));

COMMENT ON VIEW outbox.events IS
	'Outbox events (every ring member, with their status); write with outbox.enqueue(), watch with outbox.backlog and outbox.failed';

-- ---------------------------------------------------------------------------------------------
-- The ring, the relay's cursors, and where the cursors start.
-- ---------------------------------------------------------------------------------------------
-- A member is current (enqueue writes into it; opened_at: since when), sealed (it was current
-- until sealed_at; its retention counts from there) or free (both NULL: emptied, next in line).
-- outbox.ring_retention() moves the current pointer and empties sealed members.
CREATE TABLE outbox.ring (
	member     smallint PRIMARY KEY,
	is_current boolean     NOT NULL,
	opened_at  timestamptz,
	sealed_at  timestamptz
);
COMMENT ON TABLE outbox.ring IS
	'The ring of generation tables outbox.events_0 .. events_3: which one enqueue writes (is_current), which are sealed';
INSERT INTO outbox.ring (member, is_current, opened_at, sealed_at)
VALUES (0, true, now(), NULL), (1, false, NULL, NULL), (2, false, NULL, NULL), (3, false, NULL, NULL);
-- Every change of the ring's rows invalidates its relcache entry in every backend at commit, so
-- that enqueue can keep the current member between transactions and still see a rotation at the
-- next call (queue_target.cpp). ALWAYS: session_replication_role = replica must not skip it.
CREATE FUNCTION outbox.ring_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_ring_changed'
LANGUAGE C;
REVOKE ALL ON FUNCTION outbox.ring_changed() FROM PUBLIC;
CREATE TRIGGER ring_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON outbox.ring
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.ring_changed();
ALTER TABLE outbox.ring ENABLE ALWAYS TRIGGER ring_changed;

-- Slot `worker` of `n_workers` has passed every member row with (order_lsn, id) at or below its
-- (order_lsn, id). The relay creates a slot's row when missing, at (outbox.ring_start, 0).
CREATE TABLE outbox.cursors (
	n_workers         integer,
	worker            integer,
	order_lsn         pg_lsn      NOT NULL,
	id                bigint      NOT NULL,
	system_identifier bigint      NOT NULL,
	updated_at        timestamptz NOT NULL,
	-- The slot's holes: open writers the cursor passed (the top-level xid, its lowest stamp) and
	-- how far the walk of a committed one got ((order_lsn, id); '0/0', 0: not begun).
	hole_xids         xid8[]      NOT NULL DEFAULT '{}',
	hole_froms        pg_lsn[]    NOT NULL DEFAULT '{}',
	hole_walked_lsns  pg_lsn[]    NOT NULL DEFAULT '{}',
	hole_walked_ids   bigint[]    NOT NULL DEFAULT '{}',
	PRIMARY KEY (n_workers, worker),
	-- The shape a relay writes (outbox.workers is far below 1024): a row of another shape, by hand,
	-- is refused rather than read by the retention's floor (ring_retention_sql.cpp).
	CONSTRAINT cursors_slot_check CHECK (n_workers BETWEEN 1 AND 1024 AND worker >= 0 AND worker < n_workers),
	CHECK (cardinality(hole_froms) = cardinality(hole_xids) AND cardinality(hole_walked_lsns) = cardinality(hole_xids)
	       AND cardinality(hole_walked_ids) = cardinality(hole_xids))
);
COMMENT ON TABLE outbox.cursors IS
	'Relay slots (worker of n_workers): the (order_lsn, id) position each has passed in the ring, and its holes (open writers passed)';

-- One row: the WAL insert position at the end of this script. Member rows below it were handled
-- here (the pending ones are in event_state, the published ones in landed): no cursor walks them.
CREATE TABLE outbox.ring_start (
	order_lsn pg_lsn NOT NULL
);
COMMENT ON TABLE outbox.ring_start IS
	'Where the relay cursors start: member rows below it were moved into event_state or landed by the upgrade';

-- ---------------------------------------------------------------------------------------------
-- The view's writes. INSERT: a row written by hand goes into the current member, pending (its
-- outcome columns must be left out); COPY into the view works the same way. INSERT ... ON
-- CONFLICT on the view is not supported (docs/upgrading.md). UPDATE and DELETE: of failed
-- events only (README's runbook), below; the rest refused.
-- SECURITY DEFINER: the rights asked are the view's (INSERT, UPDATE, DELETE on outbox.events,
-- checked by PostgreSQL for the caller before a trigger fires), never the member's.
-- ---------------------------------------------------------------------------------------------
-- Whether an event with this id is kept in the ring (a member or event_state), read with the
-- latest snapshot; 40001 when this transaction's snapshot predates it (ring_dedup.cpp).
CREATE FUNCTION outbox.ring_keeps_event_id(event_id uuid)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_ring_keeps_event_id'
LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION outbox.ring_keeps_event_id(uuid) FROM PUBLIC;

-- The member this transaction's events go into, as enqueue decides it (queue_target_sql.cpp).
CREATE FUNCTION outbox.current_ring_member()
RETURNS smallint
AS 'MODULE_PATHNAME', 'outbox_current_ring_member'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION outbox.current_ring_member() FROM PUBLIC;

CREATE FUNCTION outbox.events_insert()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	current_member smallint;
BEGIN
	IF NEW.id IS NOT NULL THEN
		RAISE EXCEPTION 'cannot insert a value into column "id" of outbox.events'
			USING ERRCODE = 'generated_always',
			      DETAIL = 'Event ids are drawn from outbox.events_id_seq.',
			      HINT = 'Leave id out of the column list.';
	END IF;
	IF coalesce(NEW.status, 'pending') <> 'pending' OR coalesce(NEW.attempts, 0) <> 0
	   OR NEW.next_attempt_at IS NOT NULL OR NEW.last_error IS NOT NULL OR NEW.claimed_at IS NOT NULL
	   OR NEW.published_at IS NOT NULL OR NEW.kafka_partition IS NOT NULL OR NEW.kafka_offset IS NOT NULL THEN
		RAISE EXCEPTION 'a row inserted into outbox.events is a pending event'
			USING ERRCODE = 'feature_not_supported',
			      DETAIL = 'status, attempts, next_attempt_at, last_error, claimed_at, published_at, kafka_partition '
			               'and kafka_offset are the relay''s; on 0.4.0 they are not stored in the event.',
			      HINT = 'Leave those columns out of the column list (or NULL, status ''pending'', attempts 0).';
	END IF;
	current_member := outbox.current_ring_member();
	-- One event per event_id, as 0.3.0's unique index had it: every member and event_state are
	-- probed with the latest snapshot (40001 when this transaction's snapshot predates the row).
	IF outbox.ring_keeps_event_id(NEW.event_id) THEN
		RAISE EXCEPTION 'an outbox event with event_id % exists already', NEW.event_id
			USING ERRCODE = 'unique_violation',
			      HINT = 'outbox.enqueue() with a caller''s event_id returns NULL for a duplicate instead.';
	END IF;
	-- order_lsn and writer: the member's stamp trigger sets them, whatever the row said.
	EXECUTE format('INSERT INTO outbox.%I (event_id, topic, key, lane, payload, headers, created_at, '
	               'target_partition, ce_content_type, ce_type, ce_source) '
	               'VALUES ($1, $2, $3, $4, $5, $6, coalesce($7, pg_catalog.now()), $8, $9, $10, $11) '
	               'RETURNING id, created_at, order_lsn', 'events_' || current_member)
	INTO NEW.id, NEW.created_at, NEW.order_lsn
	USING NEW.event_id, NEW.topic, NEW.key, NEW.lane, NEW.payload, NEW.headers, NEW.created_at,
	      NEW.target_partition, NEW.ce_content_type, NEW.ce_type, NEW.ce_source;
	NEW.status := 'pending';
	NEW.attempts := 0;
	RETURN NEW;
END
$$;

-- The refusal of an UPDATE or DELETE of an event that is not failed (the statement is refused
-- whole: a row trigger's error ends it, and what it did to earlier rows is rolled back).
CREATE FUNCTION outbox.events_refuse(op text, event_id uuid, status text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RAISE EXCEPTION 'cannot % outbox.events: event % is %, and its events are insert-only', op, event_id, status
		USING ERRCODE = 'object_not_in_prerequisite_state',
		      DETAIL = 'On 0.4.0 outbox.events is a view over the ring of generation tables, which are never updated '
		               'or deleted from; only a failed event (outbox.failed) can be corrected (UPDATE) or given up '
		               '(DELETE), and a statement that matches any other event changes nothing.',
		      HINT = 'outbox.retry() and outbox.retry_failed() put failed events back; outbox.purge() is the retention.';
END
$$;

-- DELETE of a failed event: it is given up, as 0.3.0's DELETE of its row did. Its event_state row
-- becomes 'discarded': the claim never takes it and it holds no key (its key's later events go,
-- in order), outbox.events, failed, backlog and topic_metrics no longer show it, retry() no
-- longer finds it; the row hides the event's member row (insert-only, kept) from the view until
-- the retention empties that member, and goes with it (truncate_ring_member()). Whose member
-- was emptied already has no member row to hide: its row goes at once (its event id is free
-- again, as after 0.3.0's DELETE). Reading the member holds off its TRUNCATE until this commits.
CREATE FUNCTION outbox.events_delete()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	s record;
	member_row boolean;
BEGIN
	IF OLD.status IS DISTINCT FROM 'failed' THEN
		PERFORM outbox.events_refuse(TG_OP, OLD.event_id, OLD.status);
	END IF;
	SELECT e.member INTO s FROM outbox.event_state e
	WHERE e.id = OLD.id AND e.status = 'failed'
	FOR UPDATE;
	IF NOT FOUND THEN
		-- Given up already (by another session, or by this statement: between a restore and its
		-- re-base the view may show an event_state event twice, its member_lsn still the dump's):
		-- nothing left to do. Retried since the statement's snapshot: refused.
		IF EXISTS (SELECT FROM outbox.event_state e WHERE e.id = OLD.id AND e.status = 'discarded') THEN
			RETURN NULL;
		END IF;
		PERFORM outbox.events_refuse(TG_OP, OLD.event_id, 'no longer failed');
	END IF;
	-- By id alone (a scan of the member: an operator's statement, not the hot path): after a
	-- restore the member row has the restore's stamp and event_state keeps the dump's (renumbered
	-- by a re-base), and a row thought gone would be deleted here and its member row be pending
	-- again, sent by the next re-base.
	EXECUTE format('SELECT EXISTS (SELECT FROM outbox.%I e WHERE e.id = $1)', 'events_' || s.member)
	INTO member_row
	USING OLD.id;
	IF member_row THEN
		UPDATE outbox.event_state e SET status = 'discarded' WHERE e.id = OLD.id;
	ELSE
		DELETE FROM outbox.event_state e WHERE e.id = OLD.id;
	END IF;
	-- Its key's held events are due now.
	PERFORM outbox.wake_relay_at_commit();
	RETURN OLD;
END
$$;

-- UPDATE of a failed event: corrects the copy the relay publishes (its event_state row) in the
-- columns README's runbook corrects, checked by the rules of a member row (the same C check as
-- the members' CHECK and 0.3.0's table; SQLSTATE 23514). The other columns are the event's
-- identity, place in its key's order and lane, or the relay's outcome: refused (the status goes
-- back to pending through outbox.retry()). The member row is not written; once the relay has
-- published the corrected copy, outbox.events shows the member's row again.
CREATE FUNCTION outbox.events_update()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	changed text;
BEGIN
	IF OLD.status IS DISTINCT FROM 'failed' THEN
		PERFORM outbox.events_refuse(TG_OP, OLD.event_id, OLD.status);
	END IF;
	SELECT pg_catalog.string_agg(c.name, ', ' ORDER BY c.n) INTO changed
	FROM (VALUES (1, 'id', OLD.id IS DISTINCT FROM NEW.id),
	             (2, 'event_id', OLD.event_id IS DISTINCT FROM NEW.event_id),
	             (3, 'topic', OLD.topic IS DISTINCT FROM NEW.topic),
	             (4, 'key', OLD.key IS DISTINCT FROM NEW.key),
	             (5, 'lane', OLD.lane IS DISTINCT FROM NEW.lane),
	             (6, 'status', OLD.status IS DISTINCT FROM NEW.status),
	             (7, 'attempts', OLD.attempts IS DISTINCT FROM NEW.attempts),
	             (8, 'next_attempt_at', OLD.next_attempt_at IS DISTINCT FROM NEW.next_attempt_at),
	             (9, 'last_error', OLD.last_error IS DISTINCT FROM NEW.last_error),
	             (10, 'created_at', OLD.created_at IS DISTINCT FROM NEW.created_at),
	             (11, 'claimed_at', OLD.claimed_at IS DISTINCT FROM NEW.claimed_at),
	             (12, 'published_at', OLD.published_at IS DISTINCT FROM NEW.published_at),
	             (13, 'kafka_partition', OLD.kafka_partition IS DISTINCT FROM NEW.kafka_partition),
	             (14, 'kafka_offset', OLD.kafka_offset IS DISTINCT FROM NEW.kafka_offset),
	             (15, 'order_lsn', OLD.order_lsn IS DISTINCT FROM NEW.order_lsn)) AS c(n, name, differs)
	WHERE c.differs;
	IF changed IS NOT NULL THEN
		RAISE EXCEPTION 'cannot UPDATE % of outbox.events: only a failed event''s content can be corrected', changed
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      DETAIL = 'On 0.4.0 an UPDATE of a failed event may change payload, headers, target_partition, '
			               'ce_content_type, ce_type and ce_source; the other columns are the event''s identity, its '
			               'place in its key''s order or the relay''s outcome.',
			      HINT = 'outbox.retry() puts a failed event back to pending; enqueue a new event for another '
			             'topic or key, and DELETE the failed one to give it up.';
	END IF;
	PERFORM outbox.events_row_check('pending', NEW.lane, NEW.key, NEW.event_id, NEW.topic, NEW.headers,
	                                NEW.payload IS NOT NULL, 0, NEW.created_at, NULL, NULL, NULL, NULL, NULL,
	                                NEW.target_partition, NEW.ce_content_type, NEW.ce_type, NEW.ce_source);
	UPDATE outbox.event_state e
	SET payload = NEW.payload, headers = NEW.headers, target_partition = NEW.target_partition,
	    ce_content_type = NEW.ce_content_type, ce_type = NEW.ce_type, ce_source = NEW.ce_source
	WHERE e.id = OLD.id AND e.status = 'failed';
	IF NOT FOUND THEN -- retried or given up since the statement's snapshot
		PERFORM outbox.events_refuse(TG_OP, OLD.event_id, 'no longer failed');
	END IF;
	RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION outbox.events_insert(), outbox.events_refuse(text, uuid, text), outbox.events_delete(),
                       outbox.events_update() FROM PUBLIC;

CREATE TRIGGER "~outbox_insert" INSTEAD OF INSERT ON outbox.events
	FOR EACH ROW EXECUTE FUNCTION outbox.events_insert();
CREATE TRIGGER "~outbox_update" INSTEAD OF UPDATE ON outbox.events
	FOR EACH ROW EXECUTE FUNCTION outbox.events_update();
CREATE TRIGGER "~outbox_delete" INSTEAD OF DELETE ON outbox.events
	FOR EACH ROW EXECUTE FUNCTION outbox.events_delete();

-- ---------------------------------------------------------------------------------------------
-- Functions that wrote 0.3.0's table.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION outbox.retry(event_id uuid)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	current_status text;
	retried bigint;
BEGIN
	IF retry.event_id IS NULL THEN
		RAISE EXCEPTION 'event_id must not be NULL'
			USING ERRCODE = 'null_value_not_allowed',
			      HINT = 'Pass the event_id shown by outbox.failed.';
	END IF;
	-- (A row given up, 'discarded', is no event any more: not found, as after 0.3.0's DELETE.)
	SELECT s.status INTO current_status FROM outbox.event_state s
	WHERE s.event_id = retry.event_id AND s.status <> 'discarded'
	ORDER BY s.status <> 'failed', s.id LIMIT 1
	FOR UPDATE;
	IF NOT FOUND THEN
		SELECT e.status INTO current_status FROM outbox.events e WHERE e.event_id = retry.event_id;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'no outbox event with event_id %', retry.event_id
				USING ERRCODE = 'no_data_found',
				      HINT = 'outbox.failed lists the events that can be retried.';
		END IF;
	END IF;
	IF current_status <> 'failed' THEN
		RAISE EXCEPTION 'outbox event % is %, not failed', retry.event_id, current_status
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      HINT = 'Only events in outbox.failed can be retried.';
	END IF;
	-- Only the failed rows: should one event_id have two rows (two enqueues of one caller id
	-- around a rotation, DESIGN.md "Retention"), one that is not failed keeps its attempts and
	-- retry time. Returns how many rows it put back (2 when both were failed).
	UPDATE outbox.event_state s
	SET status = 'pending', attempts = 0, next_attempt_at = NULL
	WHERE s.event_id = retry.event_id AND s.status = 'failed';
	GET DIAGNOSTICS retried = ROW_COUNT;
	PERFORM outbox.wake_relay_at_commit();
	RETURN retried;
END
$$;

CREATE OR REPLACE FUNCTION outbox.retry_failed(topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	retried bigint;
BEGIN
	UPDATE outbox.event_state s
	SET status = 'pending', attempts = 0, next_attempt_at = NULL
	WHERE s.status = 'failed' AND (retry_failed.topic IS NULL OR s.topic = retry_failed.topic);
	GET DIAGNOSTICS retried = ROW_COUNT;
	IF retried > 0 THEN
		PERFORM outbox.wake_relay_at_commit();
	END IF;
	RETURN retried;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Retention on 0.4.0 (DESIGN.md "Retention"): no DELETE per event. The current member is sealed
-- and the next free one made current once the current one is older than a third of the window
-- (and holds a row); a sealed member is emptied with TRUNCATE once it was sealed longer than the
-- window ago and every relay cursor has passed its last row. So every event is kept at least the
-- window after it was written, and at most about four thirds of it, plus the time a long
-- transaction that still holds a member, or a relay that has not passed it, keeps it.
-- ---------------------------------------------------------------------------------------------

-- Empties member `member` (TRUNCATE) and deletes its landed rows, if every relay cursor has
-- passed its last row; the caller holds the member's ACCESS EXCLUSIVE lock (so no writer is in
-- it) and has checked that it is sealed. Returns the published events whose landed rows went,
-- or -1 when a cursor has not passed the member yet (nothing changes). The one way past the
-- members' guard against TRUNCATE (src/enqueue/ring_retention_sql.cpp).
CREATE FUNCTION outbox.truncate_ring_member(member smallint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_truncate_ring_member'
LANGUAGE C VOLATILE STRICT;

-- One round of the ring's retention for the window `older_than`: empties the sealed members
-- that may go, moves the current pointer when due, and empties again what that sealed (a window
-- of 0 seals the current member and empties it at once when the relay has published it). A
-- member another session holds (a long transaction that wrote into it, a long query of
-- outbox.events) is skipped after a short wait and tried again at the next round. Returns the
-- published events removed. Called by outbox.purge() and by the relay's retention (SECURITY
-- DEFINER: the relay role gets EXECUTE on it, not TRUNCATE on the members nor UPDATE on the ring).
CREATE FUNCTION outbox.ring_retention(older_than interval)
RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '200ms'
AS $$
DECLARE
	removed bigint := 0;
	n bigint;
	r record;
	cur record;
	nxt smallint;
	has_rows boolean;
	round int;
BEGIN
	IF older_than < interval '0' THEN
		RAISE EXCEPTION 'older_than must not be negative: %', older_than
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Pass how old a published event must be to be deleted, e.g. interval ''7 days''.';
	END IF;
	-- One round at a time (a second caller waits at most lock_timeout, then returns 0).
	BEGIN
		PERFORM FROM outbox.ring FOR UPDATE;
	EXCEPTION WHEN lock_not_available THEN
		RETURN 0;
	END;
	FOR round IN 1..2 LOOP
		FOR r IN SELECT g.member FROM outbox.ring g
		         WHERE NOT g.is_current AND g.sealed_at IS NOT NULL AND g.sealed_at <= now() - older_than
		         ORDER BY g.sealed_at LOOP
			-- The lock is taken in a subtransaction that is rolled back (and the lock with it)
			-- when the member is not emptied: nothing stays locked for the caller's transaction.
			BEGIN
				EXECUTE format('LOCK TABLE outbox.%I IN ACCESS EXCLUSIVE MODE', 'events_' || r.member);
				n := outbox.truncate_ring_member(r.member);
				IF n < 0 THEN
					RAISE EXCEPTION 'not passed' USING ERRCODE = 'OBX01';
				END IF;
			EXCEPTION
				WHEN lock_not_available THEN
					EXIT; -- held by another session: the next round (a later member is never passed first)
				WHEN SQLSTATE 'OBX01' THEN
					EXIT; -- not passed by every cursor yet; later members even less
			END;
			removed := removed + n;
			UPDATE outbox.ring g SET opened_at = NULL, sealed_at = NULL WHERE g.member = r.member;
		END LOOP;
		EXIT WHEN round = 2;
		-- Rotate: the current member is older than a third of the window, holds a row, and the
		-- next one is free.
		SELECT g.member, g.opened_at INTO cur FROM outbox.ring g WHERE g.is_current;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'outbox.ring has no current member'
				USING ERRCODE = 'object_not_in_prerequisite_state',
				      HINT = 'outbox.ring belongs to the extension: do not change it by hand.';
		END IF;
		nxt := (cur.member + 1) % 4;
		EXIT WHEN cur.opened_at > now() - older_than / 3
		       OR NOT EXISTS (SELECT FROM outbox.ring g WHERE g.member = nxt AND NOT g.is_current AND g.sealed_at IS NULL);
		EXECUTE format('SELECT EXISTS (SELECT FROM outbox.%I)', 'events_' || cur.member) INTO has_rows;
		EXIT WHEN NOT has_rows;
		UPDATE outbox.ring g
		SET is_current = (g.member = nxt),
		    opened_at = CASE WHEN g.member = nxt THEN now() ELSE g.opened_at END,
		    sealed_at = CASE WHEN g.member = cur.member THEN now() ELSE g.sealed_at END
		WHERE g.member IN (cur.member, nxt);
	END LOOP;
	RETURN removed;
END
$$;

REVOKE ALL ON FUNCTION outbox.truncate_ring_member(smallint), outbox.ring_retention(interval) FROM PUBLIC;

-- Where every relay cursor has passed, as outbox.truncate_ring_member() reads it (the latest
-- snapshot): the lowest cursor of the worker count that moved last, or, when nothing is passed,
-- problem says why. For outbox.ring_status (its owner); granted to nobody.
CREATE FUNCTION outbox.ring_cursor_floor(
	OUT order_lsn pg_lsn, OUT id bigint, OUT n_workers integer, OUT worker integer, OUT problem text)
AS 'MODULE_PATHNAME', 'outbox_ring_cursor_floor'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION outbox.ring_cursor_floor() FROM PUBLIC;

-- What the retention could not do, and why (DESIGN.md "Retention", "Failures"). A member another
-- session holds, or one a relay cursor has not passed, stays sealed round after round; once no
-- member is free the current one is never sealed and grows. One row per member: overdue is a
-- sealed member sealed longer than `older_than` ago that is still there (the retention would
-- have emptied it), kept_because why, as far as can be told without waiting (with older_than
-- NULL, no window: the retention is off, nothing is due, overdue and kept_because are NULL on
-- every row): 'cursor of worker
-- slot K (n_workers M) has not passed it' (or why no cursor passes anything, as
-- truncate_ring_member reads them), 'locked by pid N' (the session that has held a lock on it
-- longest: it stops the retention's ACCESS EXCLUSIVE lock), 'member K, sealed before it, is
-- kept: members are emptied oldest first', or NULL. The member's last row is read under its
-- ACCESS SHARE lock in a subtransaction that is rolled back: the caller keeps no lock on it
-- (a monitoring session in a long transaction must not hold the retention off itself), and a
-- lock it cannot get within lock_timeout is reported, not waited for. SECURITY DEFINER, for
-- pg_monitor and the relay role only: member numbers, times, slots and a pid; no event, no
-- query text.
CREATE FUNCTION outbox.ring_status(
	older_than interval,
	OUT member smallint, OUT is_current boolean, OUT opened_at timestamptz, OUT sealed_at timestamptz,
	OUT overdue boolean, OUT kept_because text)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
DECLARE
	g record;
	cursor_floor record;
	holder record;
	holders bigint;
	last_lsn pg_lsn;
	last_id bigint;
	got_last boolean;
	first_kept smallint;
	rel oid;
BEGIN
	IF older_than < interval '0' THEN
		RAISE EXCEPTION 'older_than must not be negative: %', older_than
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Pass the retention window, e.g. interval ''7 days'' (outbox.ring_status uses outbox.retention).';
	END IF;
	-- Where every cursor has passed, or why nothing is passed (truncate_ring_member()'s reading);
	-- not needed without a window.
	IF older_than IS NOT NULL THEN
		SELECT * INTO cursor_floor FROM outbox.ring_cursor_floor();
	END IF;
	FOR g IN SELECT r.member, r.is_current, r.opened_at, r.sealed_at FROM outbox.ring r
	         ORDER BY r.sealed_at NULLS LAST, r.member LOOP
		member := g.member;
		is_current := g.is_current;
		opened_at := g.opened_at;
		sealed_at := g.sealed_at;
		-- No window (NULL: outbox.retention = 0, the relay never purges): nothing is due, so
		-- nothing is overdue and no reason is asked for.
		overdue := CASE WHEN older_than IS NULL THEN NULL
		                ELSE NOT g.is_current AND g.sealed_at IS NOT NULL
		                     AND g.sealed_at <= pg_catalog.now() - older_than END;
		kept_because := NULL;
		IF overdue THEN
			rel := pg_catalog.to_regclass('outbox.events_' || g.member);
			-- The member's last row (ACCESS SHARE, given back at once: the block is rolled back;
			-- the variables keep what was read).
			got_last := false;
			last_lsn := NULL;
			last_id := NULL;
			BEGIN
				EXECUTE format('SELECT e.order_lsn, e.id FROM outbox.%I e ORDER BY e.order_lsn DESC, e.id DESC LIMIT 1',
				               'events_' || g.member)
				INTO last_lsn, last_id;
				got_last := true;
				RAISE EXCEPTION 'read' USING ERRCODE = 'OBX02';
			EXCEPTION
				WHEN SQLSTATE 'OBX02' THEN NULL;
				WHEN lock_not_available THEN NULL; -- held in ACCESS EXCLUSIVE mode: the lock below says by whom
			END;
			IF got_last AND last_lsn IS NOT NULL THEN
				kept_because := cursor_floor.problem;
				IF kept_because IS NULL AND (cursor_floor.order_lsn, cursor_floor.id) < (last_lsn, last_id) THEN
					kept_because := format('cursor of worker slot %s (n_workers %s) has not passed it',
					                       cursor_floor.worker, cursor_floor.n_workers);
				END IF;
			END IF;
			IF kept_because IS NULL THEN
				-- Who holds a lock on it, the longest-running transaction first (a relay's claim
				-- holds one for a publish; a prepared transaction has no pid).
				SELECT l.pid, pg_catalog.count(*) OVER () AS n INTO holder
				FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
				WHERE l.locktype = 'relation' AND l.relation = rel AND l.granted
				  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
				  AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
				ORDER BY l.pid IS NOT NULL, a.xact_start NULLS LAST, l.pid
				LIMIT 1;
				IF FOUND THEN
					holders := holder.n;
					kept_because := CASE WHEN holder.pid IS NULL THEN 'locked by a prepared transaction'
					                     ELSE format('locked by pid %s', holder.pid) END
					                || CASE WHEN holders > 1 THEN format(' (and %s more)', holders - 1) ELSE '' END;
				END IF;
			END IF;
			IF kept_because IS NULL AND first_kept IS NOT NULL THEN
				kept_because := format('member %s, sealed before it, is kept: members are emptied oldest first', first_kept);
			END IF;
			first_kept := coalesce(first_kept, g.member);
		END IF;
		RETURN NEXT;
	END LOOP;
END
$$;

CREATE VIEW outbox.ring_status AS
SELECT s.member, s.is_current, s.opened_at, s.sealed_at, s.overdue, s.kept_because
FROM outbox.ring_status(NULLIF(pg_catalog.current_setting('outbox.retention')::interval, interval '0')) s
ORDER BY s.member;

COMMENT ON VIEW outbox.ring_status IS
	'The ring''s members: current, opened, sealed, overdue (sealed longer than outbox.retention ago and still kept) and why it is kept; with outbox.retention = 0 (the relay never purges) overdue and kept_because are NULL';

REVOKE ALL ON FUNCTION outbox.ring_status(interval) FROM PUBLIC;
REVOKE ALL ON TABLE outbox.ring_status FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.ring_status(interval) TO pg_monitor;
GRANT SELECT ON outbox.ring_status TO pg_monitor;

-- ---------------------------------------------------------------------------------------------
-- The re-base of the relay cursors (DESIGN.md "The insert-only queue", H6). A cursor says which
-- member rows its slot passed only on the system that stamped them: a dump restored into another
-- cluster (or database) re-stamps every member row as it is inserted (the stamp trigger is ENABLE
-- ALWAYS) with this system's WAL positions and writers, while the restored cursors keep the old
-- ones; pg_upgrade keeps the stamps and positions but gives a new system identifier; pg_resetwal
-- can put the WAL insert position below them. Such a cursor is one made on another system
-- identifier, above the WAL insert position, or below outbox.ring_start (the script's row, never
-- dumped: a cursor is never made below it). What the relay published is known without the
-- cursors: landed names it; event_state holds what waits, failed or was passed. So every member
-- row in neither is copied into event_state, pending and due now (the claim's (1) sends it), and
-- every cursor row goes to the WAL insert position with this system identifier and no holes:
-- nothing published is sent again (pg_upgrade resends nothing), nothing unpublished is skipped.
--
-- Order: the claim takes event_state rows in (order_lsn, id) order, and stamps of two systems do
-- not compare. Every event_state row gets a fresh order_lsn ('0/0' + rank, far below any stamp
-- this system will give: each row written more than a byte of WAL): first the rows that were
-- there, in their order (each of them was consumed before any unconsumed row of its key was
-- committed), then the copied rows, members oldest first (by their lowest id: ids come from one
-- sequence), each in its stamp order (a restore's stamps follow the dump's row order, which is
-- (order_lsn, id): the members' config-dump filter below). Per-key order across members is not
-- kept for a contended key whose transaction wrote into the older member before a rotation and
-- committed after a later transaction of the key in the newer member (DESIGN.md "Failures").
--
-- The ring: a restore gives the script's ring (member 0 current, none sealed) whatever the dump
-- had. When a member the ring calls free holds rows, the ring is derived from the rows: the member
-- with the newest row is current, the other non-empty ones sealed now (oldest first, a
-- millisecond apart, so the retention empties them in age order), the empty ones free.
--
-- Locks: the row of outbox.ring_start and every cursor row NOWAIT (one re-base at a time; a slot
-- in the middle of a batch is not waited for), outbox.ring's rows, then the members in SHARE mode
-- (no writer is open in them while the rows are read: every row below the new cursors is
-- committed or aborted), each within lock_timeout. A lock not had: nothing changes, both results
-- are NULL, and the relay asks again at its next claim. Otherwise returns the cursor rows re-based
-- (0: none needed one, e.g. another worker re-based first) and the events copied, logged on one
-- LOG line (counts and the reason, no event data), and wakes the relay at commit. For the relay
-- role (RingRightsProblem): its claim calls it before anything else and, when it re-based, commits
-- it with nothing claimed (the members' locks go before any publish).
CREATE FUNCTION outbox.ring_rebase(OUT rebased integer, OUT copied bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '1s'
AS $$
DECLARE
	sysid bigint := (SELECT s.system_identifier FROM pg_catalog.pg_control_system() s);
	why text;
	w pg_lsn;
	kept bigint;
BEGIN
	BEGIN
		PERFORM FROM outbox.ring_start r FOR UPDATE NOWAIT;
		SELECT pg_catalog.string_agg(DISTINCT v.reason, ', ') INTO why
		FROM outbox.cursors c,
		     LATERAL (VALUES (CASE WHEN c.system_identifier <> sysid THEN 'made on another system identifier' END),
		                     (CASE WHEN c.order_lsn > pg_catalog.pg_current_wal_insert_lsn()
		                           THEN 'above the WAL insert position' END),
		                     (CASE WHEN c.order_lsn < (SELECT pg_catalog.min(r.order_lsn) FROM outbox.ring_start r)
		                           THEN 'below outbox.ring_start' END)) AS v(reason)
		WHERE v.reason IS NOT NULL;
		IF why IS NULL THEN
			rebased := 0;
			copied := 0;
			RETURN;
		END IF;
		PERFORM FROM outbox.cursors c FOR UPDATE NOWAIT;
		PERFORM FROM outbox.ring g FOR UPDATE;
		LOCK TABLE outbox.events_0, outbox.events_1, outbox.events_2, outbox.events_3 IN SHARE MODE;
	EXCEPTION WHEN lock_not_available THEN
		RETURN; -- NULL, NULL: asked again at the next claim
	END;
	w := pg_catalog.pg_current_wal_insert_lsn();

	UPDATE outbox.event_state s SET order_lsn = '0/0'::pg_lsn + o.n::numeric
	FROM (SELECT x.id, pg_catalog.row_number() OVER (ORDER BY x.order_lsn, x.id) AS n FROM outbox.event_state x) o
	WHERE s.id = o.id;
	GET DIAGNOSTICS kept = ROW_COUNT;
	-- member_lsn: the restored member row's stamp (matched by member and id, a scan here once), so
	-- the view's probe by (member_lsn, id) finds it; a row whose member row is gone keeps its own.
	UPDATE outbox.event_state s SET member_lsn = k.order_lsn
	FROM (SELECT 0::smallint AS member, e.order_lsn, e.id FROM outbox.events_0 e
	      UNION ALL SELECT 1::smallint, e.order_lsn, e.id FROM outbox.events_1 e
	      UNION ALL SELECT 2::smallint, e.order_lsn, e.id FROM outbox.events_2 e
	      UNION ALL SELECT 3::smallint, e.order_lsn, e.id FROM outbox.events_3 e) k
	WHERE k.member = s.member AND k.id = s.id AND s.member_lsn <> k.order_lsn;

	WITH m AS (
		-- Columns by name: events_0's physical order differs (it keeps 0.3.0's dropped columns).
		SELECT 0::smallint AS member, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at, e.order_lsn,
		       e.writer, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
		FROM outbox.events_0 e
		UNION ALL
		SELECT 1::smallint, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at, e.order_lsn,
		       e.writer, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
		FROM outbox.events_1 e
		UNION ALL
		SELECT 2::smallint, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at, e.order_lsn,
		       e.writer, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
		FROM outbox.events_2 e
		UNION ALL
		SELECT 3::smallint, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, e.created_at, e.order_lsn,
		       e.writer, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
		FROM outbox.events_3 e
	), age AS (
		SELECT m.member, pg_catalog.min(m.id) AS first_id FROM m GROUP BY m.member
	), published AS (
		SELECT DISTINCT u.id FROM outbox.landed l, pg_catalog.unnest(l.ids) AS u(id)
	)
	INSERT INTO outbox.event_state (id, member, event_id, topic, key, lane, payload, headers, created_at, order_lsn,
	                                member_lsn, writer, target_partition, ce_content_type, ce_type, ce_source,
	                                status, attempts, next_attempt_at, last_error)
	SELECT m.id, m.member, m.event_id, m.topic, m.key, m.lane, m.payload, m.headers, m.created_at,
	       '0/0'::pg_lsn + (kept + pg_catalog.row_number() OVER (ORDER BY a.first_id, m.order_lsn, m.id))::numeric,
	       m.order_lsn, m.writer, m.target_partition, m.ce_content_type, m.ce_type, m.ce_source,
	       'pending', 0, NULL, NULL
	FROM m JOIN age a ON a.member = m.member
	WHERE NOT EXISTS (SELECT FROM outbox.event_state s WHERE s.id = m.id)
	  AND NOT EXISTS (SELECT FROM published p WHERE p.id = m.id);
	GET DIAGNOSTICS copied = ROW_COUNT;

	UPDATE outbox.cursors c
	SET order_lsn = w, id = 0, system_identifier = sysid, hole_xids = '{}', hole_froms = '{}',
	    hole_walked_lsns = '{}', hole_walked_ids = '{}', updated_at = pg_catalog.statement_timestamp();
	GET DIAGNOSTICS rebased = ROW_COUNT;

	IF EXISTS (SELECT FROM outbox.ring g
	           WHERE NOT g.is_current AND g.sealed_at IS NULL
	             AND CASE g.member WHEN 0 THEN EXISTS (SELECT FROM outbox.events_0)
	                               WHEN 1 THEN EXISTS (SELECT FROM outbox.events_1)
	                               WHEN 2 THEN EXISTS (SELECT FROM outbox.events_2)
	                               WHEN 3 THEN EXISTS (SELECT FROM outbox.events_3) ELSE false END) THEN
		WITH last AS (
			SELECT 0::smallint AS member, pg_catalog.max(e.id) AS last_id FROM outbox.events_0 e
			UNION ALL SELECT 1::smallint, pg_catalog.max(e.id) FROM outbox.events_1 e
			UNION ALL SELECT 2::smallint, pg_catalog.max(e.id) FROM outbox.events_2 e
			UNION ALL SELECT 3::smallint, pg_catalog.max(e.id) FROM outbox.events_3 e
		), ranked AS (
			SELECT l.member,
			       CASE WHEN l.last_id IS NOT NULL
			            THEN pg_catalog.rank() OVER (ORDER BY l.last_id DESC NULLS LAST) - 1 END AS newer
			FROM last l
		)
		UPDATE outbox.ring g
		SET is_current = coalesce(r.newer = 0, false),
		    opened_at = CASE WHEN r.newer IS NOT NULL THEN pg_catalog.now() - r.newer * interval '1 millisecond' END,
		    sealed_at = CASE WHEN r.newer > 0 THEN pg_catalog.now() - r.newer * interval '1 millisecond' END
		FROM ranked r
		WHERE r.member = g.member;
	END IF;

	-- The relay claims from the new cursors at once (the claim that called this commits first).
	PERFORM outbox.wake_relay_at_commit();
	RAISE LOG 'outbox: re-based % relay cursor row(s) (%): % event(s) neither published nor in outbox.event_state copied into it as pending, % kept there',
		rebased, why, copied, kept;
END
$$;

REVOKE ALL ON FUNCTION outbox.ring_rebase() FROM PUBLIC;

-- purge() on 0.4.0: one round of the ring's retention (batch_size is checked, as before, and
-- otherwise unused: a member goes in one TRUNCATE).
CREATE OR REPLACE FUNCTION outbox.purge(older_than interval DEFAULT NULL, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	retention interval := current_setting('outbox.retention')::interval;
BEGIN
	IF older_than IS NULL THEN
		IF retention = interval '0' THEN
			RAISE EXCEPTION 'outbox.purge() needs older_than while outbox.retention is 0 (off)'
				USING ERRCODE = 'null_value_not_allowed',
				      HINT = 'Pass the window, e.g. outbox.purge(interval ''7 days'').';
		END IF;
		older_than := retention;
	END IF;
	IF older_than < interval '0' THEN
		RAISE EXCEPTION 'older_than must not be negative: %', older_than
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Pass how old a published event must be to be deleted, e.g. interval ''7 days''.';
	END IF;
	IF batch_size IS NULL OR batch_size < 1 THEN
		RAISE EXCEPTION 'batch_size must be a positive integer, not %', coalesce(batch_size::text, 'NULL')
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Use a batch of a few thousand rows and call outbox.purge() again until it returns less.';
	END IF;
	RETURN outbox.ring_retention(older_than);
END
$$;

-- outbox.topic_metrics() (SQL, reading outbox.events by status) reads the view unchanged.

-- outbox.worker_metrics gets the ring's retention after its columns (unchanged):
-- ring_oldest_sealed_age_seconds (worker 0, which keeps the retention: the age of the oldest
-- sealed member at its last round, 0 when none is sealed) and ring_retention_stalls (rounds that
-- left a member sealed past the window, not emptied). A function's result columns cannot be
-- changed in place, and nothing is dropped (a view of a monitoring role's own on
-- outbox.worker_metrics, or on the function, would stop the update with 2BP01): a new function,
-- outbox.worker_metrics_v2(), has the full list, bound to the same C function (which fills as
-- many columns as the result has), and the view is replaced over it, its columns appended at its
-- end; the view keeps its rights, and the new function gets every EXECUTE right the old one had
-- (pg_monitor's and any an operator added; a querying role needs it, as for the old one). The old
-- function stays, with 0.3.0's columns and its rights.
SELECT pg_catalog.set_config('outbox_upgrade.metrics_acl', coalesce(pg_catalog.jsonb_agg(g)::text, '[]'), true)
FROM (SELECT a.privilege_type AS privilege,
             CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee, a.is_grantable
      FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
      WHERE p.oid = 'outbox.worker_metrics()'::pg_catalog.regprocedure AND a.grantee NOT IN (p.proowner, 0)) g;

CREATE FUNCTION outbox.worker_metrics_v2(
	OUT database text, OUT worker integer, OUT pid integer, OUT state text, OUT broker_state text,
	OUT broker_up integer, OUT backing_off integer, OUT backoff_remaining_seconds double precision,
	OUT started_at timestamptz,
	OUT events_published bigint, OUT events_failed bigint, OUT events_retried bigint,
	OUT events_requeued bigint, OUT backoffs bigint, OUT batches bigint,
	OUT batch_size double precision[], OUT batch_size_bucket bigint[],
	OUT batch_size_sum double precision, OUT batch_size_count bigint,
	OUT publish_seconds double precision[], OUT publish_seconds_bucket bigint[],
	OUT publish_seconds_sum double precision, OUT publish_seconds_count bigint,
	OUT claim_seconds double precision[], OUT claim_seconds_bucket bigint[],
	OUT claim_seconds_sum double precision, OUT claim_seconds_count bigint,
	OUT record_seconds double precision[], OUT record_seconds_bucket bigint[],
	OUT record_seconds_sum double precision, OUT record_seconds_count bigint,
	OUT events_resent bigint,
	OUT ring_oldest_sealed_age_seconds double precision, OUT ring_retention_stalls bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_worker_metrics'
LANGUAGE C VOLATILE STRICT;

REVOKE ALL ON FUNCTION outbox.worker_metrics_v2() FROM PUBLIC;

CREATE OR REPLACE VIEW outbox.worker_metrics AS SELECT * FROM outbox.worker_metrics_v2();

COMMENT ON VIEW outbox.worker_metrics IS
	'Relay workers'' metrics since their start: events published, failed, retried, requeued, resent; batch size and publish, claim and record time histograms; broker and backoff state; the ring''s oldest sealed member and retention rounds that could not empty an overdue one';

DO $$
DECLARE
	g record;
BEGIN
	FOR g IN SELECT * FROM pg_catalog.jsonb_to_recordset(current_setting('outbox_upgrade.metrics_acl')::jsonb)
	                       AS x(privilege text, grantee text, is_grantable boolean) LOOP
		EXECUTE format('GRANT %s ON FUNCTION outbox.worker_metrics_v2() TO %s%s', g.privilege, g.grantee,
		               CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
	END LOOP;
END
$$;
SELECT pg_catalog.set_config('outbox_upgrade.metrics_acl', '', true);

-- ---------------------------------------------------------------------------------------------
-- pg_dump: the ring's data with the events (events_0 was dumped as outbox.events before). The
-- ring and ring_start rows are made by this script (a dump would add them twice).
-- ---------------------------------------------------------------------------------------------
SELECT pg_catalog.pg_extension_config_dump('outbox.events_id_seq', '');
-- The members in (order_lsn, id) order (the filter follows FROM in pg_dump's COPY, and its
-- --inserts SELECT): a restore re-stamps them in that order, which the re-base keeps
-- (outbox.ring_rebase()). events_0 again: as outbox.events it was dumped in physical order.
SELECT pg_catalog.pg_extension_config_dump('outbox.events_0', 'ORDER BY order_lsn, id');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_1', 'ORDER BY order_lsn, id');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_2', 'ORDER BY order_lsn, id');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_3', 'ORDER BY order_lsn, id');
SELECT pg_catalog.pg_extension_config_dump('outbox.landed', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.event_state', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.cursors', '');

-- ---------------------------------------------------------------------------------------------
-- Rights. Nothing for PUBLIC. Whoever had rights on 0.3.0's table gets them on the view of its
-- name (SELECT, INSERT; UPDATE and DELETE too, which the view allows on failed events only), per table
-- and per column; nobody keeps any on the members, except the relay's SELECT. The relay's role
-- (outbox.relay_role, as 0.2.0 made it) reads the members, the ring and ring_start and writes
-- cursors, landed and event_state.
-- ---------------------------------------------------------------------------------------------
REVOKE ALL ON outbox.events, outbox.events_1, outbox.events_2, outbox.events_3, outbox.ring, outbox.cursors,
              outbox.ring_start, outbox.landed, outbox.event_state, outbox.events_id_seq FROM PUBLIC;

DO $$
DECLARE
	g record;
BEGIN
	FOR g IN SELECT * FROM pg_catalog.jsonb_to_recordset(current_setting('outbox_upgrade.events_acl')::jsonb)
	                       AS x(column_name text, privilege text, grantee text, is_grantable boolean) LOOP
		-- 0.3.0's table rights of one role, from the table or from a column. (A dropped column's
		-- rights went with it.) CASCADE: a role that had a right WITH GRANT OPTION and passed it
		-- on loses what it passed on the member too; those grantees are in the list as well and
		-- get their right on the view, granted by the owner (the grantor is not kept).
		IF g.column_name IS NULL THEN
			EXECUTE format('REVOKE ALL ON outbox.events_0 FROM %s CASCADE', g.grantee);
		ELSIF EXISTS (SELECT FROM pg_catalog.pg_attribute t
		              WHERE t.attrelid = 'outbox.events_0'::pg_catalog.regclass AND t.attname = g.column_name
		                AND NOT t.attisdropped) THEN
			EXECUTE format('REVOKE ALL (%I) ON outbox.events_0 FROM %s CASCADE', g.column_name, g.grantee);
		END IF;
		IF g.privilege IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE') THEN
			EXECUTE format('GRANT %s%s ON outbox.events TO %s%s', g.privilege,
			               CASE WHEN g.column_name IS NULL THEN '' ELSE format(' (%I)', g.column_name) END,
			               g.grantee, CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
		END IF;
	END LOOP;
END
$$;
SELECT pg_catalog.set_config('outbox_upgrade.events_acl', '', true);

DO $$
DECLARE
	relay_role text := current_setting('outbox.relay_role');
	r record;
BEGIN
	SELECT * INTO r FROM pg_catalog.pg_roles WHERE rolname = relay_role;
	IF NOT FOUND THEN
		EXECUTE format('CREATE ROLE %I NOLOGIN', relay_role);
	ELSIF r.rolsuper OR r.rolcanlogin OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls THEN
		RAISE EXCEPTION 'outbox.relay_role "%" is a role with SUPERUSER, LOGIN, CREATEROLE, CREATEDB, REPLICATION or BYPASSRLS', relay_role
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'The relay runs as this role: name a plain NOLOGIN role, or drop the setting to use outbox_relay.';
	END IF;
	EXECUTE format('GRANT USAGE ON SCHEMA outbox TO %I', relay_role);
	-- The view: what the relay's checks of 0.3.0 looked at (it writes nothing through it).
	EXECUTE format('REVOKE ALL ON outbox.events FROM %I CASCADE', relay_role);
	EXECUTE format('GRANT SELECT ON outbox.events TO %I', relay_role);
	EXECUTE format('GRANT SELECT ON outbox.events_0, outbox.events_1, outbox.events_2, outbox.events_3, '
	               'outbox.ring, outbox.ring_start TO %I', relay_role);
	-- What src/relay/ring_claim.cpp's statements write (RingRightsProblem lists it): the
	-- cursors move forward and are never deleted; landed rows are only inserted (the retention
	-- deletes them as the owner); event_state rows are copied in, updated and deleted.
	EXECUTE format('REVOKE ALL ON outbox.cursors, outbox.landed, outbox.event_state FROM %I CASCADE', relay_role);
	EXECUTE format('GRANT SELECT, INSERT, UPDATE ON outbox.cursors TO %I', relay_role);
	EXECUTE format('GRANT INSERT ON outbox.landed TO %I', relay_role);
	EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.event_state TO %I', relay_role);
	-- Its retention: outbox.ring_retention() (SECURITY DEFINER), nothing more.
	EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.ring_retention(interval) TO %I', relay_role);
	-- What the retention could not empty, and why (it warns and counts it: outbox.ring_status).
	EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.ring_status(interval) TO %I', relay_role);
	-- The re-base of cursors of another system (its claim asks for it first when one is found).
	EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.ring_rebase() TO %I', relay_role);
END
$$;

-- Last: the WAL insert position once every row above is in place.
INSERT INTO outbox.ring_start (order_lsn) VALUES (pg_catalog.pg_current_wal_insert_lsn());
