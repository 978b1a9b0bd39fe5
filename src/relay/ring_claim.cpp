// The claim and record on schema 0.4.0's ring (DESIGN.md "The insert-only queue", build step 3,
// a preview): events are only ever INSERTed into the generation tables outbox.events_0 .. 3; a
// relay slot (worker i of N) walks them in (order_lsn, id) order from its cursor
// (outbox.cursors) up to W, the WAL insert position of the claim's view of the registry of open
// writers (shared/open_writers.hpp); each open writer the cursor passes becomes a hole of the
// slot (kept in its cursor row), whose rows from its lowest stamp up to the cursor are walked
// once it committed (dropped if it aborted), before any row after the cursor. Per batch it writes
// one landed row per run of offsets of a (member, topic, partition), the cursor and its holes,
// and for the rare outcomes a row of outbox.event_state (a retry, failed, quarantined, held
// behind an earlier event of its key, passed unpublished). No member row is written.
//
// What 0.3.0's claim promises holds the same way: one publisher per slot (the cursor row, FOR
// UPDATE SKIP LOCKED; lanes % N = i); per-(topic, key) commit order (order_lsn follows commit
// order per key, the walk and the event_state rows are taken in that order, and a member row
// whose key has an event_state row waiting (or failed, under block_key) is not sent but copied
// into event_state behind it); nothing published before its commit is durable (relay_sql.cpp's
// FlushBeforePublish); a crash or ERROR before the record's commit leaves cursor, landed and
// event_state as they were: the batch is sent again (at-least-once).
// Nothing committed is skipped: a row below W that the claim's snapshot S does not show and that
// will still commit is a row of an open writer of the view, at or above its lowest stamp (DESIGN.md
// "Why nothing committed is skipped"); every such writer whose lowest stamp is at or below the new
// cursor is a hole in the cursor row committed with the cursor. Cursors of another system (a
// restored dump, pg_upgrade, pg_resetwal) are re-based first (outbox.ring_rebase()). Not built:
// the re-base on a changed worker count (at least once sends some rows again; exactly_once leaves
// out what the old counts' slots handled: kOldFloorsSql).
#include "relay/ring_claim.hpp"

#include "relay/relay_step.hpp"
#include "shared/guc.hpp"
#include "shared/open_writers.hpp"

namespace outbox {

namespace {

constexpr int kMembers = 4;

// Whether a cursor row was made on another system: another system identifier, above the WAL
// insert position, or below outbox.ring_start (never made there on this one). Such a cursor does
// not say what its slot passed (a restored dump re-stamped every member row): the claim asks for
// the re-base first (outbox.ring_rebase(), DESIGN.md "The insert-only queue", H6).
const char *const kRebaseNeededSql = R"SQL(
SELECT EXISTS (SELECT FROM outbox.cursors c
               WHERE c.system_identifier <> $1 OR c.order_lsn > pg_current_wal_insert_lsn()
                  OR c.order_lsn < (SELECT min(r.order_lsn) FROM outbox.ring_start r))
)SQL";
// NULL when it could not have its locks (a slot in a batch, a writer open in a member): nothing
// changed.
const char *const kRebaseSql = "SELECT r.rebased FROM outbox.ring_rebase() r";

// The slot's cursor row, locked: one publisher per slot. A slot locked elsewhere (a worker of
// another count still finishing, a user) is skipped this round.
const char *const kCursorLockSql = R"SQL(
SELECT c.order_lsn, c.id, c.hole_xids, c.hole_froms, c.hole_walked_lsns, c.hole_walked_ids FROM outbox.cursors c
WHERE c.n_workers = $1 AND c.worker = $2
FOR UPDATE OF c SKIP LOCKED
)SQL";

// A slot's first row: when other worker counts ran (a change of outbox.workers), at the lowest
// cursor of the last complete one (every slot 0 .. n-1 has a row) and of the counts that moved
// since it (below that, every lane's rows were handled: a slot of an incomplete count that never
// made its row has handled nothing, so that count's own lowest cursor is not enough); at
// outbox.ring_start when no other count is complete. Rows between it and an old slot's own cursor
// are sent again (the re-base that avoids those duplicates is not built). With the union of those
// counts' holes (each at its lowest stamp, its walk begun again: a hole's rows walked already are
// sent again, never lost).
const char *const kCursorCreateSql = R"SQL(
WITH moved AS (
	SELECT o.n_workers, max(o.updated_at) AS at, count(*) = o.n_workers AS complete
	FROM outbox.cursors o WHERE o.n_workers <> $1 GROUP BY o.n_workers
), old AS (
	SELECT m.n_workers FROM moved m WHERE m.at >= (SELECT max(c.at) FROM moved c WHERE c.complete)
), holes AS (
	SELECT u.x, min(u.f) AS f
	FROM outbox.cursors c, unnest(c.hole_xids, c.hole_froms) AS u(x, f)
	WHERE c.n_workers IN (SELECT n_workers FROM old)
	GROUP BY u.x
)
INSERT INTO outbox.cursors (n_workers, worker, order_lsn, id, system_identifier, updated_at,
                            hole_xids, hole_froms, hole_walked_lsns, hole_walked_ids)
SELECT $1, $2, p.order_lsn, p.id, $3, statement_timestamp(),
       coalesce((SELECT array_agg(h.x ORDER BY h.x) FROM holes h), '{}'),
       coalesce((SELECT array_agg(h.f ORDER BY h.x) FROM holes h), '{}'),
       coalesce((SELECT array_agg('0/0'::pg_lsn ORDER BY h.x) FROM holes h), '{}'),
       coalesce((SELECT array_agg(0::bigint ORDER BY h.x) FROM holes h), '{}')
FROM (SELECT c.order_lsn, c.id, 0 AS rank FROM outbox.cursors c
      WHERE c.n_workers IN (SELECT n_workers FROM old)
      UNION ALL
      SELECT r.order_lsn, 0::bigint, 1 FROM outbox.ring_start r) p
ORDER BY p.rank, p.order_lsn, p.id
LIMIT 1
ON CONFLICT (n_workers, worker) DO NOTHING
)SQL";

// The cursor (only ever moved forward: RecordCursor) and the slot's holes, under the row's lock.
const char *const kCursorMoveSql = R"SQL(
UPDATE outbox.cursors c SET order_lsn = $3, id = $4, hole_xids = $5, hole_froms = $6, hole_walked_lsns = $7,
                            hole_walked_ids = $8, updated_at = statement_timestamp()
WHERE c.n_workers = $1 AND c.worker = $2
)SQL";

// Whether holes that the claim's snapshot no longer shows in progress committed: 'committed',
// 'aborted' (also a transaction that was running at a crash), NULL when too old to tell.
const char *const kHoleStatusSql = R"SQL(
SELECT pg_catalog.pg_xact_status(u.x) FROM unnest($1::xid8[]) WITH ORDINALITY AS u(x, k) ORDER BY u.k
)SQL";

// Candidates (1): due pending event_state rows of the slot's lanes, in order, read without
// locks; a row behind an earlier row of its (topic, key) that waits for its retry or (block_key)
// failed is not one. Then locked by ctid (kStateLockSql); a candidate not returned (a user's
// retry() holds it) stops its (topic, key) for the batch.
const char *const kStateCandidatesSql = R"SQL(
SELECT s.ctid, s.id, s.topic, s.key,
       (coalesce(octet_length(s.payload), 0) + coalesce(octet_length(s.key), 0)
        + coalesce(octet_length(s.headers::text), 0))::bigint
FROM outbox.event_state s
WHERE s.status = 'pending' AND (s.next_attempt_at IS NULL OR s.next_attempt_at <= now())
  AND (s.lane::integer % $1 + $1) % $1 = $2
  AND (s.key IS NULL OR NOT EXISTS (
        SELECT 1 FROM outbox.event_state b
        WHERE b.topic = s.topic AND b.key = s.key AND (b.order_lsn, b.id) < (s.order_lsn, s.id)
          AND ((b.status = 'failed' AND $4)
               OR (b.status = 'pending' AND b.next_attempt_at IS NOT NULL AND b.next_attempt_at > now()))))
ORDER BY s.order_lsn, s.id
LIMIT $3
)SQL";

// The claimed row's layout (relay_step.hpp's CopyClaimedRow), 9 member, 10 order_lsn, 16 ctid,
// 17 still pending.
const char *const kStateLockSql = R"SQL(
SELECT s.id, s.event_id::text, s.topic, s.key, s.payload,
       CASE WHEN jsonb_typeof(s.headers) = 'object'
            THEN ARRAY(SELECT h.key FROM jsonb_each_text(s.headers) h ORDER BY h.key) END,
       CASE WHEN jsonb_typeof(s.headers) = 'object'
            THEN ARRAY(SELECT h.value FROM jsonb_each_text(s.headers) h ORDER BY h.key) END,
       s.headers IS NOT NULL AND jsonb_typeof(s.headers) <> 'object',
       s.member, s.order_lsn,
       s.created_at, s.target_partition, s.ce_content_type, s.ce_type, s.ce_source,
       s.ctid, s.status = 'pending'
FROM outbox.event_state s
WHERE s.ctid = ANY ($1::tid[])
FOR UPDATE OF s SKIP LOCKED
)SQL";

// Candidates (3): member rows of the slot's lanes after the cursor and below W,
// in (order_lsn, id) order over every member (a merge of their order indexes), in the claimed
// row's layout, 9 member, 10 order_lsn, 16 size for the byte budget, 17 held: the key has an
// event_state row that waits (or failed, under block_key), which the row must not overtake, or
// the row has one of its own (a walk again after a new worker count: a keyed row failed, or
// given up, 'discarded', is never sent from the member; its copy is not written twice). A
// given-up event of the key holds nothing.
// No lock: members are insert-only, and the cursor row serialises the slot's claims.
#define OUTBOX_RING_MEMBER(n)                                                                                         \
	"SELECT " #n "::smallint AS member, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, "             \
	"e.created_at, e.order_lsn, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source, e.writer "              \
	"FROM outbox.events_" #n " e"
