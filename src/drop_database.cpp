// DROP DATABASE of the relay's own database: the relay workers are connected to it, and a
// plain DROP DATABASE refuses while other sessions are. A utility hook stops them first; the
// postmaster starts them again after bgw_restart_time, when the database is gone, and they wait
// for it (worker.cpp, missing database). It stops them only for a DROP DATABASE that will go
// ahead as far as the hook can tell: by the database's owner or a superuser, as a top-level
// statement outside a transaction block. Anyone else's DROP DATABASE (which then fails) must
// not be a way to restart the relay.
#include "drop_database.hpp"

#include "boundary.hpp"
#include "guc.hpp"
#include "shmem.hpp"
#include "wait_events.hpp"

extern "C" {
#include "tcop/utility.h"
}

namespace outbox {

namespace {

constexpr long kStopWaitMs = 10000;

ProcessUtility_hook_type previous_utility_hook = nullptr;

// The pids of the relay workers running now, into pids[kMaxWorkers]; returns how many.
int
RelayWorkerPids(int *pids) {
	int n = 0;
	for (int i = 0; i < settings.workers; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		int pid = slot->pid;
		SpinLockRelease(&slot->mutex);
		if (pid != 0) {
			pids[n++] = pid;
		}
	}
	return n;
}

// Signals every relay worker to stop and waits, bounded, until their slots are free.
void
StopRelayWorkers() {
	int pids[kMaxWorkers];
	for (int i = 0, n = RelayWorkerPids(pids); i < n; i++) {
		kill(pids[i], SIGTERM);
	}
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kStopWaitMs);
	for (;;) {
		bool running = false;
		for (int i = 0; i < settings.workers; i++) {
			WorkerSlot *slot = SlotOf(i);
			SpinLockAcquire(&slot->mutex);
			running |= slot->pid != 0;
			SpinLockRelease(&slot->mutex);
		}
		if (!running || GetCurrentTimestamp() >= deadline) {
			return;
		}
		(void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 50,
		                WaitEventOf(WaitPoint::StopRelay));
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
	int relay_pids[kMaxWorkers];
	int n_pids = RelayWorkerPids(relay_pids);
	Datum pids[kMaxWorkers];
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

// The checks standard_ProcessUtility and dropdb() make before they would drop anything.
bool
DropWillProceed(const DropdbStmt *stmt, ProcessUtilityContext context) {
	if (shared == nullptr || strcmp(stmt->dbname, settings.database) != 0) {
		return false;
	}
	if (context != PROCESS_UTILITY_TOPLEVEL || IsTransactionBlock() || IsSubTransaction()) {
		return false; // "DROP DATABASE cannot run inside a transaction block" / a function
	}
	Oid db = get_database_oid(stmt->dbname, true);
	if (!OidIsValid(db) || db == MyDatabaseId) {
		return false; // IF EXISTS of nothing, or "cannot drop the currently open database"
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
	if (IsA(stmt, DropdbStmt) && DropWillProceed(reinterpret_cast<DropdbStmt *>(stmt), context)) {
		ereport(LOG, (errmsg("outbox: stopping the relay workers for DROP DATABASE \"%s\"", settings.database)));
		StopRelayWorkers();
	}
	if (previous_utility_hook) {
		previous_utility_hook(pstmt, query, read_only_tree, context, params, query_env, dest, qc);
	} else {
		standard_ProcessUtility(pstmt, query, read_only_tree, context, params, query_env, dest, qc);
	}
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
