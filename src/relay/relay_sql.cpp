// The relay's SQL: claim, record, requeue, purge. See DESIGN.md for why each statement looks the
// way it does; the per-key order argument lives in the claim statement's two anti-joins.
#include "relay/relay_sql.hpp"

#include "relay/relay_step.hpp"
#include "relay/ring_claim.hpp"

#include "relay/cloudevent_headers.hpp"
#include "shared/guc.hpp"
#include "shared/kafka_names.hpp"
#include "relay/standby_wait.hpp"

namespace outbox {

namespace {

// The claim, in two statements of the batch's transaction (DESIGN.md "Data path"):
//  1. candidates: due pending rows of this worker's lanes in order_lsn order (commit order per
//     (topic, key), DESIGN.md "Commit order"), read without locks, with their sizes for the
//     byte budget. A row is a candidate only when no earlier row of its (topic, key) waits for
//     a retry, is an in_flight orphan the requeue could not take (a user holds it) or, when
//     failed events block their key, has failed: those rows, and only those, are in the small
//     partial index events_waiting_idx, so the usual probe finds nothing.
//  2. lock: the candidates that fit the budget, by ctid, FOR UPDATE SKIP LOCKED. A candidate not
//     returned was locked or changed by another transaction (a user's statement: no other relay
//     worker claims these lanes): the rest of its (topic, key) waits for the next batch
//     (worker.cpp leaves them out), so nothing overtakes it.
// The rows stay locked while the batch is published; one statement records the outcomes, and the
// commit releases them. Nothing is written before the publish: a crash or an ERROR meanwhile
// leaves the rows pending, unlocked, to be sent again (at-least-once).
// Every plan is an index walk: the session disables sequential scans and sorts (worker.cpp), so
// a plan made without statistics (a burst into a table not yet analyzed) is the same one.
// Operators are spelled with exact argument types: the worker's search_path is pinned to
// pg_catalog anyway (worker.cpp), this keeps the statements unambiguous besides.
// $5/$6: (topic, key)s to pass over, NULL in a claim's first round. A claim's next round leaves
// out the (topic, key)s of the candidates the lock statement could not take: without that, a key
// with a batch's worth of events behind a row a user holds would fill every claim's candidates
// and starve the other keys.
const char *const kCandidatesSql = R"SQL(
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
LIMIT $3
)SQL";

const char *const kLockSql = R"SQL(
SELECT e.id, e.event_id::text, e.topic, e.key, e.payload,
       CASE WHEN jsonb_typeof(e.headers) = 'object'
            THEN ARRAY(SELECT h.key FROM jsonb_each_text(e.headers) h ORDER BY h.key) END,
       CASE WHEN jsonb_typeof(e.headers) = 'object'
            THEN ARRAY(SELECT h.value FROM jsonb_each_text(e.headers) h ORDER BY h.key) END,
       e.headers IS NOT NULL AND jsonb_typeof(e.headers) <> 'object',
       e.status = 'pending', e.ctid,
       e.created_at, e.target_partition, e.ce_content_type, e.ce_type, e.ce_source
FROM outbox.events e
WHERE e.ctid = ANY ($1::tid[])
FOR UPDATE OF e SKIP LOCKED
)SQL";
// (The status column, not the WHERE clause, says whether the row is still pending: with a status
// condition the planner may read the partial pending index whole instead of fetching the ctids.
// A row updated since it was a candidate comes back as its new version, with another ctid: the
// last column tells, and it counts as not locked.)
// (Headers that are not an object never reach jsonb_each_text, which would fail the whole claim:
// the last column flags them, and the row is quarantined.)

// Record, in the claim's transaction (the rows are still pending and locked by it): the published
// events in one narrow statement (the common case: nothing returned, nothing computed per row),
// then the other outcomes in this one (a requeued event is left as it is).
const char *const kPublishedSql = R"SQL(
UPDATE outbox.events e SET status = 'published', published_at = statement_timestamp(),
       kafka_partition = o.kafka_partition, kafka_offset = o.kafka_offset, next_attempt_at = NULL
FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS o(id, kafka_partition, kafka_offset)
WHERE e.id = o.id AND e.status = 'pending'
)SQL";

const char *const kRecordSql = R"SQL(
WITH o AS (
	SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[]) AS o(id, outcome, error)
), updated AS (
	UPDATE outbox.events e SET
		status = CASE o.outcome
		           WHEN 'r' THEN CASE WHEN greatest(least(e.attempts, 999999), 0) + 1 >= $4 THEN 'failed' ELSE 'pending' END
		           WHEN 'x' THEN 'failed'
		           ELSE 'pending' END,
		published_at = NULL, kafka_partition = NULL, kafka_offset = NULL,
		attempts = CASE WHEN o.outcome = 'r' THEN greatest(least(e.attempts, 999999), 0) + 1 ELSE e.attempts END,
		last_error = coalesce(o.error, e.last_error),
		next_attempt_at = CASE o.outcome
		    WHEN 'r' THEN statement_timestamp() + make_interval(secs => least($6::float8, $5::float8 * power(2::float8, greatest(0, least(e.attempts, 30))::float8))
		                                               * (0.5::float8 + random() / 2::float8) / 1000.0::float8)
		    WHEN 'd' THEN statement_timestamp() + make_interval(secs => $7::float8 / 1000.0::float8)
		    ELSE NULL END
	FROM o
	WHERE e.id = o.id AND e.status = 'pending'
	RETURNING e.event_id, e.topic, e.key, e.status, e.attempts, e.last_error
)
SELECT event_id::text, topic, key, attempts, last_error FROM updated WHERE status = 'failed'
)SQL";
// (Attempts and the backoff exponent are clamped so that no row, however it was written, can
// make this statement fail: a failing record would resend the batch forever.)

// Lanes are taken modulo the worker count with a non-negative result everywhere: a lane outside
// 0..1023 (possible only with the table's checks dropped) still belongs to exactly one worker.
// Rows left in_flight (by a 0.1.0 relay, or written by hand) in this worker's lanes: nothing puts
// a row in flight any more, so they are orphans. Run before every claim, in the claim's
// transaction (events_in_flight_idx keeps it to an empty index probe). The claim then sees them
// pending: SPI takes a new snapshot per statement.
// Rows a user's session holds are left for a later claim (the claim's gate keeps the rest of
// their (topic, key) behind them): no relay statement waits for a row lock.
const char *const kRequeueSql = R"SQL(
UPDATE outbox.events e SET status = 'pending'
WHERE e.id IN (SELECT o.id FROM outbox.events o
               WHERE o.status = 'in_flight' AND (o.lane::integer % $1 + $1) % $1 = $2
               FOR UPDATE OF o SKIP LOCKED)
)SQL";

// Rows waiting for a retry are the pending ones with a next_attempt_at (events_waiting_idx); the
// wait is capped so that no timestamp, however far, can overflow it.
const char *const kNextRetrySql =
    "SELECT (extract(epoch FROM least(min(next_attempt_at), now() + interval '1 hour') - now()) * 1000::numeric)"
    "::bigint FROM outbox.events "
    "WHERE status = 'pending' AND next_attempt_at IS NOT NULL AND next_attempt_at > now() "
    "AND (lane::integer % $1 + $1) % $1 = $2";