#define OUTBOX_RING_MEMBERS                                                                                           \
	"(" OUTBOX_RING_MEMBER(0) " UNION ALL " OUTBOX_RING_MEMBER(1) " UNION ALL " OUTBOX_RING_MEMBER(2)                 \
	" UNION ALL " OUTBOX_RING_MEMBER(3) ")"
// held_param: the block_key parameter.
#define OUTBOX_RING_CANDIDATE_COLUMNS(held_param)                                                                     \
    "SELECT m.id, m.event_id::text, m.topic, m.key, m.payload, " \
    "       CASE WHEN jsonb_typeof(m.headers) = 'object' " \
    "            THEN ARRAY(SELECT h.key FROM jsonb_each_text(m.headers) h ORDER BY h.key) END, " \
    "       CASE WHEN jsonb_typeof(m.headers) = 'object' " \
    "            THEN ARRAY(SELECT h.value FROM jsonb_each_text(m.headers) h ORDER BY h.key) END, " \
    "       m.headers IS NOT NULL AND jsonb_typeof(m.headers) <> 'object', " \
    "       m.member, m.order_lsn, " \
    "       m.created_at, m.target_partition, m.ce_content_type, m.ce_type, m.ce_source, " \
    "       (coalesce(octet_length(m.payload), 0) + coalesce(octet_length(m.key), 0) " \
    "        + coalesce(octet_length(m.headers::text), 0))::bigint, " \
    "       m.key IS NOT NULL AND EXISTS (SELECT 1 FROM outbox.event_state s "                                        \
    "                                     WHERE s.topic = m.topic AND s.key = m.key "                              \
    "                                       AND (s.status = 'pending' OR (s.status = 'failed' AND " held_param ") " \
    "                                            OR s.id = m.id)) "
const char *const kMemberCandidatesSql =
    OUTBOX_RING_CANDIDATE_COLUMNS("$7")
    "FROM " OUTBOX_RING_MEMBERS " m "
    "WHERE (m.order_lsn, m.id) > ($3::pg_lsn, $4::bigint) AND m.order_lsn < $5::pg_lsn "
    "  AND (m.lane::integer % $1 + $1) % $1 = $2 "
    "ORDER BY m.order_lsn, m.id "
    "LIMIT $6";

// Candidates (2): rows of committed holes ($3 xids, $4 lowest stamps, $5/$6 how far each was
// walked) of the slot's lanes after the lowest place a hole's walk stands at ($11, $12) and at or
// below the window's end ($7, $8: at most the cursor, kHoleWindowSql), in (order_lsn, id) order
// over every hole (so a key's rows of two holes keep their commit order), at most $9, in the
// layout of (3). One range scan of the window for all the holes, joined to them by writer (it
// has no index): a scan per hole would cost the window once per hole, and enough holes would
// pass statement_timeout at every claim and never move on.
const char *const kHoleCandidatesSql =
    OUTBOX_RING_CANDIDATE_COLUMNS("$10")
    "FROM (SELECT w.* FROM " OUTBOX_RING_MEMBERS " w "
    "      JOIN unnest($3::xid8[], $4::pg_lsn[], $5::pg_lsn[], $6::bigint[]) AS h(xid, from_lsn, walked_lsn, walked_id) "
    "        ON w.writer = h.xid "
    "      WHERE (w.order_lsn, w.id) > ($11::pg_lsn, $12::bigint) AND (w.order_lsn, w.id) <= ($7::pg_lsn, $8::bigint) "
    "        AND w.order_lsn >= h.from_lsn AND (w.order_lsn, w.id) > (h.walked_lsn, h.walked_id) "
    "        AND (w.lane::integer % $1 + $1) % $1 = $2) m "
    "ORDER BY m.order_lsn, m.id "
    "LIMIT $9";
// The end of (2)'s window: the $5-th member row (every lane) after ($1, $2), at most the cursor
// ($3, $4). The walk of committed holes reads no further in one claim: a hole of a writer that
// was open long may lie below a long range of other rows, and its walk would otherwise read all
// of them in one statement (under statement_timeout, and again at each claim if it is cut).
#define OUTBOX_RING_POSITIONS(n) "SELECT e.order_lsn, e.id FROM outbox.events_" #n " e"
const char *const kHoleWindowSql =
    "SELECT m.order_lsn, m.id FROM (" OUTBOX_RING_POSITIONS(0) " UNION ALL " OUTBOX_RING_POSITIONS(1)
    " UNION ALL " OUTBOX_RING_POSITIONS(2) " UNION ALL " OUTBOX_RING_POSITIONS(3) ") m "
    "WHERE (m.order_lsn, m.id) > ($1::pg_lsn, $2::bigint) AND (m.order_lsn, m.id) <= ($3::pg_lsn, $4::bigint) "
    "ORDER BY m.order_lsn, m.id OFFSET $5 LIMIT 1";
#undef OUTBOX_RING_POSITIONS

// exactly_once (DESIGN.md "Exactly once", "A change of outbox.workers"): what the slots of other
// counts handled, as floors of this slot's walks. By the ring's invariant every slot, of any count
// and however long ago it ran, has handled every committed row of its lanes at or below its cursor
// (published it, copied it into event_state, or carries it as a row of one of its holes), and of
// its holes' rows those at or below the hole's walked position. One entry per such slot (x = 0:
// every writer but its holes', up to its cursor) and per hole of it (x: that writer's rows, up to
// where its walk got). A row an entry covers was handled, so leaving it out loses nothing; every
// count is taken, not only those kCursorCreateSql starts from, because a slot of a middle count
// that lagged leaves rows below an older count's cursor that only that older count's entry covers.
// The new slot starts at the lowest old cursor; without these it would send the rows between it
// and a lane's own old cursor again.
const char *const kOldFloorsSql = R"SQL(
SELECT c.n_workers, c.worker, '0'::xid8, c.order_lsn, c.id
FROM outbox.cursors c WHERE c.n_workers <> $1
UNION ALL
SELECT c.n_workers, c.worker, u.x, u.l, u.i
FROM outbox.cursors c, unnest(c.hole_xids, c.hole_walked_lsns, c.hole_walked_ids) AS u(x, l, i)
WHERE c.n_workers <> $1
)SQL";

// The rows of `alias` that an old slot handled (kOldFloorsSql's entries in parameters n .. n+4).
#define OUTBOX_RING_NOT_HANDLED(alias, n, n1, n2, n3, n4)                                                             \
	"  AND NOT EXISTS (SELECT 1 FROM unnest($" #n "::integer[], $" #n1 "::integer[], $" #n2 "::xid8[], $" #n3          \
	"::pg_lsn[], $" #n4 "::bigint[]) AS f(n, w, x, l, i) "                                                             \
	"      WHERE (" alias ".lane::integer % f.n + f.n) % f.n = f.w AND (" alias ".order_lsn, " alias ".id) <= (f.l, f.i) " \
	"        AND (f.x = " alias ".writer OR (f.x = '0'::xid8 AND NOT EXISTS ("                                          \
	"             SELECT 1 FROM unnest($" #n "::integer[], $" #n1 "::integer[], $" #n2 "::xid8[]) AS g(n, w, x) "       \
	"             WHERE g.n = f.n AND g.w = f.w AND g.x = " alias ".writer)))) "
const char *const kMemberCandidatesFloorSql =
    OUTBOX_RING_CANDIDATE_COLUMNS("$7")
    "FROM " OUTBOX_RING_MEMBERS " m "
    "WHERE (m.order_lsn, m.id) > ($3::pg_lsn, $4::bigint) AND m.order_lsn < $5::pg_lsn "
    "  AND (m.lane::integer % $1 + $1) % $1 = $2 "
    OUTBOX_RING_NOT_HANDLED("m", 8, 9, 10, 11, 12)
    "  AND (m.order_lsn, m.id) <= ($13::pg_lsn, $14::bigint) "
    "ORDER BY m.order_lsn, m.id "
    "LIMIT $6";
const char *const kHoleCandidatesFloorSql =
    OUTBOX_RING_CANDIDATE_COLUMNS("$10")
    "FROM (SELECT w.* FROM " OUTBOX_RING_MEMBERS " w "
    "      JOIN unnest($3::xid8[], $4::pg_lsn[], $5::pg_lsn[], $6::bigint[]) AS h(xid, from_lsn, walked_lsn, walked_id) "
    "        ON w.writer = h.xid "
    "      WHERE (w.order_lsn, w.id) > ($11::pg_lsn, $12::bigint) AND (w.order_lsn, w.id) <= ($7::pg_lsn, $8::bigint) "
    "        AND w.order_lsn >= h.from_lsn AND (w.order_lsn, w.id) > (h.walked_lsn, h.walked_id) "
    "        AND (w.lane::integer % $1 + $1) % $1 = $2 "
    OUTBOX_RING_NOT_HANDLED("w", 13, 14, 15, 16, 17)
    ") m "
    "ORDER BY m.order_lsn, m.id "
    "LIMIT $9";
#undef OUTBOX_RING_NOT_HANDLED
#undef OUTBOX_RING_CANDIDATE_COLUMNS
#undef OUTBOX_RING_MEMBERS
#undef OUTBOX_RING_MEMBER

// Where events landed: one row per run of consecutive offsets of a (member, topic, partition);
// $5/$6 give each event's run and id in offset order.
const char *const kLandedSql = R"SQL(
INSERT INTO outbox.landed (member, topic, kafka_partition, first_offset, ids, published_at)
SELECT r.member, r.topic, r.kafka_partition, r.first_offset, g.ids, statement_timestamp()
FROM unnest($1::smallint[], $2::text[], $3::integer[], $4::bigint[]) WITH ORDINALITY
     AS r(member, topic, kafka_partition, first_offset, run)
