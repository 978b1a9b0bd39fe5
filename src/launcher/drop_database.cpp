// DROP DATABASE of a database the relay serves: its relay workers are connected to it, and a
// plain DROP DATABASE refuses while other sessions are. A utility hook stops that database's
// workers first (only those), after telling the launcher not to start them again (for a minute,
// or until the drop failed; once the database is gone the launcher forgets it). It stops them
// only for a DROP DATABASE that will go ahead as far as the hook can tell: by the database's
// owner or a superuser, as a top-level statement outside a transaction block. Anyone else's
// DROP DATABASE (which then fails) must not be a way to restart the relay.
//
// ALTER DATABASE ... RENAME refuses while the relay is connected as well: the hook stops the
// workers for that statement only (RenameWillProceed).
//
// The same hook tells the launcher what other statements change for it, once they succeeded
// (launcher_requests.cpp NoteStatementForLauncher), and keeps exactly_once's reserve of prepared
// transaction slots (prepared_reserve.hpp).
#include "launcher/drop_database.hpp"

#include "shared/boundary.hpp"
#include "shared/guc.hpp"
#include "launcher/launcher.hpp"
#include "launcher/prepared_reserve.hpp"
#include "shared/shmem.hpp"
#include "shared/wait_events.hpp"

extern "C" {
#include "tcop/utility.h"
}