// Retention, by the relay itself: it calls no function that a database user could have put in
// the function's place. Rows a user's session holds are left for a later round.
const char *const kPurgeSql = R"SQL(
DELETE FROM outbox.events e
WHERE e.id IN (SELECT p.id FROM outbox.events p
               WHERE p.status = 'published' AND p.published_at < now() - make_interval(secs => $1::float8)
               ORDER BY p.published_at LIMIT $2
               FOR UPDATE OF p SKIP LOCKED)
)SQL";

Statement candidates_stmt = {
    kCandidatesSql, 6, {INT4OID, INT4OID, INT4OID, BOOLOID, TEXTARRAYOID, TEXTARRAYOID}, 0, nullptr};
Statement lock_stmt = {kLockSql, 1, {TIDARRAYOID}, 0, nullptr};
// The record statement always runs its generic plan: an index probe per recorded row, right at
// any batch size (a custom plan of a large batch once chose a sequential scan of the whole
// table, and the plan cache kept it).
Statement published_stmt = {kPublishedSql, 3, {INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID}, CURSOR_OPT_GENERIC_PLAN,
                             nullptr};
Statement record_stmt = {kRecordSql, 7, {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4OID, INT4OID, INT4OID, INT8OID},
                         CURSOR_OPT_GENERIC_PLAN, nullptr};
Statement requeue_stmt = {kRequeueSql, 2, {INT4OID, INT4OID}, 0, nullptr};
Statement next_retry_stmt = {kNextRetrySql, 2, {INT4OID, INT4OID}, 0, nullptr};
Statement purge_stmt = {kPurgeSql, 2, {INT4OID, INT8OID}, 0, nullptr};
// Schema 0.4.0: one round of the ring's rotation and TRUNCATE (the script's outbox.ring_retention()).
constexpr const char *kRingPurgeSql = "SELECT outbox.ring_retention(pg_catalog.make_interval(secs => $1))";
Statement ring_purge_stmt = {kRingPurgeSql, 1, {INT4OID}, 0, nullptr};
// Right after the round, in a step of its own (its ERROR cannot roll the round back): the oldest
// sealed member, the oldest one sealed past the window that the round left (overdue) and why,
// and whether the member after the current one is free (if not, the current member is never
// sealed: it grows). The window is widened by the time since the round's now() ($2), so that
// overdue means what it meant to the round: a member that became due since is not counted.
constexpr const char *kRingStatusSql = R"SQL(
WITH s AS MATERIALIZED (
  SELECT * FROM outbox.ring_status(pg_catalog.make_interval(secs => $1)
                                   + GREATEST(pg_catalog.now() - $2, interval '0')))
SELECT (SELECT pg_catalog.min(a.sealed_at) FROM s a WHERE a.sealed_at IS NOT NULL AND NOT a.is_current),
       k.member, k.sealed_at, k.kept_because,
       NOT EXISTS (SELECT FROM s c JOIN s n ON n.member = (c.member + 1) % 4
                   WHERE c.is_current AND NOT n.is_current AND n.sealed_at IS NULL)
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT o.member, o.sealed_at, o.kept_because FROM s o WHERE o.overdue
                   ORDER BY o.sealed_at, o.member LIMIT 1) k ON true
)SQL";
Statement ring_status_stmt = {kRingStatusSql, 2, {INT4OID, TIMESTAMPTZOID}, 0, nullptr};

// Prepared once per worker and kept: the plan cache re-plans if the table is recreated.
SPIPlanPtr
PlanOf(Statement &stmt) {
	if (stmt.plan == nullptr) {
		SPIPlanPtr plan = SPI_prepare_cursor(stmt.sql, stmt.nargs, stmt.types, stmt.cursor_options);
		if (plan == nullptr) {
			elog(ERROR, "outbox relay: could not prepare a statement: %s", SPI_result_code_string(SPI_result));
		}
		SPI_keepplan(plan);
		stmt.plan = plan;
	}
	return stmt.plan;
}

// The caller's memory context: committing a transaction leaves CurrentMemoryContext at
// TopMemoryContext, where the worker's allocations would never be freed.
MemoryContext step_caller_context = nullptr;
// The session's own user and security context, put back after each step.
Oid step_saved_user = InvalidOid;
int step_saved_sec_context = 0;
// Why the last BeginStep returned Refused (static text or palloc'd in the caller's context).
const char *step_problem = nullptr;
// Whether the current step runs on schema 0.4.0's ring (BeginStep).
bool step_ring = false;

bool
ExtensionOwns(Oid ext, Oid class_id, Oid object_id) {
	return getExtensionOfObject(class_id, object_id) == ext;
}

// Whether role may execute outbox's function name(argtypes). Found in the checked schema directly:
// a name lookup would check the schema's USAGE for whoever the session is, which is not the
// question here.
bool
CanExecute(Oid nsp, Oid role, const char *name, Oid *argtypes, int nargs) {
	Oid proc = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid, CStringGetDatum(name),
	                           PointerGetDatum(buildoidvector(argtypes, nargs)), ObjectIdGetDatum(nsp));
	return OidIsValid(proc) && OutboxProcAclCheck(proc, role, ACL_EXECUTE) == ACLCHECK_OK;
}