JOIN (SELECT e.run, array_agg(e.id ORDER BY e.ord) AS ids
      FROM unnest($5::bigint[], $6::bigint[]) WITH ORDINALITY AS e(run, id, ord)
      GROUP BY e.run) g ON g.run = r.run
)SQL";

// A published event_state row goes (the event is published when a landed row names it and it
// has no event_state row).
const char *const kStateDeleteSql = R"SQL(
DELETE FROM outbox.event_state s WHERE s.id = ANY ($1::bigint[]) AND s.status = 'pending'
)SQL";

// The other outcomes of event_state rows, as relay_sql.cpp's kRecordSql writes them on 0.3.0
// (the same clamps, backoff and jitter); a requeued row is left as it is.
const char *const kStateUpdateSql = R"SQL(
WITH o AS (
	SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[]) AS o(id, outcome, error)
), updated AS (
	UPDATE outbox.event_state e SET
		status = CASE o.outcome
		           WHEN 'r' THEN CASE WHEN greatest(least(e.attempts, 999999), 0) + 1 >= $4 THEN 'failed' ELSE 'pending' END
		           WHEN 'x' THEN 'failed'
		           ELSE 'pending' END,
		attempts = CASE WHEN o.outcome = 'r' THEN greatest(least(e.attempts, 999999), 0) + 1 ELSE e.attempts END,
		last_error = coalesce(o.error, e.last_error),
		next_attempt_at = CASE o.outcome
		    WHEN 'r' THEN statement_timestamp() + make_interval(secs => least($6::float8, $5::float8 * power(2::float8, greatest(0, least(e.attempts, 30))::float8))
		                                               * (0.5::float8 + random() / 2::float8) / 1000.0::float8)
		    WHEN 'd' THEN statement_timestamp() + make_interval(secs => $7::float8 / 1000.0::float8)
		    ELSE NULL END
	FROM o
	WHERE e.id = o.id AND e.status = 'pending'
	RETURNING e.event_id, e.topic, e.status, e.attempts, e.last_error
)
SELECT event_id::text, topic, status, attempts, last_error FROM updated
)SQL";

// Member rows into event_state, copied from their member by (order_lsn, id) (the order index):
// 'h' held behind its key and 'q' passed unpublished (pending, due now), 'r' a first attempt
// refused (backoff, or failed at max_attempts = 1), 'd' deferred, 'x' quarantined (failed).
#define OUTBOX_RING_SOURCE(n)                                                                                         \
	"SELECT o.outcome, o.error, o.member, e.id, e.event_id, e.topic, e.key, e.lane, e.payload, e.headers, "           \
	"e.created_at, e.order_lsn, e.writer, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source "             \
	"FROM o JOIN outbox.events_" #n " e ON e.order_lsn = o.order_lsn AND e.id = o.id WHERE o.member = " #n
const char *const kStateInsertSql =
    "WITH o AS ("
    "  SELECT * FROM unnest($1::bigint[], $2::smallint[], $3::pg_lsn[], $4::text[], $5::text[]) "
    "    AS o(id, member, order_lsn, outcome, error)"
    "), src AS (" OUTBOX_RING_SOURCE(0) " UNION ALL " OUTBOX_RING_SOURCE(1) " UNION ALL " OUTBOX_RING_SOURCE(2)
    " UNION ALL " OUTBOX_RING_SOURCE(3) "), inserted AS ("
    "  INSERT INTO outbox.event_state (id, member, event_id, topic, key, lane, payload, headers, created_at, "
    "      order_lsn, member_lsn, writer, target_partition, ce_content_type, ce_type, ce_source, status, attempts, "
    "      next_attempt_at, last_error) "
    "  SELECT src.id, src.member, src.event_id, src.topic, src.key, src.lane, src.payload, src.headers, "
    "      src.created_at, src.order_lsn, src.order_lsn, src.writer, src.target_partition, src.ce_content_type, src.ce_type, "
    "      src.ce_source, "
    "      CASE src.outcome WHEN 'x' THEN 'failed' WHEN 'r' THEN CASE WHEN 1 >= $6 THEN 'failed' ELSE 'pending' END "
    "                       ELSE 'pending' END, "
    "      CASE WHEN src.outcome = 'r' THEN 1 ELSE 0 END, "
    "      CASE src.outcome "
    "        WHEN 'r' THEN statement_timestamp() + make_interval(secs => least($8::float8, $7::float8) "
    "                                               * (0.5::float8 + random() / 2::float8) / 1000.0::float8) "
    "        WHEN 'd' THEN statement_timestamp() + make_interval(secs => $9::float8 / 1000.0::float8) "
    "        ELSE NULL END, "
    "      src.error "
    "  FROM src "
    "  ON CONFLICT (id) DO NOTHING "
    "  RETURNING event_id, topic, status, attempts, last_error"
    ") SELECT event_id::text, topic, status, attempts, last_error FROM inserted";
#undef OUTBOX_RING_SOURCE

const char *const kNextRetrySql =
    "SELECT (extract(epoch FROM least(min(next_attempt_at), now() + interval '1 hour') - now()) * 1000::numeric)"
    "::bigint FROM outbox.event_state "
    "WHERE status = 'pending' AND next_attempt_at IS NOT NULL AND next_attempt_at > now() "
    "AND (lane::integer % $1 + $1) % $1 = $2";

Statement rebase_needed_stmt = {kRebaseNeededSql, 1, {INT8OID}, 0, nullptr};
Statement rebase_stmt = {kRebaseSql, 0, {}, 0, nullptr};
Statement cursor_lock_stmt = {kCursorLockSql, 2, {INT4OID, INT4OID}, 0, nullptr};
Statement cursor_create_stmt = {kCursorCreateSql, 3, {INT4OID, INT4OID, INT8OID}, 0, nullptr};
Statement cursor_move_stmt = {kCursorMoveSql,
                              8,
                              {INT4OID, INT4OID, PG_LSNOID, INT8OID, XID8ARRAYOID, PG_LSNARRAYOID, PG_LSNARRAYOID,
                               INT8ARRAYOID},
                              0,
                              nullptr};
Statement hole_status_stmt = {kHoleStatusSql, 1, {XID8ARRAYOID}, 0, nullptr};
Statement state_candidates_stmt = {kStateCandidatesSql, 4, {INT4OID, INT4OID, INT4OID, BOOLOID}, 0, nullptr};
Statement state_lock_stmt = {kStateLockSql, 1, {TIDARRAYOID}, 0, nullptr};
// Generic plans: a merge of index walks, whatever the parameters (a custom plan made on a cold
// table could choose otherwise and keep it).
Statement member_candidates_stmt = {
    kMemberCandidatesSql, 7, {INT4OID, INT4OID, PG_LSNOID, INT8OID, PG_LSNOID, INT4OID, BOOLOID},
    CURSOR_OPT_GENERIC_PLAN, nullptr};
Statement hole_candidates_stmt = {kHoleCandidatesSql,
                                 12,
                                 {INT4OID, INT4OID, XID8ARRAYOID, PG_LSNARRAYOID, PG_LSNARRAYOID, INT8ARRAYOID,
                                  PG_LSNOID, INT8OID, INT4OID, BOOLOID, PG_LSNOID, INT8OID},
                                 CURSOR_OPT_GENERIC_PLAN,
                                 nullptr};
Statement old_floors_stmt = {kOldFloorsSql, 1, {INT4OID}, 0, nullptr};
// The floors' parameters: old slots' counts, workers, writers, positions.
#define OUTBOX_FLOOR_TYPES INT4ARRAYOID, INT4ARRAYOID, XID8ARRAYOID, PG_LSNARRAYOID, INT8ARRAYOID
// With the walk's window ($13, $14): the rows the floors leave out are read but not returned, so
// one statement reads no more of them than kHoleWindowPerBatchRow per row of batch_size.
Statement member_floor_candidates_stmt = {
    kMemberCandidatesFloorSql, 14,
    {INT4OID, INT4OID, PG_LSNOID, INT8OID, PG_LSNOID, INT4OID, BOOLOID, OUTBOX_FLOOR_TYPES, PG_LSNOID, INT8OID},
    CURSOR_OPT_GENERIC_PLAN, nullptr};
Statement hole_floor_candidates_stmt = {kHoleCandidatesFloorSql,
                                       17,
                                       {INT4OID, INT4OID, XID8ARRAYOID, PG_LSNARRAYOID, PG_LSNARRAYOID, INT8ARRAYOID,
                                        PG_LSNOID, INT8OID, INT4OID, BOOLOID, PG_LSNOID, INT8OID, OUTBOX_FLOOR_TYPES},
                                       CURSOR_OPT_GENERIC_PLAN,
                                       nullptr};
#undef OUTBOX_FLOOR_TYPES
Statement hole_window_stmt = {
    kHoleWindowSql, 5, {PG_LSNOID, INT8OID, PG_LSNOID, INT8OID, INT8OID}, CURSOR_OPT_GENERIC_PLAN, nullptr};
// How many member rows (2) reads past the lowest progress of the committed holes in one claim,
// per row of batch_size (1,000,000 at the default 20,000): the window moves on by as much at each
// claim, even one that finds no row of a hole in it.
constexpr int64 kHoleWindowPerBatchRow = 50;
// The same for (3)'s window while exactly_once's floors apply (100,000 rows at the default
// batch_size): every such claim reads it first, so smaller; a walk that took all of it moves the
// cursor to its end and the worker claims again at once.
constexpr int64 kFloorWindowPerBatchRow = 5;
Statement landed_stmt = {kLandedSql,
                         6,
                         {INT2ARRAYOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID},
                         CURSOR_OPT_GENERIC_PLAN,
                         nullptr};
