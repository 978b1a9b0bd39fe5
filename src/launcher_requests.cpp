// What sessions tell the launcher (launcher.cpp): the utility hook notes statements that change
// which databases have relay workers, and a transaction callback hands them to the launcher at
// COMMIT (shared memory and its latch: nothing there can raise an ERROR). DROP DATABASE pauses a
// database's starts while its workers are stopped for it.
#include "launcher.hpp"

#include "boundary.hpp"
#include "shmem.hpp"

extern "C" {
#include "nodes/parsenodes.h"
}

namespace outbox {

namespace {

constexpr long kDropPauseMs = 60000; // DROP DATABASE: no start for that long

// Sessions' requests for this transaction's commit (the hook notes them, the callback sends).
constexpr int kMaxPendingProbes = 4;
LauncherRequest pending_probe[kMaxPendingProbes];
int n_pending_probe = 0;
bool pending_rescan = false;
bool pending_wake_workers = false;
bool xact_callback_registered = false;

// Whether the session's role can change outbox.workers (SUSET): only then can its RESET ALL
// have changed a database's count. Anyone else's (a database owner may RESET ALL) restarts
// nothing.
bool
MaySetWorkers() {
	if (superuser()) {
		return true;
	}
#if PG_VERSION_NUM >= 150000
	return pg_parameter_aclcheck("outbox.workers", GetUserId(), ACL_SET) == ACLCHECK_OK;
#else
	return false;
#endif
}

// One entry per database (restart if any asked it): repeating a statement must not fill the
// list, whose overflow means "look at every database".
void
NoteProbe(LauncherRequest request) {
	for (int i = 0; i < n_pending_probe; i++) {
		if (pending_probe[i].database == request.database) {
			pending_probe[i].restart |= request.restart;
			return;
		}
	}
	if (n_pending_probe == kMaxPendingProbes) {
		pending_probe[kMaxPendingProbes - 1] = {InvalidOid, true};
	} else {
		pending_probe[n_pending_probe++] = request;
	}
}

bool
IsOutbox(const char *name) {
	return name != nullptr && strcmp(name, "outbox") == 0;
}

void
SetLauncherLatch() {
	if (shared == nullptr) {
		return;
	}
	SpinLockAcquire(&shared->launcher.mutex);
	Latch *latch = shared->launcher.latch;
	SpinLockRelease(&shared->launcher.mutex);
	if (latch) {
		SetLatch(latch);
	}
}

void
WakeDatabaseWorkers(Oid db) {
	LaneMask all;
	memset(&all, 0xff, sizeof(all));
	WakeWorkers(db, all);
}

void
OnTransactionEnd(XactEvent event, void *) {
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT) {
		if (shared != nullptr && (n_pending_probe > 0 || pending_rescan)) {
			SpinLockAcquire(&shared->launcher.mutex);
			shared->launcher.rescan = true;
			for (int i = 0; i < n_pending_probe; i++) {
				if (pending_probe[i].database == InvalidOid || shared->launcher.n_probe == kMaxLauncherRequests) {
					shared->launcher.probe_all = true;
				} else {
					shared->launcher.probe[shared->launcher.n_probe++] = pending_probe[i];
				}
			}
			SpinLockRelease(&shared->launcher.mutex);
			SetLauncherLatch();
		}
		if (pending_wake_workers) {
			WakeDatabaseWorkers(MyDatabaseId);
		}
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_ABORT ||
	    event == XACT_EVENT_PARALLEL_ABORT || event == XACT_EVENT_PREPARE) {
		n_pending_probe = 0;
		pending_rescan = pending_wake_workers = false;
	}
}

extern "C" void
outbox_launcher_xact_callback(XactEvent event, void *arg) {
	// No ERROR can come out of it (spinlocks and latches only).
	OnTransactionEnd(event, arg);
}

} // namespace

void
WakeLauncher() {
	SetLauncherLatch();
}

void
NoteStatementForLauncher(Node *stmt) {
	bool noted = false;
	bool probe = false;
	// InvalidOid: no such database (or too many requests): look at all.
	LauncherRequest request = {InvalidOid, false};
	if (IsA(stmt, CreateExtensionStmt) && IsOutbox(reinterpret_cast<CreateExtensionStmt *>(stmt)->extname)) {
		probe = true;
		request = {MyDatabaseId, false};
	} else if (IsA(stmt, AlterDatabaseSetStmt)) {
		const AlterDatabaseSetStmt *alter = reinterpret_cast<AlterDatabaseSetStmt *>(stmt);
		const char *name = alter->setstmt->name; // NULL: RESET ALL
		probe = (name == nullptr && MaySetWorkers()) || (name != nullptr && pg_strcasecmp(name, "outbox.workers") == 0);
		request = {probe ? get_database_oid(alter->dbname, true) : InvalidOid, true};
	}
	if (probe) {
		NoteProbe(request);
		noted = true;
	} else if (IsA(stmt, DropStmt) && reinterpret_cast<DropStmt *>(stmt)->removeType == OBJECT_EXTENSION) {
		ListCell *cell;
		foreach (cell, reinterpret_cast<DropStmt *>(stmt)->objects) {
			if (IsOutbox(strVal(lfirst(cell)))) {
				pending_wake_workers = noted = true;
			}
		}
	} else if (IsA(stmt, CreatedbStmt) || IsA(stmt, DropdbStmt) || IsA(stmt, AlterDatabaseStmt) ||
	           IsA(stmt, RenameStmt)) {
		pending_rescan = noted = true;
	}
	if (noted && !xact_callback_registered) {
		RegisterXactCallback(outbox_launcher_xact_callback, nullptr);
		xact_callback_registered = true;
	}
}

void
PauseDatabase(Oid db) {
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kDropPauseMs);
	SpinLockAcquire(&shared->launcher.mutex);
	int oldest = 0;
	for (int i = 0; i < kMaxDropPauses; i++) {
		if (shared->launcher.paused[i] == db || shared->launcher.paused_until[i] < shared->launcher.paused_until[oldest]) {
			oldest = i;
			if (shared->launcher.paused[i] == db) {
				break;
			}
		}
	}
	shared->launcher.paused[oldest] = db;
	shared->launcher.paused_until[oldest] = until;
	SpinLockRelease(&shared->launcher.mutex);
	SetLauncherLatch();
}

void
ResumeDatabase(Oid db) {
	SpinLockAcquire(&shared->launcher.mutex);
	for (int i = 0; i < kMaxDropPauses; i++) {
		if (shared->launcher.paused[i] == db) {
			shared->launcher.paused_until[i] = 0;
		}
	}
	SpinLockRelease(&shared->launcher.mutex);
	SetLauncherLatch();
}

} // namespace outbox