// The relay's role, or InvalidOid with the reason in step_problem. Checked every step: a
// reload may name another role, and rights may be revoked at any time. Missing rights are a
// configuration problem to report, not an ERROR to loop on.
Oid
RelayRole(Oid nsp, Oid rel) {
	const char *name = settings.relay_role;
	Oid role = get_role_oid(name, true);
	if (!OidIsValid(role)) {
		step_problem = psprintf("outbox.relay_role \"%s\" does not exist (ALTER EXTENSION outbox UPDATE creates "
		                        "outbox_relay; another role must be created and granted by hand)",
		                        name);
		return InvalidOid;
	}
	if (role < FirstNormalObjectId) {
		// pg_database_owner and the other predefined roles have implicit or broad membership.
		step_problem = psprintf("outbox.relay_role \"%s\" is a predefined role; name a role of its own", name);
		return InvalidOid;
	}
	// Only a role that nobody can log in as or use to reach beyond outbox.events: a CREATEROLE
	// user may have made (or may alter) a role of that name.
	HeapTuple tuple = SearchSysCache1(AUTHOID, ObjectIdGetDatum(role));
	if (!HeapTupleIsValid(tuple)) {
		step_problem = psprintf("outbox.relay_role \"%s\" does not exist", name);
		return InvalidOid;
	}
	Form_pg_authid form = reinterpret_cast<Form_pg_authid>(GETSTRUCT(tuple));
	const char *attribute = form->rolsuper ? "SUPERUSER" : form->rolcanlogin ? "LOGIN" : form->rolcreaterole ? "CREATEROLE"
	                        : form->rolcreatedb ? "CREATEDB" : form->rolreplication ? "REPLICATION"
	                        : form->rolbypassrls ? "BYPASSRLS" : nullptr;
	ReleaseSysCache(tuple);
	if (attribute) {
		step_problem = psprintf("outbox.relay_role \"%s\" has %s; the relay runs only as a role without it "
		                        "(ALTER ROLE \"%s\" NO%s)",
		                        name, attribute, name, attribute);
		return InvalidOid;
	}
	// Members of the role could SET ROLE to it and read or rewrite every event: the relay's
	// role must be nobody else's (a CREATEROLE user may have made a role of that name first).
	CatCList *members = SearchSysCacheList1(AUTHMEMROLEMEM, ObjectIdGetDatum(role));
	int n_members = members->n_members;
	ReleaseSysCacheList(members);
	if (n_members > 0) {
		step_problem = psprintf("outbox.relay_role \"%s\" has members; other roles could act as it: revoke them, "
		                        "the relay's role must be a role of its own",
		                        name);
		return InvalidOid;
	}
	if (OutboxNamespaceAclCheck(nsp, role, ACL_USAGE) != ACLCHECK_OK) {
		step_problem = psprintf("outbox.relay_role \"%s\" lacks USAGE on schema outbox (ALTER EXTENSION outbox UPDATE "
		                        "grants it to outbox_relay; docs/privileges.md)",
		                        name);
		return InvalidOid;
	}
	if (step_ring) {
		return role; // the ring's tables: RingRightsProblem (the relay never DELETEs a cursor)
	}
	const AclMode needed[] = {ACL_SELECT, ACL_UPDATE, ACL_DELETE};
	bool ok = true;
	for (AclMode mode : needed) {
		ok = ok && pg_class_aclcheck(rel, role, mode) == ACLCHECK_OK;
	}
	// The table's CHECK function runs with the updating role's rights. (lane_of is for rows written
	// by hand; the relay never calls it.)
	Oid row_check_args[] = {TEXTOID, INT2OID, TEXTOID, UUIDOID, TEXTOID, JSONBOID, BOOLOID, INT4OID,
	                        TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, INT8OID,
	                        INT4OID, TEXTOID, TEXTOID, TEXTOID};
	ok = ok && CanExecute(nsp, role, "events_row_check", row_check_args, lengthof(row_check_args));
	if (!ok) {
		step_problem = psprintf("outbox.relay_role \"%s\" lacks USAGE on schema outbox, SELECT, UPDATE and DELETE on "
		                        "outbox.events or EXECUTE on outbox.events_row_check (ALTER EXTENSION outbox UPDATE grants "
		                        "them to outbox_relay; docs/privileges.md)",
		                        name);
		return InvalidOid;
	}
	return role;
}

// The installed extension's version, palloc'd, or nullptr. (pg_extension has no syscache before
// PostgreSQL 16: one index probe.)
char *
ExtensionVersion(Oid ext) {
	Relation rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(ext));
	SysScanDesc scan = systable_beginscan(rel, ExtensionOidIndexId, true, nullptr, 1, &key);
	HeapTuple tuple = systable_getnext(scan);
	char *version = nullptr;
	bool isnull = true;
	Datum d = HeapTupleIsValid(tuple) ? heap_getattr(tuple, Anum_pg_extension_extversion, RelationGetDescr(rel), &isnull)
	                                  : Datum(0);
	if (!isnull) {
		version = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

TableState
AbandonStep(TableState state) {
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(step_caller_context);
	debug_query_string = nullptr;
	pgstat_report_activity(STATE_IDLE, nullptr);
	return state;
}

// Opens a transaction for one relay step and checks that the outbox table is there, free, and
// the extension's own: the relay touches no object that a database user could have created
// under the same name (before CREATE EXTENSION, after DROP EXTENSION, or beside it). The lock
// taken here on the checked table holds until the step ends, so the names in the statements
// resolve to exactly it. Then the step runs as outbox.relay_role, with SECURITY_RESTRICTED_
// OPERATION as VACUUM runs a table owner's code: nothing it runs can change the session's role.
// On Ready, SPI is connected and the caller must call EndStep().
TableState
BeginStep(const char *activity) {
	step_caller_context = CurrentMemoryContext;
	step_problem = nullptr;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
	debug_query_string = activity;

	Oid ext = get_extension_oid("outbox", true);
	Oid nsp = OidIsValid(ext) ? get_namespace_oid("outbox", true) : InvalidOid;
	// Schema 0.4.0 or 0.4.1 (the insert-only queue, ring_claim.cpp): outbox.events is a view
	// there, and the step locks and checks outbox.cursors instead. Read at every step, so the
	// worker switches at the first step after an ALTER EXTENSION UPDATE TO '0.4.0'.
	char *version = OidIsValid(nsp) ? ExtensionVersion(ext) : nullptr;
	step_ring = IsRingSchemaVersion(version);
	Oid rel = OidIsValid(nsp) ? get_relname_relid(step_ring ? "cursors" : "events", nsp) : InvalidOid;
	if (!OidIsValid(rel)) {
		return AbandonStep(TableState::Missing);
	}
	if (!ConditionalLockRelationOid(rel, RowExclusiveLock)) {
		return AbandonStep(TableState::Busy); // DROP EXTENSION or other DDL in progress: do not wait on it
	}
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(rel))) {
		return AbandonStep(TableState::Missing); // dropped while we waited for nothing
	}
	if (!ExtensionOwns(ext, NamespaceRelationId, nsp) || !ExtensionOwns(ext, RelationRelationId, rel) ||
	    get_rel_relkind(rel) != RELKIND_RELATION) {
		MemoryContext old = MemoryContextSwitchTo(step_caller_context);
		step_problem = step_ring ? "schema outbox or table outbox.cursors is not the extension's own (created by a "
		                           "user?); the relay does not touch it"
		                         : "schema outbox or table outbox.events is not the extension's own (created by a user?); the "
		               "relay does not touch it";
		MemoryContextSwitchTo(old);
		return AbandonStep(TableState::Refused);
	}
	if (step_ring) {
		if (const char *problem = RingTablesProblem(ext, nsp)) {
			MemoryContext old = MemoryContextSwitchTo(step_caller_context);
			step_problem = pstrdup(problem);
			MemoryContextSwitchTo(old);
			return AbandonStep(TableState::Refused);
		}
	}
	// A library newer than the schema (after a package upgrade, before ALTER EXTENSION UPDATE):
	// the statements below are written for the ring and for 0.3.0's table only.
	if (version == nullptr || (strcmp(version, kTableSchemaVersion) != 0 && !step_ring)) {
		MemoryContext old = MemoryContextSwitchTo(step_caller_context);
		step_problem = psprintf("extension outbox is at version %s, this library publishes from version %s: run "
		                        "ALTER EXTENSION outbox UPDATE",
		                        version ? version : "(unknown)", OUTBOX_SCHEMA_VERSION);
		MemoryContextSwitchTo(old);
		return AbandonStep(TableState::Refused);
	}
	MemoryContext old = MemoryContextSwitchTo(step_caller_context);
	Oid role = RelayRole(nsp, rel);
	if (OidIsValid(role) && step_ring) {
		if (const char *problem = RingRightsProblem(nsp, role)) {
			step_problem = psprintf("outbox.relay_role \"%s\" %s", settings.relay_role, problem);
			role = InvalidOid;
		}
	}
	MemoryContextSwitchTo(old);
	if (!OidIsValid(role)) {
		return AbandonStep(TableState::Refused);
	}
	GetUserIdAndSecContext(&step_saved_user, &step_saved_sec_context);
	SetUserIdAndSecContext(role, step_saved_sec_context | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	if (SPI_connect() != SPI_OK_CONNECT) {
		elog(ERROR, "outbox relay: SPI_connect failed");
	}
	return TableState::Ready;
}