Statement state_delete_stmt = {kStateDeleteSql, 1, {INT8ARRAYOID}, CURSOR_OPT_GENERIC_PLAN, nullptr};
Statement state_update_stmt = {kStateUpdateSql,
                               7,
                               {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4OID, INT4OID, INT4OID, INT8OID},
                               CURSOR_OPT_GENERIC_PLAN,
                               nullptr};
Statement state_insert_stmt = {
    kStateInsertSql,
    9,
    {INT8ARRAYOID, INT2ARRAYOID, PG_LSNARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4OID, INT4OID, INT4OID, INT8OID},
    CURSOR_OPT_GENERIC_PLAN,
    nullptr};
Statement next_retry_stmt = {kNextRetrySql, 2, {INT4OID, INT4OID}, 0, nullptr};

// The members' oids, found by the step's table check (RingTablesProblem) for the claim's view.
Oid member_oids[kMembers];

// An empty walk moves the cursor to W only once this much WAL lies between them: otherwise
// every idle claim would write the cursor, whose own WAL moves W again.
// (Rows of other slots' lanes in that range are read again by each claim until then.)
constexpr XLogRecPtr kIdleCursorSlackBytes = 64 * 1024;

struct Position {
	XLogRecPtr order_lsn;
	int64 id;
};

bool
Before(Position a, Position b) {
	return a.order_lsn < b.order_lsn || (a.order_lsn == b.order_lsn && a.id < b.id);
}

// A member row the walk consumed (sent in the batch, or held into event_state).
struct Walked {
	Position at;
	int event; // index into the batch, or -1: held
};

// A hole of the slot: an open writer (by its top-level xid) that the cursor passed, whose rows
// from its lowest stamp up to the cursor are walked once it committed ((2) of the claim).
enum class HoleState : char {
	Open,      // in progress in the claim's snapshot: kept
	Committed, // walked in this claim, from `walked`
	Aborted,   // dropped
};
struct Hole {
	uint64 xid;        // xid8
	XLogRecPtr from;   // its lowest stamp
	Position walked;   // how far its walk got ({0, 0}: not begun)
	HoleState state;
};

// The claim's state kept for its record (in the batch's memory context: the claim's
// transaction is open until RingRecordOutcomes).
struct RingClaimState {
	LaneSet lanes;
	Position cursor;  // the slot's cursor at the claim
	XLogRecPtr horizon; // W, the WAL insert position of the claim's view: (3) stops below it
	bool to_horizon;  // the walk took every row of the slot below W
	// exactly_once's floors (UseOldFloors): (3) reads at most up to walk_end, the window's end;
	// to_walk_end: it took every row there that the floors leave in, so the cursor goes there.
	Position walk_end;
	bool to_walk_end;
	int n_state;      // batch events [0, n_state) are event_state rows, the rest member rows
	int16 *member;    // per batch event
	XLogRecPtr *order_lsn;
	Walked *walked;   // member rows consumed, in order: first those of (2), then those of (3)
	int n_walked;
	int n_hole_walked; // walked[0 .. n_hole_walked) are rows of committed holes
	bool holes_walked; // (2) reached the end of every committed hole uncut (or there was none)
	bool window_uncut; // (2) took every row of the committed holes up to window_end
	Position window_end; // how far (2) looked this claim (the cursor, or short of it: kHoleWindowSql)
	Hole *holes;      // the slot's holes at the claim
	int n_holes;
	OpenWriter *open; // the open writers of the claim's view (in progress in its snapshot)
	int n_open;
} ring;

// exactly_once: the old counts' floors of this worker's slot (kOldFloorsSql), read at its first
// claim in this process (the old counts' rows no longer move: their workers are gone, and a
// zombie's batch is fenced). Kept in TopMemoryContext as the statements' parameters; `end`: the
// highest of them, past which the slot's cursor needs none.
struct OldFloors {
	bool loaded;
	int n;
	Datum counts, workers, writers, lsns, ids; // arrays
	Position end;
} old_floors;

void
LoadOldFloors(const LaneSet &lanes) {
	Datum count_value[1] = {Int32GetDatum(lanes.n_workers)};
	step::Execute("claim", old_floors_stmt, count_value, nullptr, SPI_OK_SELECT);
	int n = int(SPI_processed);
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
	Datum *counts = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
	Datum *workers = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
	Datum *writers = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
	Datum *lsns = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
	Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
	Position end{InvalidXLogRecPtr, PG_INT64_MIN};
	bool isnull;
	for (int k = 0; k < n; k++) {
		HeapTuple row = SPI_tuptable->vals[k];
		TupleDesc desc = SPI_tuptable->tupdesc;
		counts[k] = SPI_getbinval(row, desc, 1, &isnull);
		workers[k] = SPI_getbinval(row, desc, 2, &isnull);
		writers[k] = SPI_getbinval(row, desc, 3, &isnull);
		lsns[k] = SPI_getbinval(row, desc, 4, &isnull);
		ids[k] = SPI_getbinval(row, desc, 5, &isnull);
		Position at{DatumGetLSN(lsns[k]), DatumGetInt64(ids[k])};
		if (Before(end, at)) {
			end = at;
		}
	}
	old_floors = OldFloors{true,
	                       n,
	                       step::ArrayOf(counts, n, INT4OID),
	                       step::ArrayOf(workers, n, INT4OID),
	                       step::ArrayOf(writers, n, XID8OID),
	                       step::ArrayOf(lsns, n, PG_LSNOID),
	                       step::ArrayOf(ids, n, INT8OID),
	                       end};
	MemoryContextSwitchTo(old);
}

// Whether this claim's walks must leave out what the old counts' slots handled.
bool
UseOldFloors() {
	return settings.delivery == int(Delivery::ExactlyOnce) && old_floors.loaded && old_floors.n > 0 &&
	       !Before(old_floors.end, ring.cursor);
}

// Runs a walk's statement in `snapshot`: `plain` with its n values, or, while the old counts'
// floors apply, `floored` with the floors' five arrays after them.
//
// `tail` (n_tail values) follows the floors in `floored`'s parameters.
void
ExecuteWalk(Statement &plain, Statement &floored, const Datum *values, int n, Snapshot snapshot,
            const Datum *tail = nullptr, int n_tail = 0) {
	if (!UseOldFloors()) {
		step::ExecuteIn("claim", plain, const_cast<Datum *>(values), nullptr, SPI_OK_SELECT, snapshot);
		return;
	}
	Datum with_floors[lengthof(Statement{}.types)];
	Assert(n + 5 + n_tail == floored.nargs);
	for (int t = 0; t < n_tail; t++) {
		with_floors[n + 5 + t] = tail[t];
	}
	memcpy(with_floors, values, sizeof(Datum) * n);
	with_floors[n] = old_floors.counts;
	with_floors[n + 1] = old_floors.workers;
	with_floors[n + 2] = old_floors.writers;
	with_floors[n + 3] = old_floors.lsns;
	with_floors[n + 4] = old_floors.ids;
	step::ExecuteIn("claim", floored, with_floors, nullptr, SPI_OK_SELECT, snapshot);
}

Datum
LsnArray(const XLogRecPtr *lsns, int n) {
	Datum *d = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
	for (int i = 0; i < n; i++) {
		d[i] = LSNGetDatum(lsns[i]);
	}
	return step::ArrayOf(d, n, PG_LSNOID);
}

// Text array with NULL elements (errors of outcomes that have none).
Datum
NullableTextArray(const char *const *texts, int n) {
	Datum *d = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
	bool *nulls = static_cast<bool *>(palloc(sizeof(bool) * (n > 0 ? n : 1)));
	for (int i = 0; i < n; i++) {
		nulls[i] = texts[i] == nullptr;
		d[i] = texts[i] ? CStringGetTextDatum(texts[i]) : Datum(0);
	}
	int dims[1] = {n};
	int lbs[1] = {1};
	return PointerGetDatum(construct_md_array(d, nulls, 1, dims, lbs, TEXTOID, -1, false, TYPALIGN_INT));
}

// Logs the rows a record statement moved to failed (columns: event_id, topic, status, attempts,
// last_error) once, as 0.3.0's record does; returns how many.
int
LogFailed(SPITupleTable *rows, uint64 n) {
	int failed = 0;
	for (uint64 i = 0; i < n; i++) {
		HeapTuple tuple = rows->vals[i];
		TupleDesc desc = rows->tupdesc;
		char *status = SPI_getvalue(tuple, desc, 3);
		if (status == nullptr || strcmp(status, "failed") != 0) {
			continue;
		}
		failed++;
		// Not the key: it is the caller's data; the event id finds the row.
		ereport(LOG, (errmsg("outbox relay: event %s (topic %s) moved to failed after %s attempts: %s",
		                     SPI_getvalue(tuple, desc, 1), SPI_getvalue(tuple, desc, 2), SPI_getvalue(tuple, desc, 4),
		                     SPI_getvalue(tuple, desc, 5)),
		              errhint("It is in outbox.failed; fix the cause, then SELECT outbox.retry(event_id).")));
	}
	return failed;
}

// Member rows into event_state with their outcome (kStateInsertSql); returns how many failed.
int
InsertState(const int64 *ids, const int16 *members, const XLogRecPtr *lsns, const char *outcomes,
            const char *const *errors, int n, long defer_ms) {
	if (n == 0) {
		return 0;
	}
	Datum *id_d = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *member_d = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *outcome_d = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	for (int k = 0; k < n; k++) {
		char kind[2] = {outcomes[k], '\0'};
		id_d[k] = Int64GetDatum(ids[k]);
		member_d[k] = Int16GetDatum(members[k]);
		outcome_d[k] = CStringGetTextDatum(kind);
	}
	Datum values[9] = {step::ArrayOf(id_d, n, INT8OID),
	                   step::ArrayOf(member_d, n, INT2OID),
	                   LsnArray(lsns, n),
	                   step::ArrayOf(outcome_d, n, TEXTOID),
	                   NullableTextArray(errors, n),
	                   Int32GetDatum(settings.max_attempts),
	                   Int32GetDatum(settings.backoff_base_ms),
	                   Int32GetDatum(settings.backoff_max_ms),
	                   Int64GetDatum(int64(defer_ms))};
	step::Execute("record", state_insert_stmt, values, nullptr, SPI_OK_SELECT);
	return LogFailed(SPI_tuptable, SPI_processed);
}