namespace outbox {

namespace {

constexpr long kStopWaitMs = 10000;

ProcessUtility_hook_type previous_utility_hook = nullptr;

// The pids of the relay workers of database `db` running now, into pids[kMaxSlots]; returns
// how many.
int
RelayWorkerPids(Oid db, int *pids) {
	int n = 0;
	for (int i = 0; i < kMaxSlots; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		int pid = slot->database == db ? slot->pid : 0;
		SpinLockRelease(&slot->mutex);
		if (pid != 0) {
			pids[n++] = pid;
		}
	}
	return n;
}

// Whether the launcher holds a slot for `db` (a worker running, starting or reserved).
bool
RelayServes(Oid db) {
	bool serves = false;
	for (int i = 0; i < kMaxSlots; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		serves |= slot->database == db;
		SpinLockRelease(&slot->mutex);
	}
	return serves;
}

// Signals the database's relay workers to stop and waits, bounded, until the launcher has
// given back all of their slots (also those of workers not started yet).
void
StopRelayWorkers(Oid db) {
	PauseDatabase(db);
	for (int i = 0; i < kMaxSlots; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		int pid = 0;
		if (slot->database == db) {
			slot->stop_for_drop = true;
			pid = slot->pid;
		}
		SpinLockRelease(&slot->mutex);
		if (pid != 0) {
			kill(pid, SIGTERM);
		}
	}
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kStopWaitMs);
	while (RelayServes(db) && GetCurrentTimestamp() < deadline) {
		(void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 50, WaitEventOf(WaitPoint::StopRelay));
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

// What else makes dropdb() refuse: a template, other sessions (unless WITH (FORCE), which ends
// them), prepared transactions or replication slots in the database. Asked of the catalogs
// and statistics views as the caller (who may read all of it). Without this, a database owner
// keeping a session open could make every DROP DATABASE restart the relay.
bool
OthersHoldTheDatabase(Oid db, const DropdbStmt *stmt) {
	// WITH (FORCE) ends the other sessions, but a non-superuser's only when it may signal them
	// all; for one, sessions still count as holding.
	bool force = false;
	ListCell *cell;
	foreach (cell, stmt->options) {
		DefElem *option = lfirst_node(DefElem, cell);
		force |= strcmp(option->defname, "force") == 0;
	}
	force = force && superuser();
	// The relay's own workers are told apart by pid: a row of another role's session may show
	// no backend type to the caller, and counts as a holder.
	int relay_pids[kMaxSlots];
	int n_pids = RelayWorkerPids(db, relay_pids);
	Datum pids[kMaxSlots];
	for (int i = 0; i < n_pids; i++) {
		pids[i] = Int32GetDatum(relay_pids[i]);
	}
	const char *sql =
	    "SELECT (SELECT d.datistemplate FROM pg_catalog.pg_database d WHERE d.oid OPERATOR(pg_catalog.=) $1)"
	    " OR (NOT $2 AND EXISTS (SELECT FROM pg_catalog.pg_stat_activity a"
	    "                        WHERE a.datid OPERATOR(pg_catalog.=) $1"
	    "                          AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()"
	    "                          AND a.pid OPERATOR(pg_catalog.<>) ALL ($3)"
	    "                          AND a.backend_type IS DISTINCT FROM 'autovacuum worker'))"
	    " OR EXISTS (SELECT FROM pg_catalog.pg_prepared_xacts p, pg_catalog.pg_database d"
	    "            WHERE d.oid OPERATOR(pg_catalog.=) $1 AND p.database OPERATOR(pg_catalog.=) d.datname)"
	    " OR EXISTS (SELECT FROM pg_catalog.pg_replication_slots r"
	    "            WHERE r.datoid OPERATOR(pg_catalog.=) $1 AND r.active)"
	    " OR EXISTS (SELECT FROM pg_catalog.pg_subscription s WHERE s.subdbid OPERATOR(pg_catalog.=) $1)";
	Oid types[3] = {OIDOID, BOOLOID, INT4ARRAYOID};
	Datum values[3] = {ObjectIdGetDatum(db), BoolGetDatum(force),
	                   PointerGetDatum(construct_array(pids, n_pids, INT4OID, sizeof(int32), true, TYPALIGN_INT))};
	if (SPI_connect() != SPI_OK_CONNECT) {
		elog(ERROR, "outbox: SPI_connect failed");
	}
	int rc = SPI_execute_with_args(sql, 3, types, values, nullptr, true, 1);
	bool held = true;
	if (rc == SPI_OK_SELECT && SPI_processed == 1) {
		bool isnull;
		Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		held = isnull || DatumGetBool(d);
	}
	SPI_finish();
	return held;
}

// ALTER DATABASE ... RENAME refuses while the relay is connected too. The relay follows the
// database by OID, so its workers are only stopped for the statement and started again right
// after it (its commit, when in a transaction block, then renames under their feet harmlessly:
// they wait for the database's lock to connect). Only for whom RenameDatabase() would let
// through (owner with CREATEDB, or a superuser): nobody else can make the relay restart.
bool
RenameWillProceed(Oid db) {
	if (shared == nullptr || !OidIsValid(db) || db == MyDatabaseId || !RelayServes(db)) {
		return false; // no such database, "current database cannot be renamed", no relay
	}
	if (superuser()) {
		return true;
	}
	if (!OutboxDatabaseOwnerCheck(db, GetUserId())) {
		return false;
	}
	HeapTuple role = SearchSysCache1(AUTHOID, ObjectIdGetDatum(GetUserId()));
	bool createdb = HeapTupleIsValid(role) && reinterpret_cast<Form_pg_authid>(GETSTRUCT(role))->rolcreatedb;
	if (HeapTupleIsValid(role)) {
		ReleaseSysCache(role);
	}
	return createdb;
}

// The checks standard_ProcessUtility and dropdb() make before they would drop anything.
bool
DropWillProceed(const DropdbStmt *stmt, ProcessUtilityContext context, Oid db) {
	if (shared == nullptr || !OidIsValid(db) || db == MyDatabaseId || !RelayServes(db)) {
		return false; // IF EXISTS of nothing, "cannot drop the currently open database", no relay
	}
	if (context != PROCESS_UTILITY_TOPLEVEL || IsTransactionBlock() || IsSubTransaction()) {
		return false; // "DROP DATABASE cannot run inside a transaction block" / a function
	}
	if (!superuser() && !OutboxDatabaseOwnerCheck(db, GetUserId())) {
		return false; // "must be owner of database"
	}
	if (MyXactFlags & XACT_FLAGS_PIPELINING) {
		return false; // "DROP DATABASE cannot be executed within a pipeline"
	}
	return !OthersHoldTheDatabase(db, stmt);
}

void
OnUtility(PlannedStmt *pstmt, const char *query, bool read_only_tree, ProcessUtilityContext context,
          ParamListInfo params, QueryEnvironment *query_env, DestReceiver *dest, QueryCompletion *qc) {
	Node *stmt = pstmt->utilityStmt;
	if (IsA(stmt, TransactionStmt) && reinterpret_cast<TransactionStmt *>(stmt)->kind == TRANS_STMT_PREPARE) {
		RefusePrepareIntoRelayReserve();
	}
	bool outbox_existed = OutboxExtensionExistsFor(stmt);
	Oid stopped_for = InvalidOid;
	if (IsA(stmt, DropdbStmt)) {
		const DropdbStmt *drop = reinterpret_cast<DropdbStmt *>(stmt);
		Oid db = get_database_oid(drop->dbname, true);
		if (DropWillProceed(drop, context, db)) {
			ereport(LOG, (errmsg("outbox: stopping the relay workers for DROP DATABASE \"%s\"", drop->dbname)));
			stopped_for = db; // stopped in the PG_TRY below: a cancel while they stop resumes them
		}
	}
	Oid renaming = InvalidOid;
	if (IsA(stmt, RenameStmt) && reinterpret_cast<RenameStmt *>(stmt)->renameType == OBJECT_DATABASE) {
		const RenameStmt *rename = reinterpret_cast<RenameStmt *>(stmt);
		Oid db = get_database_oid(rename->subname, true);
		if (RenameWillProceed(db)) {
			ereport(LOG, (errmsg("outbox: stopping the relay workers for ALTER DATABASE \"%s\" RENAME", rename->subname)));
			stopped_for = renaming = db;
		}
	}
	PG_TRY();
	{
		if (OidIsValid(stopped_for)) {
			StopRelayWorkers(stopped_for); // serves interrupts while it waits
		}
		if (previous_utility_hook) {
			previous_utility_hook(pstmt, query, read_only_tree, context, params, query_env, dest, qc);
		} else {
			standard_ProcessUtility(pstmt, query, read_only_tree, context, params, query_env, dest, qc);
		}
	}
	PG_CATCH();
	{
		// The drop (or rename) failed after all, or was cancelled while the workers stopped: the
		// launcher starts the database's workers again.
		if (OidIsValid(stopped_for)) {
			ResumeDatabase(stopped_for);
		}
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (OidIsValid(renaming)) {
		ResumeDatabase(renaming); // renamed: the launcher starts its workers again
	}
	// Only now: a statement that failed (or never ran) must tell the launcher nothing.
	NoteStatementForLauncher(stmt, outbox_existed);
}

} // namespace

extern "C" {
static void
outbox_process_utility(PlannedStmt *pstmt, const char *query, bool read_only_tree, ProcessUtilityContext context,
                       ParamListInfo params, QueryEnvironment *query_env, DestReceiver *dest, QueryCompletion *qc) {
	CallFromPostgres("outbox_process_utility", OnUtility, pstmt, query, read_only_tree, context, params, query_env,
	                 dest, qc);
}
}

void
InstallDropDatabaseHook() {
	previous_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = outbox_process_utility;
}

} // namespace outbox