// EndStep's twin for exactly_once: the claim's transaction is prepared as `gid`, not committed.
// PREPARE TRANSACTION needs a transaction block, which a background worker's transaction is not:
// one is opened around it first, as the logical replication apply worker does for a prepared
// transaction it applies.
void
PrepareStep(const char *gid) {
	SPI_finish();
	BeginTransactionBlock();
	CommitTransactionCommand(); // ends the BEGIN: the block is in progress
	if (!PrepareTransactionBlock(gid)) {
		elog(ERROR, "outbox relay: could not prepare the batch's transaction");
	}
	PopActiveSnapshot();
	CommitTransactionCommand(); // the PREPARE itself
	SetUserIdAndSecContext(step_saved_user, step_saved_sec_context);
	MemoryContextSwitchTo(step_caller_context);
	debug_query_string = nullptr;
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, nullptr);
}

void
EndStep() {
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	// After the commit, so that anything the commit runs still runs as the relay's role. (An
	// ERROR instead ends in AbortTransaction, which restores the user by itself.)
	SetUserIdAndSecContext(step_saved_user, step_saved_sec_context);
	MemoryContextSwitchTo(step_caller_context);
	debug_query_string = nullptr;
	// Background workers flush their table statistics themselves, or autovacuum and
	// autoanalyze would never see the relay's updates and deletes.
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, nullptr);
}

#ifdef OUTBOX_TEST_SEAMS
// Test builds only: outbox.test_fail_step = 'step:N' raises an ERROR in the next N runs of the
// named step, after its statement ran (so the abort has work to undo). A new value re-arms it.
char armed_fail_step[64];
int fail_step_left = 0;

void
MaybeInjectFailure(const char *step) {
	static char seen[64];
	if (strcmp(seen, settings.test_fail_step) != 0) {
		strlcpy(seen, settings.test_fail_step, sizeof(seen));
		const char *colon = strrchr(seen, ':');
		fail_step_left = colon ? atoi(colon + 1) : 0;
		strlcpy(armed_fail_step, seen, colon ? size_t(colon - seen) + 1 : sizeof(armed_fail_step));
	}
	if (fail_step_left > 0 && strcmp(armed_fail_step, step) == 0) {
		fail_step_left--;
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("outbox test: injected failure of step %s", step)));
	}
}
#else
void
MaybeInjectFailure(const char *) {
}
#endif

// SIGTERM only sets a flag, and a running statement (or its lock wait) never looks at it. While a
// relay statement runs, a timer looks every kStopCheckMs: once a stop has been pending for
// kStatementStopGraceMs, the statement is cancelled as pg_cancel_backend would (the ERROR path
// follows, the loop then exits; the batch is requeued at the next start). Runs in the SIGALRM
// handler: only flags, the clock and the latch.
constexpr int kStopCheckMs = 500;
constexpr int64 kStatementStopGraceMs = 2000;
TimeoutId stop_check_timeout = MAX_TIMEOUTS;
volatile TimestampTz stop_seen_at = 0;

[[maybe_unused]] void // registered only on 15+ (InitStatementStopCheck)
OnStopCheck() {
	if (!ShutdownRequestPending) {
		return;
	}
	TimestampTz now = GetCurrentTimestamp();
	if (stop_seen_at == 0) {
		stop_seen_at = now;
	} else if (now - stop_seen_at >= kStatementStopGraceMs * 1000) {
		InterruptPending = true;
		QueryCancelPending = true;
		SetLatch(MyLatch);
	}
}

// Around a wait that SIGTERM does not end by itself: the grace is counted from its first look at
// a pending stop.
void
ArmStopCheck() {
	stop_seen_at = 0;
#if PG_VERSION_NUM >= 150000
	if (stop_check_timeout != MAX_TIMEOUTS) {
		enable_timeout_every(stop_check_timeout, TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kStopCheckMs),
		                     kStopCheckMs);
	}
#endif
}

void
DisarmStopCheck() {
	if (stop_check_timeout != MAX_TIMEOUTS) {
		disable_timeout(stop_check_timeout, false);
	}
}

// Runs a step's statement (read-only in exactly `snapshot`, or with a new snapshot of its own
// when InvalidSnapshot); `step` names it for the test builds' fault injection.
void
ExecuteIn(const char *step, Statement &stmt, Datum *values, const char *nulls, int expected, Snapshot snapshot) {
	// statement_timeout is armed by the protocol loop for client commands only: a background
	// worker's SPI statements run without it unless armed here. (An ERROR leaves both timers to
	// the recovery block's disable_all_timeouts.)
	enable_timeout_after(STATEMENT_TIMEOUT, settings.statement_timeout_ms);
	ArmStopCheck();
	int rc = snapshot == InvalidSnapshot
	             ? SPI_execute_plan(PlanOf(stmt), values, nulls, false, 0)
	             : SPI_execute_snapshot(PlanOf(stmt), values, nulls, snapshot, InvalidSnapshot, true, false, 0);
	DisarmStopCheck();
	disable_timeout(STATEMENT_TIMEOUT, false);
	// A cancel the timer set after the statement's last interrupt check is served here, inside
	// the step: left pending, the commit would meet it (and skip a synchronous-standby wait).
	CHECK_FOR_INTERRUPTS();
	if (rc != expected) {
		elog(ERROR, "outbox relay: statement failed: %s", SPI_result_code_string(rc));
	}
	MaybeInjectFailure(step);
}

void
Execute(const char *step, Statement &stmt, Datum *values, const char *nulls, int expected) {
	ExecuteIn(step, stmt, values, nulls, expected, InvalidSnapshot);
}

// Text in the server encoding as UTF-8 (what Kafka clients expect), or nullptr when it has no
// UTF-8 form: bytes that are not UTF-8 in a SQL_ASCII database, or a character without a UTF-8
// mapping. Never raises: a row the relay cannot convert is quarantined, not an error loop.
char *
ToUtf8(const char *data, int len, int *out_len) {
	int encoding = GetDatabaseEncoding();
	if (encoding == PG_UTF8 || encoding == PG_SQL_ASCII) {
		if (!pg_verify_mbstr(PG_UTF8, data, len, true)) {
			return nullptr;
		}
		char *out = static_cast<char *>(palloc(len + 1));
		memcpy(out, data, len);
		out[len] = '\0';
		*out_len = len;
		return out;
	}
	Oid proc = FindDefaultConversionProc(encoding, PG_UTF8);
	if (!OidIsValid(proc)) {
		return nullptr;
	}
	int capacity = len * MAX_CONVERSION_GROWTH + 1;
	unsigned char *out = static_cast<unsigned char *>(palloc(capacity));
	int converted = pg_do_encoding_conversion_buf(proc, encoding, PG_UTF8, (unsigned char *)data, len, out, capacity,
	                                              true);
	if (converted != len) {
		return nullptr;
	}
	*out_len = int(strlen(reinterpret_cast<char *>(out)));
	return reinterpret_cast<char *>(out);
}