// The slot's cursor row at the record, written only when it changes: the cursor to `to` (only
// forward), and the holes. The first `hole_end` walked rows of (2) were consumed: a committed
// hole is dropped when (2) reached every committed hole's end and all of it was consumed, else
// its walk goes on after the last row consumed (the walk is one (order_lsn, id) order over every
// committed hole, so each hole's rows up to there were consumed); an aborted hole is dropped; an
// open writer of the view whose lowest stamp is at or below the new cursor becomes a hole (one
// per xid): a row of it below the cursor is not visible in the snapshot the cursor passed it in.
// Returns whether the claim moved on through rows: the walk passed some (taken or held), or a
// committed hole's walk went on or ended, or an aborted one was dropped. Not a move of the cursor
// to the WAL horizon over no row, nor a new hole: those follow the WAL the cluster (and the claim
// itself) writes, so a claim cut with nothing taken could repeat them without end.
bool
RecordCursor(Position to, int hole_end) {
	if (Before(to, ring.cursor)) {
		to = ring.cursor;
	}
	bool changed = Before(ring.cursor, to);
	bool moved_on = ring.n_walked > 0 || (ring.to_walk_end && Before(ring.cursor, to));
	bool consumed_all = hole_end == ring.n_hole_walked;
	bool walked_all = ring.holes_walked && consumed_all;
	// Every row of the committed holes up to walked_to was consumed: the last one consumed, or the
	// window's end when (2) took all it held.
	Position walked_to = hole_end > 0 ? ring.walked[hole_end - 1].at : Position{0, 0};
	bool advanced = hole_end > 0;
	if (consumed_all && ring.window_uncut) {
		walked_to = ring.window_end;
		advanced = true;
	}
	int room = ring.n_holes + ring.n_open + 1;
	Datum *xids = static_cast<Datum *>(palloc(sizeof(Datum) * room));
	Datum *froms = static_cast<Datum *>(palloc(sizeof(Datum) * room));
	Datum *walked_lsns = static_cast<Datum *>(palloc(sizeof(Datum) * room));
	Datum *walked_ids = static_cast<Datum *>(palloc(sizeof(Datum) * room));
	int n = 0;
	for (int h = 0; h < ring.n_holes; h++) {
		Hole hole = ring.holes[h];
		if (hole.state == HoleState::Aborted || (hole.state == HoleState::Committed && walked_all)) {
			changed = moved_on = true;
			continue;
		}
		if (hole.state == HoleState::Committed && advanced && Before(hole.walked, walked_to)) {
			hole.walked = walked_to;
			changed = moved_on = true;
		}
		xids[n] = UInt64GetDatum(hole.xid);
		froms[n] = LSNGetDatum(hole.from);
		walked_lsns[n] = LSNGetDatum(hole.walked.order_lsn);
		walked_ids[n++] = Int64GetDatum(hole.walked.id);
	}
	for (int o = 0; o < ring.n_open; o++) {
		uint64 xid = U64FromFullTransactionId(ring.open[o].fxid);
		bool known = false;
		for (int h = 0; h < ring.n_holes && !known; h++) {
			known = ring.holes[h].xid == xid;
		}
		if (known || ring.open[o].lowest > to.order_lsn) {
			continue;
		}
		xids[n] = UInt64GetDatum(xid);
		froms[n] = LSNGetDatum(ring.open[o].lowest);
		walked_lsns[n] = LSNGetDatum(InvalidXLogRecPtr);
		walked_ids[n++] = Int64GetDatum(0);
		changed = true;
	}
	if (!changed) {
		return false;
	}
	Datum values[8] = {Int32GetDatum(ring.lanes.n_workers), Int32GetDatum(ring.lanes.worker),
	                   LSNGetDatum(to.order_lsn),           Int64GetDatum(to.id),
	                   step::ArrayOf(xids, n, XID8OID),     step::ArrayOf(froms, n, PG_LSNOID),
	                   step::ArrayOf(walked_lsns, n, PG_LSNOID), step::ArrayOf(walked_ids, n, INT8OID)};
	step::Execute("record", cursor_move_stmt, values, nullptr, SPI_OK_UPDATE);
	return moved_on;
}

// Where the cursor goes when the walk was not stopped: past the last row of (3) consumed, and to
// W when (3) took every row of the slot below it (an empty walk: only when W is far enough
// ahead, kIdleCursorSlackBytes).
Position
CursorAfterWalk() {
	int n_after = ring.n_walked - ring.n_hole_walked;
	Position to = n_after > 0 ? ring.walked[ring.n_walked - 1].at : ring.cursor;
	if (ring.to_walk_end && Before(to, ring.walk_end)) {
		to = ring.walk_end; // past rows that other counts' slots handled
	}
	Position horizon{ring.horizon, 0};
	if (ring.to_horizon && Before(to, horizon) &&
	    (n_after > 0 || ring.horizon - ring.cursor.order_lsn >= kIdleCursorSlackBytes)) {
		to = horizon;
	}
	return to;
}

// The elements of an 8-byte array column of the cursor row (xid8, pg_lsn, bigint).
uint64 *
Elements8(Datum array, Oid type, int *n) {
	Datum *values;
	bool *nulls;
	deconstruct_array(DatumGetArrayTypeP(array), type, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &values, &nulls, n);
	auto *out = static_cast<uint64 *>(palloc(sizeof(uint64) * (*n + 1)));
	for (int i = 0; i < *n; i++) {
		out[i] = nulls[i] ? 0 : DatumGetUInt64(values[i]);
	}
	return out;
}

// Consumes candidate rows of (2) or (3) (kMemberCandidatesSql's layout) into the batch, in
// order, within the byte budget (the batch's first row always fits); a row held behind its key
// is noted for event_state. Returns how many rows were consumed.
int
TakeRows(SPITupleTable *rows, int n_rows, MemoryContext into, Batch *batch, int64 *bytes, int64 *held_ids,
         int16 *held_members, XLogRecPtr *held_lsns, int *n_held) {
	bool isnull;
	int k = 0;
	for (; k < n_rows && (*bytes < settings.batch_max_bytes || batch->n == 0); k++) {
		HeapTuple row = rows->vals[k];
		Position at{DatumGetLSN(SPI_getbinval(row, rows->tupdesc, 10, &isnull)),
		            DatumGetInt64(SPI_getbinval(row, rows->tupdesc, 1, &isnull))};
		int16 member = DatumGetInt16(SPI_getbinval(row, rows->tupdesc, 9, &isnull));
		if (DatumGetBool(SPI_getbinval(row, rows->tupdesc, 17, &isnull))) {
			held_ids[*n_held] = at.id;
			held_members[*n_held] = member;
			held_lsns[(*n_held)++] = at.order_lsn;
			ring.walked[ring.n_walked++] = Walked{at, -1};
			continue;
		}
		*bytes += DatumGetInt64(SPI_getbinval(row, rows->tupdesc, 16, &isnull));
		MemoryContext old = MemoryContextSwitchTo(into);
		step::CopyClaimedRow(row, rows->tupdesc, batch->events[batch->n]);
		MemoryContextSwitchTo(old);
		ring.member[batch->n] = member;
		ring.order_lsn[batch->n] = at.order_lsn;
		ring.walked[ring.n_walked++] = Walked{at, batch->n};
		batch->n++;
	}
	return k;
}

int
CompareInt64(const void *a, const void *b) {
	int64 x = *static_cast<const int64 *>(a), y = *static_cast<const int64 *>(b);
	return x < y ? -1 : x > y;
}

// The locked event_state rows (kStateLockSql) taken in candidate order into the batch: every
// locked candidate except those behind a candidate of their (topic, key) that was not locked
// (or changed since it was read). Returns how many.
int
TakeLockedState(SPITupleTable *candidates, int n_candidates, SPITupleTable *locked, int n_locked,
                MemoryContext into, ClaimedEvent *events) {
	bool isnull;
	// Locked rows' ids, sorted with their row numbers (id in the high bits is not possible: a
	// pair array sorted by id).
	int64 *pairs = static_cast<int64 *>(palloc(sizeof(int64) * 2 * (n_locked > 0 ? n_locked : 1)));
	for (int j = 0; j < n_locked; j++) {
		pairs[2 * j] = DatumGetInt64(SPI_getbinval(locked->vals[j], locked->tupdesc, 1, &isnull));
		pairs[2 * j + 1] = j;
	}
	qsort(pairs, n_locked, 2 * sizeof(int64), CompareInt64);
	char **stopped_topics = static_cast<char **>(palloc(sizeof(char *) * (n_candidates > 0 ? n_candidates : 1)));
	char **stopped_keys = static_cast<char **>(palloc(sizeof(char *) * (n_candidates > 0 ? n_candidates : 1)));
	int n_stopped = 0, n = 0;
	for (int i = 0; i < n_candidates; i++) {
		HeapTuple tuple = candidates->vals[i];
		int64 id = DatumGetInt64(SPI_getbinval(tuple, candidates->tupdesc, 2, &isnull));
		// Binary search over the pairs (the comparator reads the first element of a pair).
		int64 *at = static_cast<int64 *>(bsearch(&id, pairs, n_locked, 2 * sizeof(int64), CompareInt64));
		HeapTuple row = nullptr;
		if (at != nullptr) {
			row = locked->vals[at[1]];
			ItemPointer was = reinterpret_cast<ItemPointer>(DatumGetPointer(SPI_getbinval(tuple, candidates->tupdesc, 1, &isnull)));
			ItemPointer now = reinterpret_cast<ItemPointer>(DatumGetPointer(SPI_getbinval(row, locked->tupdesc, 16, &isnull)));
			if (!DatumGetBool(SPI_getbinval(row, locked->tupdesc, 17, &isnull)) || !ItemPointerEquals(was, now)) {
				row = nullptr;
			}
		}
		char *topic = SPI_getvalue(tuple, candidates->tupdesc, 3);
		char *key = SPI_getvalue(tuple, candidates->tupdesc, 4);
		bool behind = false;
		for (int k = 0; k < n_stopped && !behind; k++) {
			behind = SameTopicAndKey(topic, key, stopped_topics[k], stopped_keys[k]);
		}
		if (row == nullptr || behind) {
			if (key && !behind) {
				stopped_topics[n_stopped] = topic;
				stopped_keys[n_stopped++] = key;
			}
			continue;
		}
		MemoryContext old = MemoryContextSwitchTo(into);
		step::CopyClaimedRow(row, locked->tupdesc, events[n]);
		ring.member[n] = DatumGetInt16(SPI_getbinval(row, locked->tupdesc, 9, &isnull));
		ring.order_lsn[n] = DatumGetLSN(SPI_getbinval(row, locked->tupdesc, 10, &isnull));
		MemoryContextSwitchTo(old);
		n++;
	}
	return n;
}

} // namespace