// A text column as UTF-8. *bad is set when it cannot be converted.
char *
CopyText(HeapTuple tuple, TupleDesc desc, int col, int *len, bool *bad) {
	bool isnull;
	Datum d = SPI_getbinval(tuple, desc, col, &isnull);
	int n = 0;
	if (len) {
		*len = 0;
	}
	if (isnull) {
		return nullptr;
	}
	struct varlena *v = PG_DETOAST_DATUM_PACKED(d);
	char *out = ToUtf8(VARDATA_ANY(v), VARSIZE_ANY_EXHDR(v), &n);
	if (out == nullptr) {
		*bad = true;
		return nullptr;
	}
	if (len) {
		*len = n;
	}
	return out;
}

// The payload: bytes as enqueue stored them (already UTF-8 for text and jsonb payloads).
char *
CopyBytes(HeapTuple tuple, TupleDesc desc, int col, int *len) {
	bool isnull;
	Datum d = SPI_getbinval(tuple, desc, col, &isnull);
	*len = 0;
	if (isnull) {
		return nullptr;
	}
	struct varlena *v = PG_DETOAST_DATUM_PACKED(d);
	*len = VARSIZE_ANY_EXHDR(v);
	char *out = static_cast<char *>(palloc(*len + 1));
	memcpy(out, VARDATA_ANY(v), *len);
	out[*len] = '\0';
	return out;
}

// Copies text[] elements into `out` (palloc'd UTF-8 C strings). Returns the count, or -1 with
// *problem set when an element is NULL (a JSON null header value) or has no UTF-8 form.
int
CopyTextArray(HeapTuple tuple, TupleDesc desc, int col, char ***out, int **lens, const char **problem) {
	bool isnull;
	Datum d = SPI_getbinval(tuple, desc, col, &isnull);
	*out = nullptr;
	*lens = nullptr;
	if (isnull) {
		return 0;
	}
	Datum *elems;
	bool *elem_nulls;
	int n;
	deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT, &elems, &elem_nulls, &n);
	*out = static_cast<char **>(palloc(sizeof(char *) * (n + 1)));
	*lens = static_cast<int *>(palloc(sizeof(int) * (n + 1)));
	for (int i = 0; i < n; i++) {
		if (elem_nulls[i]) {
			*problem = "a header value is not a JSON string";
			return -1;
		}
		text *t = DatumGetTextPP(elems[i]);
		(*out)[i] = ToUtf8(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t), &(*lens)[i]);
		if ((*out)[i] == nullptr) {
			*problem = "a header is not valid UTF-8";
			return -1;
		}
	}
	return n;
}

Datum
ArrayOf(Datum *elems, int n, Oid type) {
	int16 typlen;
	bool typbyval;
	char typalign;
	get_typlenbyvalalign(type, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_array(elems, n, type, typlen, typbyval, typalign));
}

void CopyEnvelope(HeapTuple tuple, TupleDesc desc, ClaimedEvent &e);

// Copies one claimed row. A row that cannot be published as it is (only rows not written by
// enqueue can be like that) gets a quarantine reason instead: it goes to failed, not to Kafka.
void
CopyClaimedRow(HeapTuple tuple, TupleDesc desc, ClaimedEvent &e) {
	bool isnull;
	bool bad = false;
	e.id = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
	Datum event_id = SPI_getbinval(tuple, desc, 2, &isnull);
	strlcpy(e.event_id, TextDatumGetCString(event_id), sizeof(e.event_id));
	e.topic = CopyText(tuple, desc, 3, nullptr, &bad);
	e.key = CopyText(tuple, desc, 4, &e.key_len, &bad);
	e.payload = CopyBytes(tuple, desc, 5, &e.payload_len);
	e.quarantine = nullptr;
	if (bad || e.topic == nullptr) {
		e.quarantine = "quarantined: the key or the topic is not valid UTF-8";
	} else if (const char *problem = TopicNameProblem(e.topic, strlen(e.topic))) {
		e.quarantine = psprintf("quarantined: invalid Kafka topic name: %s", problem);
	} else if (!TopicAllowed(e.topic, int(strlen(e.topic)))) {
		e.quarantine = "quarantined: the topic is not in outbox.allowed_topics";
	}
	char **names = nullptr, **header_values = nullptr;
	int *name_lens, *value_lens;
	const char *header_problem = nullptr;
	int n_user = CopyTextArray(tuple, desc, 6, &names, &name_lens, &header_problem);
	if (n_user >= 0 && CopyTextArray(tuple, desc, 7, &header_values, &value_lens, &header_problem) != n_user) {
		n_user = -1;
	}
	for (int h = 0; h < n_user; h++) {
		if (strcmp(names[h], kEventIdHeader) == 0) {
			header_problem = "the header name event_id is reserved";
			n_user = -1;
		}
	}
	if (DatumGetBool(SPI_getbinval(tuple, desc, 8, &isnull))) {
		header_problem = "the headers are not a JSON object";
		n_user = -1;
	}
	if (n_user < 0) {
		e.quarantine = e.quarantine ? e.quarantine : psprintf("quarantined: %s", header_problem);
		n_user = 0;
	}
	e.n_headers = n_user + 1;
	e.headers = static_cast<kafka::Header *>(palloc(sizeof(kafka::Header) * e.n_headers));
	for (int h = 0; h < n_user; h++) {
		e.headers[h] = kafka::Header{names[h], header_values[h], size_t(value_lens[h])};
	}
	e.headers[n_user] = kafka::Header{kEventIdHeader, e.event_id, strlen(e.event_id)};
	CopyEnvelope(tuple, desc, e);
}

// The envelope columns, after the claim's own (docs/envelopes.md): the
// partition, the record's timestamp and, for a CloudEvent, its ce_* headers.
void
CopyEnvelope(HeapTuple tuple, TupleDesc desc, ClaimedEvent &e) {
	constexpr int kFirst = 11;
	bool isnull;
	TimestampTz created_at = DatumGetTimestampTz(SPI_getbinval(tuple, desc, kFirst, &isnull));
	Datum partition = SPI_getbinval(tuple, desc, kFirst + 1, &isnull);
	e.partition = isnull ? -1 : DatumGetInt32(partition);
	e.timestamp_ms = settings.message_timestamp == int(MessageTimestamp::Commit) ? UnixMillis(created_at) : 0;
	bool bad = false;
	char *content_type = CopyText(tuple, desc, kFirst + 2, nullptr, &bad);
	char *type = CopyText(tuple, desc, kFirst + 3, nullptr, &bad);
	char *source = CopyText(tuple, desc, kFirst + 4, nullptr, &bad);
	if (bad) {
		e.quarantine = e.quarantine ? e.quarantine : "quarantined: a CloudEvents attribute is not valid UTF-8";
	} else if (content_type && e.quarantine == nullptr) {
		if (const char *problem = CloudEventProblem(e, content_type, type, source, created_at)) {
			e.quarantine = problem;
		} else {
			AddCloudEventHeaders(e, content_type, type, source, created_at);
		}
	}
}

} // namespace

void
InitStatementStopCheck() {
#if PG_VERSION_NUM >= 150000 // enable_timeout_every: before 15 a stop waits for the statement's own timeouts
	stop_check_timeout = RegisterTimeout(USER_TIMEOUT, OnStopCheck);
#endif
}