bool
IsRingSchemaVersion(const char *version) {
	for (const char *ring_version : kRingSchemaVersions) {
		if (version != nullptr && strcmp(version, ring_version) == 0) {
			return true;
		}
	}
	return false;
}

const char *
RingTablesProblem(Oid ext, Oid nsp) {
	static const char *const names[] = {"events_0", "events_1", "events_2", "events_3",
	                                    "cursors",  "ring_start", "landed",  "event_state"};
	for (int t = 0; t < int(lengthof(names)); t++) {
		Oid rel = get_relname_relid(names[t], nsp);
		if (!OidIsValid(rel) || get_rel_relkind(rel) != RELKIND_RELATION ||
		    getExtensionOfObject(RelationRelationId, rel) != ext) {
			return psprintf("table outbox.%s is missing or not the extension's own (schema 0.4.0 on); the relay does "
			                "not touch the ring",
			                names[t]);
		}
		if (t < kMembers) {
			member_oids[t] = rel;
		}
	}
	return nullptr;
}

const char *
RingRightsProblem(Oid nsp, Oid role) {
	struct Need {
		const char *table;
		AclMode modes;
	} const needs[] = {
	    {"events_0", ACL_SELECT},   {"events_1", ACL_SELECT},
	    {"events_2", ACL_SELECT},   {"events_3", ACL_SELECT},
	    {"ring_start", ACL_SELECT}, {"cursors", ACL_SELECT | ACL_INSERT | ACL_UPDATE},
	    {"landed", ACL_INSERT},     {"event_state", ACL_SELECT | ACL_INSERT | ACL_UPDATE | ACL_DELETE},
	};
	for (const Need &need : needs) {
		Oid rel = get_relname_relid(need.table, nsp);
		if (!OidIsValid(rel) || pg_class_aclmask(rel, role, need.modes, ACLMASK_ALL) != need.modes) {
			return psprintf("lacks rights on outbox.%s that the ring's relay needs (SELECT on the members and "
			                "ring_start; SELECT, INSERT, UPDATE on cursors; INSERT on landed; SELECT, INSERT, "
			                "UPDATE, DELETE on event_state: ALTER EXTENSION outbox UPDATE grants them)",
			                need.table);
		}
	}
	// The claim re-bases cursors of another system (a restored dump) through it: without it the
	// relay would publish nothing after a restore.
	if (!step::CanExecute(nsp, role, "ring_rebase", nullptr, 0)) {
		return pstrdup("lacks EXECUTE on outbox.ring_rebase(), which the ring's claim calls when a cursor was made on "
		               "another system (ALTER EXTENSION outbox UPDATE grants it)");
	}
	// The retention round (worker 0, while outbox.retention is not 0) calls both; without them
	// every round would fail and roll back, and the ring would never be emptied.
	if (settings.retention_s > 0) {
		Oid interval_arg[] = {INTERVALOID};
		static const char *const functions[] = {"ring_retention", "ring_status"};
		for (const char *function : functions) {
			if (!step::CanExecute(nsp, role, function, interval_arg, lengthof(interval_arg))) {
				return psprintf("lacks EXECUTE on outbox.%s(interval), which the ring's retention calls (EXECUTE on "
				                "outbox.ring_retention(interval) and outbox.ring_status(interval): ALTER EXTENSION "
				                "outbox UPDATE grants them; with outbox.retention = 0 neither is needed)",
				                function);
			}
		}
	}
	return nullptr;
}