const char *
LastStepProblem() {
	return step_problem;
}

namespace {

bool claim_open = false; // a claimed batch's transaction is open, waiting for RecordOutcomes
bool claim_on_ring = false; // that batch was claimed on the ring (schema 0.4.0)
TableState FinishClaim(Batch *batch);
// Each round passes over at least one more (topic, key) held by a user's session; a user would
// have to hold the first rows of this many keys, each with a batch's worth of events behind it,
// to make a claim come back empty.
constexpr int kMaxClaimRounds = 64;
constexpr int kMaxPassedOverKeys = 1000;

// Where the WAL inserted so far ends: the insert position, or, when that is just past a page
// header (the last record ended on the page boundary), the boundary itself.
XLogRecPtr
InsertedWalEnd() {
	XLogRecPtr insert = GetXLogInsertRecPtr();
	if (XLogSegmentOffset(insert, wal_segment_size) == SizeOfXLogLongPHD) {
		return insert - SizeOfXLogLongPHD;
	}
	if (insert % XLOG_BLCKSZ == SizeOfXLogShortPHD && XLogSegmentOffset(insert, wal_segment_size) > XLOG_BLCKSZ) {
		return insert - SizeOfXLogShortPHD;
	}
	return insert;
}

// Nothing is published before the commits of the transactions that wrote it are durable: an
// enqueue made with synchronous_commit = off is visible before its commit record is flushed, and
// a crash could undo it after its event was published. Every commit the claim saw is in the WAL
// below the current insert position: flush up to there (a no-op when it already is) and, like a
// commit, wait for the synchronous standbys.
// Then, with outbox.failover_standbys, wait for those standbys to have it too (standby_wait.cpp).
// A stop (the timer cancels the standby wait after the grace, as it does a statement) ends the
// wait: then nothing is published, and the caller lets the batch go. (A pg_cancel_backend of the
// worker during the wait ends it with a WARNING only, as it ends a commit's: the batch goes out.)
// (The end of the WAL inserted so far, not GetXLogInsertRecPtr: when the last record ends on a
// page boundary, that points past the next page's header, which nothing has written yet, and
// XLogFlush to it fails with "xlog flush request ... is not satisfied".)
// So does a failover standby that did not confirm in time (outbox.failover_on_timeout = wait):
// the caller lets the batch go the same way, and the worker waits for the standby before its
// next claim (HeldBackForStandbys).
bool
FlushBeforePublish() {
	XLogRecPtr upto = InsertedWalEnd();
	XLogFlush(upto);
	ArmStopCheck();
	SyncRepWaitForLSN(upto, false);
	DisarmStopCheck();
	CHECK_FOR_INTERRUPTS();
	return !ShutdownRequestPending && WaitForFailoverStandbys(upto) == StandbyWait::Reached;
}

int
CompareIds(const void *a, const void *b) {
	int64 x = *static_cast<const int64 *>(a), y = *static_cast<const int64 *>(b);
	return x < y ? -1 : x > y;
}

// Picks the batch from the candidates (SPI result `candidates`, in order) and the rows the lock
// statement returned (`locked`): every locked candidate, in candidate order, except those behind
// a candidate of their (topic, key) that was not locked.
// (topic, key)s a claim passes over: their first candidate was not locked.
struct PassedOver {
	int n;
	int capacity;
	Datum *topics; // text, palloc'd in the claim's transaction
	Datum *keys;
};

void
TakeLockedInOrder(SPITupleTable *candidates, int n_candidates, SPITupleTable *locked, int n_locked,
                  MemoryContext into, Batch *batch, PassedOver *passed_over) {
	int64 *locked_ids = static_cast<int64 *>(palloc(sizeof(int64) * (n_locked > 0 ? n_locked : 1)));
	int *locked_row = static_cast<int *>(palloc(sizeof(int) * (n_locked > 0 ? n_locked : 1)));
	bool isnull;
	for (int j = 0; j < n_locked; j++) {
		locked_ids[j] = DatumGetInt64(SPI_getbinval(locked->vals[j], locked->tupdesc, 1, &isnull));
	}
	// Sorted ids, and for each the row it came from (found again by binary search).
	int64 *sorted = static_cast<int64 *>(palloc(sizeof(int64) * (n_locked > 0 ? n_locked : 1)));
	memcpy(sorted, locked_ids, sizeof(int64) * n_locked);
	qsort(sorted, n_locked, sizeof(int64), CompareIds);
	for (int j = 0; j < n_locked; j++) {
		int64 *at = static_cast<int64 *>(bsearch(&locked_ids[j], sorted, n_locked, sizeof(int64), CompareIds));
		locked_row[at - sorted] = j;
	}
	// (topic, key) of candidates that were not locked: usually none.
	char **stopped_topics = static_cast<char **>(palloc(sizeof(char *) * (n_candidates > 0 ? n_candidates : 1)));
	char **stopped_keys = static_cast<char **>(palloc(sizeof(char *) * (n_candidates > 0 ? n_candidates : 1)));
	int n_stopped = 0;

	MemoryContext old = MemoryContextSwitchTo(into);
	batch->events = static_cast<ClaimedEvent *>(palloc0(sizeof(ClaimedEvent) * (n_locked > 0 ? n_locked : 1)));
	MemoryContextSwitchTo(old);
	int n = 0;
	for (int i = 0; i < n_candidates; i++) {
		HeapTuple tuple = candidates->vals[i];
		int64 id = DatumGetInt64(SPI_getbinval(tuple, candidates->tupdesc, 2, &isnull));
		int64 *at = static_cast<int64 *>(bsearch(&id, sorted, n_locked, sizeof(int64), CompareIds));
		// A row changed since it was a candidate (no longer pending, or a new version) counts as
		// not locked.
		if (at != nullptr) {
			HeapTuple row = locked->vals[locked_row[at - sorted]];
			ItemPointer was = reinterpret_cast<ItemPointer>(DatumGetPointer(SPI_getbinval(tuple, candidates->tupdesc, 1, &isnull)));
			ItemPointer now = reinterpret_cast<ItemPointer>(DatumGetPointer(SPI_getbinval(row, locked->tupdesc, 10, &isnull)));
			if (!DatumGetBool(SPI_getbinval(row, locked->tupdesc, 9, &isnull)) || !ItemPointerEquals(was, now)) {
				at = nullptr;
			}
		}
		bool behind = false;
		char *topic = nullptr, *key = nullptr;
		if (n_stopped > 0 || at == nullptr) {
			topic = SPI_getvalue(tuple, candidates->tupdesc, 3);
			key = SPI_getvalue(tuple, candidates->tupdesc, 4);
			for (int k = 0; k < n_stopped && !behind; k++) {
				behind = SameTopicAndKey(topic, key, stopped_topics[k], stopped_keys[k]);
			}
		}
		if (at == nullptr || behind) {
			if (key && !behind) {
				stopped_topics[n_stopped] = topic;
				stopped_keys[n_stopped++] = key;
				if (passed_over->n < passed_over->capacity) {
					passed_over->topics[passed_over->n] = CStringGetTextDatum(topic);
					passed_over->keys[passed_over->n++] = CStringGetTextDatum(key);
				}
			}
			continue;
		}
		old = MemoryContextSwitchTo(into);
		CopyClaimedRow(locked->vals[locked_row[at - sorted]], locked->tupdesc, batch->events[n++]);
		MemoryContextSwitchTo(old);
	}
	batch->n = n;
}

// Back into the claim's open transaction for one more statement: a new snapshot (READ COMMITTED,
// as every statement), SPI connected in the caller's memory context.
void
ResumeClaimStep(const char *activity) {
	step_caller_context = CurrentMemoryContext;
	pgstat_report_activity(STATE_RUNNING, activity);
	debug_query_string = activity;
	SetCurrentStatementStartTimestamp();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT) {
		elog(ERROR, "outbox relay: SPI_connect failed");
	}
}

// Leaves the claim's transaction open, its rows locked, without a snapshot.
void
PauseClaimStep() {
	SPI_finish();
	PopActiveSnapshot();
	MemoryContextSwitchTo(step_caller_context);
	debug_query_string = nullptr;
}

} // namespace

TableState
ClaimBatch(const LaneSet &lanes, MemoryContext into, Batch *batch, int64 *requeued, int max_events) {
	int batch_size = max_events > 0 ? Min(max_events, settings.batch_size) : settings.batch_size;
	claim_open = false; // an ERROR ended the last one
	batch->n = 0;
	batch->events = nullptr;
	batch->cut = false;
	batch->progressed = false;
	*requeued = 0;
	TableState state = BeginStep("outbox relay: claim");
	if (state != TableState::Ready) {
		return state;
	}
	claim_on_ring = step_ring;
	if (step_ring) {
		RingClaim(lanes, into, batch, batch_size); // the ring's own claim (ring_claim.cpp); the tail below is shared
		return FinishClaim(batch);
	}
	Datum lane_values[2] = {Int32GetDatum(lanes.n_workers), Int32GetDatum(lanes.worker)};
	Execute("requeue", requeue_stmt, lane_values, nullptr, SPI_OK_UPDATE);
	*requeued = int64(SPI_processed);

	PassedOver passed_over{0, kMaxPassedOverKeys, static_cast<Datum *>(palloc(sizeof(Datum) * kMaxPassedOverKeys)),
	                       static_cast<Datum *>(palloc(sizeof(Datum) * kMaxPassedOverKeys))};
	// Rounds: a round that passes over a (topic, key) not left out yet is followed by one that
	// leaves it out, from the start again (rows this transaction locked already are locked again
	// at no cost). Usually there is one round.
	for (int round = 0;; round++) {
		int passed_before = passed_over.n;
		Datum values[6] = {Int32GetDatum(lanes.n_workers), Int32GetDatum(lanes.worker),
		                   Int32GetDatum(batch_size),
		                   BoolGetDatum(settings.failed_event_policy == int(FailedEventPolicy::BlockKey)),
		                   passed_before > 0 ? ArrayOf(passed_over.topics, passed_before, TEXTOID) : Datum(0),
		                   passed_before > 0 ? ArrayOf(passed_over.keys, passed_before, TEXTOID) : Datum(0)};
		const char nulls[6] = {' ', ' ', ' ', ' ', passed_before > 0 ? ' ' : 'n', passed_before > 0 ? ' ' : 'n'};
		Execute("claim", candidates_stmt, values, nulls, SPI_OK_SELECT);
		SPITupleTable *candidates = SPI_tuptable;
		int n_candidates = int(SPI_processed);
		// The byte budget over payload, key and headers (the first row always fits), so memory
		// stays bounded whatever part of the events is large.
		int64 bytes = 0;
		int n_fit = 0;
		Datum *tids = static_cast<Datum *>(palloc(sizeof(Datum) * (n_candidates > 0 ? n_candidates : 1)));
		bool isnull;
		while (n_fit < n_candidates && bytes < settings.batch_max_bytes) {
			HeapTuple tuple = candidates->vals[n_fit];
			tids[n_fit] = SPI_getbinval(tuple, candidates->tupdesc, 1, &isnull);
			bytes += DatumGetInt64(SPI_getbinval(tuple, candidates->tupdesc, 5, &isnull));
			n_fit++;
		}
		batch->cut = n_fit < n_candidates || n_candidates >= batch_size;
		if (n_fit == 0) {
			break;
		}
		Datum lock_values[1] = {ArrayOf(tids, n_fit, TIDOID)};
		Execute("lock", lock_stmt, lock_values, nullptr, SPI_OK_SELECT);
		// (An earlier round's batch stays in `into` until the worker's iteration ends.)
		TakeLockedInOrder(candidates, n_fit, SPI_tuptable, int(SPI_processed), into, batch, &passed_over);
		if (passed_over.n == passed_before || round + 1 >= kMaxClaimRounds) {
			break;
		}
	}
	return FinishClaim(batch);
}

namespace {

// The claim's end, on either schema: an empty batch commits the step; otherwise the WAL is
// flushed (and the standbys waited for) and the transaction stays open for the publish.
TableState
FinishClaim(Batch *batch) {
	if (batch->n == 0) {
		EndStep();
		return TableState::Ready;
	}
	if (!FlushBeforePublish()) {
		batch->n = 0; // stopping: the rows stay pending, unlocked by the commit
		EndStep();
		return TableState::Ready;
	}
	// The transaction stays open, holding the rows' locks, until RecordOutcomes. No snapshot is
	// kept meanwhile: only the transaction's id holds back the xmin horizon, for one publish.
	PauseClaimStep();
	claim_open = true;
	return TableState::Ready;
}

} // namespace

namespace {

// The published events of `events` (indices into the batch) with their partitions and offsets.
void
UpdatePublished(const Batch &batch, const int *events, int n, const kafka::Delivery *deliveries) {
	Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *partitions = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	Datum *offsets = static_cast<Datum *>(palloc(sizeof(Datum) * n));
	for (int k = 0; k < n; k++) {
		ids[k] = Int64GetDatum(batch.events[events[k]].id);
		partitions[k] = Int32GetDatum(deliveries[events[k]].partition);
		offsets[k] = Int64GetDatum(deliveries[events[k]].offset);
	}
	Datum values[3] = {ArrayOf(ids, n, INT8OID), ArrayOf(partitions, n, INT4OID), ArrayOf(offsets, n, INT8OID)};
	Execute("record", published_stmt, values, nullptr, SPI_OK_UPDATE);
}

} // namespace

void
RecordPublished(const Batch &batch, const int *events, int n, const kafka::Delivery *deliveries) {
	Assert(claim_open);
	if (n == 0) {
		return;
	}
	ResumeClaimStep("outbox relay: record");
	if (claim_on_ring) {
		RingRecordPublished(batch, events, n, deliveries);
	} else {
		UpdatePublished(batch, events, n, deliveries);
	}
	PauseClaimStep();
	pgstat_report_activity(STATE_RUNNING, "outbox relay: publish");
}