void
RingClaim(const LaneSet &lanes, MemoryContext into, Batch *batch, int batch_size) {
	ring = RingClaimState{};
	ring.lanes = lanes;
	batch->n = 0;
	bool isnull;
	// 0. Cursors of another system are re-based before anything reads them (all slots at once); a
	// slot's own cursor is made after that (kCursorCreateSql starts it at the others').
	Datum system_value[1] = {Int64GetDatum(int64(GetSystemIdentifier()))};
	step::Execute("claim", rebase_needed_stmt, system_value, nullptr, SPI_OK_SELECT);
	if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull))) {
		step::Execute("claim", rebase_stmt, nullptr, nullptr, SPI_OK_SELECT);
		Datum rebased = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull && DatumGetInt32(rebased) > 0) {
			old_floors.loaded = false; // every cursor moved: read them again
			// Committed by the caller with nothing claimed: the members' SHARE locks (enqueues wait
			// on them) go now, not after a publish. The re-base wakes the workers at its commit.
			return;
		}
		if (isnull) {
			// Not now (a slot in the middle of a batch, a writer open in a member, another worker
			// re-basing): nothing is claimed from a cursor that says nothing; asked again next claim.
			static TimestampTz warned_at = 0;
			TimestampTz now = GetCurrentTimestamp();
			if (warned_at == 0 || TimestampDifferenceExceeds(warned_at, now, 60 * 1000)) {
				warned_at = now;
				ereport(WARNING,
				        (errmsg("outbox relay: the relay cursors were made on another system (a restored dump, "
				                "pg_upgrade, pg_resetwal) and their re-base waits for a lock: nothing is published "
				                "until it runs"),
				         errhint("A transaction open in a ring member (a long or prepared one that enqueued), or "
				                 "another relay slot's batch, holds it off; it is tried again at every claim.")));
			}
			return;
		}
	}

	// 1. The slot's cursor row, created when missing.
	Datum slot_values[2] = {Int32GetDatum(lanes.n_workers), Int32GetDatum(lanes.worker)};
	step::Execute("claim", cursor_lock_stmt, slot_values, nullptr, SPI_OK_SELECT);
	if (SPI_processed == 0) {
		Datum create_values[3] = {slot_values[0], slot_values[1], system_value[0]};
		step::Execute("claim", cursor_create_stmt, create_values, nullptr, SPI_OK_INSERT);
		step::Execute("claim", cursor_lock_stmt, slot_values, nullptr, SPI_OK_SELECT);
		if (SPI_processed == 0) {
			return; // locked elsewhere: nothing this round
		}
	}
	HeapTuple cursor_row = SPI_tuptable->vals[0];
	TupleDesc cursor_desc = SPI_tuptable->tupdesc;
	ring.cursor.order_lsn = DatumGetLSN(SPI_getbinval(cursor_row, cursor_desc, 1, &isnull));
	ring.cursor.id = DatumGetInt64(SPI_getbinval(cursor_row, cursor_desc, 2, &isnull));
	int n_xids, n_froms, n_walked_lsns, n_walked_ids;
	uint64 *hole_xids = Elements8(SPI_getbinval(cursor_row, cursor_desc, 3, &isnull), XID8OID, &n_xids);
	uint64 *hole_froms = Elements8(SPI_getbinval(cursor_row, cursor_desc, 4, &isnull), PG_LSNOID, &n_froms);
	uint64 *hole_lsns = Elements8(SPI_getbinval(cursor_row, cursor_desc, 5, &isnull), PG_LSNOID, &n_walked_lsns);
	uint64 *hole_ids = Elements8(SPI_getbinval(cursor_row, cursor_desc, 6, &isnull), INT8OID, &n_walked_ids);
	// exactly_once: once per process, what the old counts' slots handled (nothing to read when the
	// worker runs at least once, whose duplicates after a change of outbox.workers are documented).
	if (settings.delivery == int(Delivery::ExactlyOnce) && !old_floors.loaded) {
		LoadOldFloors(lanes);
	}
	if (n_froms != n_xids || n_walked_lsns != n_xids || n_walked_ids != n_xids) {
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
		                errmsg("outbox relay: the holes of cursor %d of %d have arrays of different lengths",
		                       lanes.worker, lanes.n_workers)));
	}

	// 2. The claim's view: W (the WAL insert position), then the open writers in progress in its
	// snapshot S, then S. Every walk of the claim reads in S. A row below W that S does not show
	// and that will still commit is a row of one of those writers, at or above its lowest stamp
	// (open_writers.cpp; DESIGN.md "Why nothing committed is skipped"): (3) goes to W, and the
	// writers it passes become holes (RecordCursor).
	ClaimView view = TakeClaimView(MyDatabaseId, member_oids, kMembers);
	ring.horizon = view.wal_insert;
	MemoryContext old = MemoryContextSwitchTo(into);
	ring.open = static_cast<OpenWriter *>(palloc(sizeof(OpenWriter) * (view.n_open + 1)));
	memcpy(ring.open, view.open, sizeof(OpenWriter) * view.n_open);
	ring.n_open = view.n_open;
	ring.holes = static_cast<Hole *>(palloc(sizeof(Hole) * (n_xids + 1)));
	MemoryContextSwitchTo(old);
	// The slot's holes: in progress in S, committed (walked below), or aborted (dropped; a
	// transaction running at a crash is never marked aborted, but it is not in progress either,
	// and it committed nothing). One whose status is too old to tell is walked: only its rows
	// visible in S are taken.
	Datum *ended = static_cast<Datum *>(palloc(sizeof(Datum) * (n_xids + 1)));
	int *ended_at = static_cast<int *>(palloc(sizeof(int) * (n_xids + 1)));
	int n_ended = 0;
	for (int h = 0; h < n_xids; h++) {
		Hole &hole = ring.holes[ring.n_holes++];
		hole = Hole{hole_xids[h], XLogRecPtr(hole_froms[h]), Position{XLogRecPtr(hole_lsns[h]), int64(hole_ids[h])},
		            HoleState::Open};
		if (!InProgressIn(FullTransactionIdFromU64(hole.xid), view.snapshot)) {
			ended[n_ended] = UInt64GetDatum(hole.xid);
			ended_at[n_ended++] = h;
		}
	}
	int n_committed = 0;
	if (n_ended > 0) {
		Datum status_values[1] = {step::ArrayOf(ended, n_ended, XID8OID)};
		step::Execute("claim", hole_status_stmt, status_values, nullptr, SPI_OK_SELECT);
		for (int e = 0; e < n_ended && e < int(SPI_processed); e++) {
			char *status = SPI_getvalue(SPI_tuptable->vals[e], SPI_tuptable->tupdesc, 1);
			HoleState &state = ring.holes[ended_at[e]].state;
			if (status != nullptr && strcmp(status, "aborted") == 0) {
				state = HoleState::Aborted;
			} else if (status == nullptr || strcmp(status, "committed") == 0) {
				state = HoleState::Committed;
				n_committed++;
			}
		}
	}

	bool block_key = settings.failed_event_policy == int(FailedEventPolicy::BlockKey);
	old = MemoryContextSwitchTo(into);
	batch->events = static_cast<ClaimedEvent *>(palloc0(sizeof(ClaimedEvent) * batch_size));
	ring.member = static_cast<int16 *>(palloc(sizeof(int16) * batch_size));
	ring.order_lsn = static_cast<XLogRecPtr *>(palloc(sizeof(XLogRecPtr) * batch_size));
	ring.walked = static_cast<Walked *>(palloc(sizeof(Walked) * batch_size));
	MemoryContextSwitchTo(old);

	// 3a. Due event_state rows of the slot's lanes (they lie below the cursor: first).
	Datum state_values[4] = {slot_values[0], slot_values[1], Int32GetDatum(batch_size), BoolGetDatum(block_key)};
	step::Execute("claim", state_candidates_stmt, state_values, nullptr, SPI_OK_SELECT);
	SPITupleTable *candidates = SPI_tuptable;
	int n_candidates = int(SPI_processed);
	int64 bytes = 0;
	int n_fit = 0;
	Datum *tids = static_cast<Datum *>(palloc(sizeof(Datum) * (n_candidates > 0 ? n_candidates : 1)));
	while (n_fit < n_candidates && bytes < settings.batch_max_bytes) {
		tids[n_fit] = SPI_getbinval(candidates->vals[n_fit], candidates->tupdesc, 1, &isnull);
		bytes += DatumGetInt64(SPI_getbinval(candidates->vals[n_fit], candidates->tupdesc, 5, &isnull));
		n_fit++;
	}
	if (n_fit > 0) {
		Datum lock_values[1] = {step::ArrayOf(tids, n_fit, TIDOID)};
		step::Execute("lock", state_lock_stmt, lock_values, nullptr, SPI_OK_SELECT);
		batch->n = TakeLockedState(candidates, n_fit, SPI_tuptable, int(SPI_processed), into, batch->events);
	}
	ring.n_state = batch->n;
	bool state_cut = n_fit < n_candidates || n_candidates >= batch_size;

	int limit = batch_size - batch->n;
	int n_held = 0;
	int64 *held_ids = static_cast<int64 *>(palloc(sizeof(int64) * (limit > 0 ? limit : 1)));
	int16 *held_members = static_cast<int16 *>(palloc(sizeof(int16) * (limit > 0 ? limit : 1)));
	XLogRecPtr *held_lsns = static_cast<XLogRecPtr *>(palloc(sizeof(XLogRecPtr) * (limit > 0 ? limit : 1)));

	// 3b. Rows of committed holes, below the cursor, from where each hole's walk got, in one
	// (order_lsn, id) order, in S.
	ring.holes_walked = n_committed == 0;
	if (n_committed > 0 && limit > 0 && bytes < settings.batch_max_bytes) {
		Datum *xids = static_cast<Datum *>(palloc(sizeof(Datum) * n_committed));
		Datum *froms = static_cast<Datum *>(palloc(sizeof(Datum) * n_committed));
		Datum *walked_lsns = static_cast<Datum *>(palloc(sizeof(Datum) * n_committed));
		Datum *walked_ids = static_cast<Datum *>(palloc(sizeof(Datum) * n_committed));
		int c = 0;
		for (int h = 0; h < ring.n_holes; h++) {
			if (ring.holes[h].state == HoleState::Committed) {
				xids[c] = UInt64GetDatum(ring.holes[h].xid);
				froms[c] = LSNGetDatum(ring.holes[h].from);
				walked_lsns[c] = LSNGetDatum(ring.holes[h].walked.order_lsn);
				walked_ids[c++] = Int64GetDatum(ring.holes[h].walked.id);
			}
		}
		// The window: from the lowest place a committed hole's walk stands at.
		Position start = ring.cursor;
		for (int h = 0; h < ring.n_holes; h++) {
			const Hole &hole = ring.holes[h];
			Position at = Before(hole.walked, Position{hole.from, PG_INT64_MIN}) ? Position{hole.from, PG_INT64_MIN}
			                                                                     : hole.walked;
			if (hole.state == HoleState::Committed && Before(at, start)) {
				start = at;
			}
		}
		ring.window_end = ring.cursor;
		Datum window_values[5] = {LSNGetDatum(start.order_lsn), Int64GetDatum(start.id),
		                          LSNGetDatum(ring.cursor.order_lsn), Int64GetDatum(ring.cursor.id),
		                          Int64GetDatum(int64(batch_size) * kHoleWindowPerBatchRow)};
		step::ExecuteIn("claim", hole_window_stmt, window_values, nullptr, SPI_OK_SELECT, view.snapshot);
		if (SPI_processed == 1) {
			ring.window_end = Position{DatumGetLSN(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)),
			                           DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull))};
		}
		Datum hole_values[12] = {slot_values[0],
		                         slot_values[1],
		                         step::ArrayOf(xids, c, XID8OID),
		                         step::ArrayOf(froms, c, PG_LSNOID),
		                         step::ArrayOf(walked_lsns, c, PG_LSNOID),
		                         step::ArrayOf(walked_ids, c, INT8OID),
		                         LSNGetDatum(ring.window_end.order_lsn),
		                         Int64GetDatum(ring.window_end.id),
		                         Int32GetDatum(limit),
		                         BoolGetDatum(block_key),
		                         LSNGetDatum(start.order_lsn),
		                         Int64GetDatum(start.id)};
		ExecuteWalk(hole_candidates_stmt, hole_floor_candidates_stmt, hole_values, 12, view.snapshot);
		int n_rows = int(SPI_processed);
		int k = TakeRows(SPI_tuptable, n_rows, into, batch, &bytes, held_ids, held_members, held_lsns, &n_held);
		ring.window_uncut = n_rows < limit && k == n_rows;
		ring.holes_walked = ring.window_uncut && !Before(ring.window_end, ring.cursor);
		limit -= ring.n_walked;
	}
	ring.n_hole_walked = ring.n_walked;

	// 3c. Member rows after the cursor, below W, in S; none while a committed hole is not walked
	// to its end (a later row of its key must not overtake its rows).
	if (ring.holes_walked && limit > 0 && bytes < settings.batch_max_bytes && ring.cursor.order_lsn < ring.horizon) {
		Datum member_values[7] = {slot_values[0],
		                          slot_values[1],
		                          LSNGetDatum(ring.cursor.order_lsn),
		                          Int64GetDatum(ring.cursor.id),
		                          LSNGetDatum(ring.horizon),
		                          Int32GetDatum(limit),
		                          BoolGetDatum(block_key)};
		// With the floors, a window: the rows they leave out may be many (a slot of another count
		// far ahead), and a walk through all of them in one statement could pass statement_timeout
		// at every claim. Its end: the K-th member row (every lane) after the cursor below W.
		bool window_cut = false;
		Datum window[2] = {LSNGetDatum(ring.horizon), Int64GetDatum(PG_INT64_MIN)};
		if (UseOldFloors()) {
			Datum window_values[5] = {LSNGetDatum(ring.cursor.order_lsn), Int64GetDatum(ring.cursor.id),
			                          LSNGetDatum(ring.horizon), Int64GetDatum(PG_INT64_MIN),
			                          Int64GetDatum(int64(batch_size) * kFloorWindowPerBatchRow)};
			step::ExecuteIn("claim", hole_window_stmt, window_values, nullptr, SPI_OK_SELECT, view.snapshot);
			if (SPI_processed == 1) {
				ring.walk_end =
				    Position{DatumGetLSN(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)),
				             DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull))};
				window[0] = LSNGetDatum(ring.walk_end.order_lsn);
				window[1] = Int64GetDatum(ring.walk_end.id);
				window_cut = true;
			}
		}
		ExecuteWalk(member_candidates_stmt, member_floor_candidates_stmt, member_values, 7, view.snapshot, window, 2);
		int n_rows = int(SPI_processed);
		int k = TakeRows(SPI_tuptable, n_rows, into, batch, &bytes, held_ids, held_members, held_lsns, &n_held);
		bool took_all = n_rows < limit && k == n_rows;
		// Every row below the window's end that the floors leave in was taken: the cursor may go to
		// its end (the rows left out were handled), not to W (rows after the window are unread).
		ring.to_walk_end = took_all && window_cut;
		ring.to_horizon = took_all && !window_cut;
	}
	UnregisterSnapshot(view.snapshot);
	// Cut: due event_state rows beyond (1)'s budget, a committed hole not walked to its end, or
	// member rows below W left for the next claim.
	batch->cut = state_cut || !ring.holes_walked || (ring.cursor.order_lsn < ring.horizon && !ring.to_horizon);
	// Held rows wait behind their key in event_state, due at once (the key's earlier row holds
	// them back there): copied in the claim's transaction, with the cursor that passes them.
	if (n_held > 0) {
		char *kinds = static_cast<char *>(palloc(n_held));
		const char **no_errors = static_cast<const char **>(palloc0(sizeof(char *) * n_held));
		memset(kinds, 'h', n_held);
		InsertState(held_ids, held_members, held_lsns, kinds, no_errors, n_held, 0);
	}
	if (batch->n == 0) {
		batch->progressed = RecordCursor(CursorAfterWalk(), ring.n_hole_walked); // committed by the caller's EndStep
	}
}