int
RecordOutcomes(const Batch &batch, const Outcome *outcomes, const kafka::Delivery *deliveries,
               const char *const *errors, long defer_ms, const bool *recorded, const char *prepare_gid) {
	Assert(claim_open);
	claim_open = false;
	ResumeClaimStep("outbox relay: record");
	if (claim_on_ring) {
		int failed = RingRecordOutcomes(batch, outcomes, deliveries, errors, defer_ms, recorded);
		prepare_gid ? PrepareStep(prepare_gid) : EndStep();
		return failed;
	}
	// Requeued events stay as they are: pending, their lock released by the commit.
	int n = 0, n_published = 0;
	int *published = static_cast<int *>(palloc(sizeof(int) * (batch.n > 0 ? batch.n : 1)));
	for (int i = 0; i < batch.n; i++) {
		n += outcomes[i] != Outcome::Requeued && outcomes[i] != Outcome::Published;
		if (outcomes[i] == Outcome::Published && !recorded[i]) {
			published[n_published++] = i;
		}
	}
	if (n_published > 0) {
		UpdatePublished(batch, published, n_published, deliveries);
	}
	int failed = 0;
	if (n > 0) {
		Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * n));
		Datum *kinds = static_cast<Datum *>(palloc(sizeof(Datum) * n));
		Datum *error_texts = static_cast<Datum *>(palloc(sizeof(Datum) * n));
		bool *error_nulls = static_cast<bool *>(palloc(sizeof(bool) * n));
		int k = 0;
		for (int i = 0; i < batch.n; i++) {
			if (outcomes[i] == Outcome::Requeued || outcomes[i] == Outcome::Published) {
				continue;
			}
			char kind[2] = {char(outcomes[i]), '\0'};
			ids[k] = Int64GetDatum(batch.events[i].id);
			kinds[k] = CStringGetTextDatum(kind);
			error_nulls[k] = errors[i] == nullptr;
			error_texts[k] = errors[i] ? CStringGetTextDatum(errors[i]) : Datum(0);
			k++;
		}
		int dims[1] = {n};
		int lbs[1] = {1};
		Datum error_array = PointerGetDatum(
		    construct_md_array(error_texts, error_nulls, 1, dims, lbs, TEXTOID, -1, false, TYPALIGN_INT));
		Datum values[7] = {ArrayOf(ids, n, INT8OID),
		                   ArrayOf(kinds, n, TEXTOID),
		                   error_array,
		                   Int32GetDatum(settings.max_attempts),
		                   Int32GetDatum(settings.backoff_base_ms),
		                   Int32GetDatum(settings.backoff_max_ms),
		                   Int64GetDatum(int64(defer_ms))};
		Execute("record", record_stmt, values, nullptr, SPI_OK_SELECT);

		failed = int(SPI_processed);
		for (int i = 0; i < failed; i++) {
			HeapTuple tuple = SPI_tuptable->vals[i];
			TupleDesc desc = SPI_tuptable->tupdesc;
			// Logged once: the row leaves the relay's hands here.
			// Not the key: it is the caller's data, of any size and bytes; the event id finds the row.
			ereport(LOG, (errmsg("outbox relay: event %s (topic %s) moved to failed after %s attempts: %s",
			                     SPI_getvalue(tuple, desc, 1), SPI_getvalue(tuple, desc, 2),
			                     SPI_getvalue(tuple, desc, 4), SPI_getvalue(tuple, desc, 5)),
			              errhint("It is in outbox.failed; fix the cause, then SELECT outbox.retry(event_id).")));
		}
	}
	prepare_gid ? PrepareStep(prepare_gid) : EndStep();
	return failed;
}

int64
MillisUntilNextRetry(const LaneSet &lanes) {
	if (BeginStep("outbox relay: next retry") != TableState::Ready) {
		return -1;
	}
	if (step_ring) {
		int64 ms = RingMillisUntilNextRetry(lanes);
		EndStep();
		return ms;
	}
	Datum values[2] = {Int32GetDatum(lanes.n_workers), Int32GetDatum(lanes.worker)};
	Execute("next_retry", next_retry_stmt, values, nullptr, SPI_OK_SELECT);
	bool isnull;
	Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	int64 ms = isnull ? -1 : DatumGetInt64(d);
	EndStep();
	return ms;
}

int64
PurgeBatch(int retention_s, int batch_size, RingRetentionOutcome *ring) {
	ring->on_ring = false;
	if (BeginStep("outbox relay: purge") != TableState::Ready) {
		return 0;
	}
	if (step_ring) {
		Datum seconds[1] = {Int32GetDatum(retention_s)};
		Execute("purge", ring_purge_stmt, seconds, nullptr, SPI_OK_SELECT);
		bool isnull;
		Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		int64 n = isnull ? 0 : DatumGetInt64(d);
		TimestampTz round_at = GetCurrentTransactionStartTimestamp(); // the round's now()
		EndStep(); // the round is committed: nothing below can roll it back
		// A round empties whole members: never "a full batch, go on" (batch_size is 0.3.0's).
		n = Min(n, int64(batch_size) - 1);
		if (BeginStep("outbox relay: ring status") != TableState::Ready) {
			return n;
		}
		if (!step_ring) {
			EndStep(); // updated away from the ring in between: nothing to tell
			return n;
		}
		Datum status_values[2] = {seconds[0], TimestampTzGetDatum(round_at)};
		Execute("ring_status", ring_status_stmt, status_values, nullptr, SPI_OK_SELECT);
		HeapTuple row = SPI_tuptable->vals[0];
		TupleDesc desc = SPI_tuptable->tupdesc;
		ring->on_ring = true;
		d = SPI_getbinval(row, desc, 1, &isnull);
		ring->oldest_sealed_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(row, desc, 2, &isnull);
		ring->overdue_member = isnull ? -1 : int(DatumGetInt16(d));
		d = SPI_getbinval(row, desc, 3, &isnull);
		ring->overdue_sealed_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(row, desc, 4, &isnull);
		ring->kept_because[0] = '\0';
		if (!isnull) {
			strlcpy(ring->kept_because, TextDatumGetCString(d), sizeof(ring->kept_because));
		}
		d = SPI_getbinval(row, desc, 5, &isnull);
		ring->rotation_blocked = !isnull && DatumGetBool(d);
		EndStep();
		return n;
	}
	Datum values[2] = {Int32GetDatum(retention_s), Int64GetDatum(int64(batch_size))};
	Execute("purge", purge_stmt, values, nullptr, SPI_OK_DELETE);
	int64 n = int64(SPI_processed);
	EndStep();
	return n;
}

// What the ring's claim and record borrow (relay_step.hpp).
namespace step {

void
Execute(const char *step, Statement &stmt, Datum *values, const char *nulls, int expected) {
	outbox::Execute(step, stmt, values, nulls, expected);
}

void
ExecuteIn(const char *step, Statement &stmt, Datum *values, const char *nulls, int expected, Snapshot snapshot) {
	outbox::ExecuteIn(step, stmt, values, nulls, expected, snapshot);
}

Datum
ArrayOf(Datum *elems, int n, Oid type) {
	return outbox::ArrayOf(elems, n, type);
}

void
CopyClaimedRow(HeapTuple tuple, TupleDesc desc, ClaimedEvent &e) {
	outbox::CopyClaimedRow(tuple, desc, e);
}

bool
CanExecute(Oid nsp, Oid role, const char *name, Oid *argtypes, int nargs) {
	return outbox::CanExecute(nsp, role, name, argtypes, nargs);
}

bool
OnRing() {
	return step_ring;
}

} // namespace step

} // namespace outbox