namespace {

// Published events (indices into the batch) sorted by member, topic, partition and offset.
const Batch *sort_batch;
const kafka::Delivery *sort_deliveries;

int
CompareLanding(const void *a, const void *b) {
	int i = *static_cast<const int *>(a), j = *static_cast<const int *>(b);
	if (ring.member[i] != ring.member[j]) {
		return ring.member[i] < ring.member[j] ? -1 : 1;
	}
	if (int c = strcmp(sort_batch->events[i].topic, sort_batch->events[j].topic)) {
		return c;
	}
	const kafka::Delivery &x = sort_deliveries[i], &y = sort_deliveries[j];
	if (x.partition != y.partition) {
		return x.partition < y.partition ? -1 : 1;
	}
	return x.offset < y.offset ? -1 : x.offset > y.offset;
}

// landed rows for the published events[0 .. n), and their event_state rows deleted.
void
RecordLanded(const Batch &batch, const int *events, int n, const kafka::Delivery *deliveries) {
	if (n == 0) {
		return;
	}
	int *sorted = static_cast<int *>(palloc(sizeof(int) * n));
	memcpy(sorted, events, sizeof(int) * n);
	sort_batch = &batch;
	sort_deliveries = deliveries;
	qsort(sorted, n, sizeof(int), CompareLanding);
	Datum *run_member = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *run_topic = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *run_partition = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *run_first = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *event_run = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *event_id = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *state_ids = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	int n_runs = 0, n_state = 0;
	for (int k = 0; k < n; k++) {
		int i = sorted[k];
		const kafka::Delivery &d = deliveries[i];
		bool continues = false;
		if (k > 0) {
			int p = sorted[k - 1];
			continues = ring.member[p] == ring.member[i] && strcmp(batch.events[p].topic, batch.events[i].topic) == 0 &&
			            deliveries[p].partition == d.partition && deliveries[p].offset + 1 == d.offset;
		}
		if (!continues) {
			run_member[n_runs] = Int16GetDatum(ring.member[i]);
			run_topic[n_runs] = CStringGetTextDatum(batch.events[i].topic);
			run_partition[n_runs] = Int32GetDatum(d.partition);
			run_first[n_runs] = Int64GetDatum(d.offset);
			n_runs++;
		}
		event_run[k] = Int64GetDatum(int64(n_runs)); // runs count from 1, as WITH ORDINALITY
		event_id[k] = Int64GetDatum(batch.events[i].id);
		if (i < ring.n_state) {
			state_ids[n_state++] = Int64GetDatum(batch.events[i].id);
		}
	}
	Datum values[6] = {step::ArrayOf(run_member, n_runs, INT2OID),    step::ArrayOf(run_topic, n_runs, TEXTOID),
	                   step::ArrayOf(run_partition, n_runs, INT4OID), step::ArrayOf(run_first, n_runs, INT8OID),
	                   step::ArrayOf(event_run, n, INT8OID),          step::ArrayOf(event_id, n, INT8OID)};
	step::Execute("record", landed_stmt, values, nullptr, SPI_OK_INSERT);
	if (n_state > 0) {
		Datum delete_values[1] = {step::ArrayOf(state_ids, n_state, INT8OID)};
		step::Execute("record", state_delete_stmt, delete_values, nullptr, SPI_OK_DELETE);
	}
}

} // namespace

void
RingRecordPublished(const Batch &batch, const int *events, int n, const kafka::Delivery *deliveries) {
	RecordLanded(batch, events, n, deliveries);
}

int
RingRecordOutcomes(const Batch &batch, const Outcome *outcomes, const kafka::Delivery *deliveries,
                   const char *const *errors, long defer_ms, const bool *recorded) {
	int n = batch.n;
	int *published = static_cast<int *>(palloc(sizeof(int) * (n > 0 ? n : 1)));
	int n_published = 0;
	for (int i = 0; i < n; i++) {
		if (outcomes[i] == Outcome::Published && !recorded[i]) {
			published[n_published++] = i;
		}
	}
	RecordLanded(batch, published, n_published, deliveries);
	int failed = 0;

	// event_state rows: retries, failed, quarantined, deferred (a requeued one stays as it is).
	{
		Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
		Datum *kinds = static_cast<Datum *>(palloc(sizeof(Datum) * (n > 0 ? n : 1)));
		const char **texts = static_cast<const char **>(palloc(sizeof(char *) * (n > 0 ? n : 1)));
		int k = 0;
		for (int i = 0; i < ring.n_state; i++) {
			if (outcomes[i] == Outcome::Requeued || outcomes[i] == Outcome::Published) {
				continue;
			}
			char kind[2] = {char(outcomes[i]), '\0'};
			ids[k] = Int64GetDatum(batch.events[i].id);
			kinds[k] = CStringGetTextDatum(kind);
			texts[k++] = errors[i];
		}
		if (k > 0) {
			Datum values[7] = {step::ArrayOf(ids, k, INT8OID),
			                   step::ArrayOf(kinds, k, TEXTOID),
			                   NullableTextArray(texts, k),
			                   Int32GetDatum(settings.max_attempts),
			                   Int32GetDatum(settings.backoff_base_ms),
			                   Int32GetDatum(settings.backoff_max_ms),
			                   Int64GetDatum(int64(defer_ms))};
			step::Execute("record", state_update_stmt, values, nullptr, SPI_OK_SELECT);
			failed += LogFailed(SPI_tuptable, SPI_processed);
		}
	}

	// Member rows. An unresolved one (not sent, broker-wide trouble, unknown outcome) stops the
	// cursor before it when nothing after it was resolved either (the usual case: the broker is
	// in trouble, nothing is written per event); otherwise the unresolved ones are passed into
	// event_state ('q': pending, due now) and the cursor goes on.
	int first_unresolved = -1;
	bool resolved_after = false;
	for (int w = 0; w < ring.n_walked; w++) {
		int i = ring.walked[w].event;
		if (i < 0) {
			continue;
		}
		if (outcomes[i] == Outcome::Requeued) {
			first_unresolved = first_unresolved < 0 ? w : first_unresolved;
		} else if (first_unresolved >= 0) {
			resolved_after = true;
		}
	}
	bool stop = first_unresolved >= 0 && !resolved_after;
	int64 *ids = static_cast<int64 *>(palloc(sizeof(int64) * (n > 0 ? n : 1)));
	int16 *members = static_cast<int16 *>(palloc(sizeof(int16) * (n > 0 ? n : 1)));
	XLogRecPtr *lsns = static_cast<XLogRecPtr *>(palloc(sizeof(XLogRecPtr) * (n > 0 ? n : 1)));
	char *kinds = static_cast<char *>(palloc(n > 0 ? n : 1));
	const char **texts = static_cast<const char **>(palloc(sizeof(char *) * (n > 0 ? n : 1)));
	int k = 0;
	for (int w = 0; w < ring.n_walked; w++) {
		int i = ring.walked[w].event;
		if (i < 0 || outcomes[i] == Outcome::Published || (stop && w >= first_unresolved)) {
			continue;
		}
		ids[k] = batch.events[i].id;
		members[k] = ring.member[i];
		lsns[k] = ring.order_lsn[i];
		kinds[k] = char(outcomes[i]);
		texts[k++] = errors[i];
	}
	failed += InsertState(ids, members, lsns, kinds, texts, k, defer_ms);
	// Rows of (2) come first: an unresolved one stops its hole's walk before it (and the cursor
	// stays, as (3) took nothing resolved); one of (3) stops the cursor before it.
	Position to = CursorAfterWalk();
	int hole_end = ring.n_hole_walked;
	if (stop) {
		to = first_unresolved > ring.n_hole_walked ? ring.walked[first_unresolved - 1].at : ring.cursor;
		hole_end = Min(first_unresolved, ring.n_hole_walked);
	}
	RecordCursor(to, hole_end);
	return failed;
}

int64
RingMillisUntilNextRetry(const LaneSet &lanes) {
	Datum values[2] = {Int32GetDatum(lanes.n_workers), Int32GetDatum(lanes.worker)};
	step::Execute("next_retry", next_retry_stmt, values, nullptr, SPI_OK_SELECT);
	bool isnull;
	Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? -1 : DatumGetInt64(d);
}

} // namespace outbox
