// What sessions tell the launcher (launcher.cpp). The utility hook notes a statement only once
// it has succeeded (so the role had the right to do what it did, and a name it used resolves);
// notes belong to the (sub)transaction that made them: dropped when it aborts, handed to its
// parent when it commits, sent at the top-level COMMIT only (shared memory, slot marks and the
// launcher's latch: nothing there can raise an ERROR). PREPARE TRANSACTION drops them. DROP
// DATABASE pauses a database's starts while its workers are stopped for it.
#include "launcher/launcher.hpp"

#include "shared/boundary.hpp"
#include "shared/shmem.hpp"

extern "C" {
#include "access/xact.h"
#include "commands/extension.h"
#include "nodes/parsenodes.h"
}

namespace outbox {

namespace {

constexpr long kDropPauseMs = 60000; // DROP DATABASE: no start for that long

enum class Request {
	Look,        // look at this database again (new extension, new count for a database without slots)
	Restart,     // its running workers stop so that new ones read its committed outbox.workers
	Rescan,      // pg_database changed
	WakeWorkers, // DROP EXTENSION outbox (its workers see it gone), COMMIT PREPARED (its events)
};

struct Note {
	SubTransactionId subxact; // the (sub)transaction whose commit it waits for
	Request request;
	Oid database;
};

// In TopMemoryContext, grown by the hook only (where an ERROR is the statement's); the callbacks
// only drop, relabel and read entries. One entry per (subtransaction, request, database).
Note *notes = nullptr;
int n_notes = 0;
int notes_capacity = 0;
bool callbacks_registered = false;

bool
SameNote(const Note &a, const Note &b) {
	return a.subxact == b.subxact && a.request == b.request && a.database == b.database;
}

// Drops duplicates (a subtransaction's notes merged into its parent's), keeping the order.
void
CompactNotes() {
	int kept = 0;
	for (int i = 0; i < n_notes; i++) {
		bool duplicate = false;
		for (int j = 0; j < kept && !duplicate; j++) {
			duplicate = SameNote(notes[j], notes[i]);
		}
		if (!duplicate) {
			notes[kept++] = notes[i];
		}
	}
	n_notes = kept;
}

void
AddNote(Request request, Oid database) {
	Note note = {GetCurrentSubTransactionId(), request, database};
	for (int i = 0; i < n_notes; i++) {
		if (SameNote(notes[i], note)) {
			return;
		}
	}
	if (n_notes == notes_capacity) {
		int capacity = Max(16, notes_capacity * 2);
		notes = static_cast<Note *>(notes == nullptr ? MemoryContextAlloc(TopMemoryContext, sizeof(Note) * capacity)
		                                             : repalloc(notes, sizeof(Note) * capacity));
		notes_capacity = capacity;
	}
	notes[n_notes++] = note;
}

// Whether the session's role can change outbox.workers (SUSET): only then can its RESET ALL
// have changed a database's count (anyone else's leaves outbox.workers in place).
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

// A restart is marked on the database's own slots: no list to overflow, and a database without
// slots has no worker to restart (its look, below, is enough).
void
MarkRestart(Oid db) {
	for (int i = 0; i < kMaxSlots; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		if (slot->database == db) {
			slot->restart_requested = true;
		}
		SpinLockRelease(&slot->mutex);
	}
}

void
SendNotes() {
	bool wake_workers = false;
	bool told = false;
	SpinLockAcquire(&shared->launcher.mutex);
	for (int i = 0; i < n_notes; i++) {
		const Note &note = notes[i];
		if (note.request == Request::WakeWorkers) {
			wake_workers = true;
			continue;
		}
		told = true;
		shared->launcher.rescan = true;
		if (note.request == Request::Rescan) {
			continue;
		}
		bool listed = false;
		for (int j = 0; j < shared->launcher.n_look && !listed; j++) {
			listed = shared->launcher.look[j] == note.database;
		}
		if (listed) {
			continue;
		}
		if (shared->launcher.n_look == kMaxLauncherRequests) {
			shared->launcher.look_all = true; // look at every database again (restarts nothing)
		} else {
			shared->launcher.look[shared->launcher.n_look++] = note.database;
		}
	}
	SpinLockRelease(&shared->launcher.mutex);
	for (int i = 0; i < n_notes; i++) {
		if (notes[i].request == Request::Restart) {
			MarkRestart(notes[i].database);
		}
	}
	if (told) {
		SetLauncherLatch();
	}
	if (wake_workers) {
		WakeDatabaseWorkers(MyDatabaseId);
	}
}

void
OnTransactionEnd(XactEvent event) {
	if ((event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT) && shared != nullptr) {
		SendNotes();
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_ABORT ||
	    event == XACT_EVENT_PARALLEL_ABORT || event == XACT_EVENT_PREPARE) {
		n_notes = 0;
	}
}

// Notes of `mine` and of its subtransactions (later ids, still listed only if they committed
// into it) go with it: to its parent at its commit, away at its abort.
void
OnSubTransactionEnd(SubXactEvent event, SubTransactionId mine, SubTransactionId parent) {
	if (event == SUBXACT_EVENT_COMMIT_SUB) {
		for (int i = 0; i < n_notes; i++) {
			if (notes[i].subxact >= mine) {
				notes[i].subxact = parent;
			}
		}
		CompactNotes();
	} else if (event == SUBXACT_EVENT_ABORT_SUB) {
		int kept = 0;
		for (int i = 0; i < n_notes; i++) {
			if (notes[i].subxact < mine) {
				notes[kept++] = notes[i];
			}
		}
		n_notes = kept;
	}
}

extern "C" void
outbox_launcher_xact_callback(XactEvent event, void *) {
	// No ERROR can come out of it (spinlocks and latches only).
	OnTransactionEnd(event);
}

extern "C" void
outbox_launcher_subxact_callback(SubXactEvent event, SubTransactionId mine, SubTransactionId parent, void *) {
	OnSubTransactionEnd(event, mine, parent); // no allocation, no ERROR
}

} // namespace

void
WakeLauncher() {
	SetLauncherLatch();
}

bool
OutboxExtensionExistsFor(Node *stmt) {
	return IsA(stmt, CreateExtensionStmt) && IsOutbox(reinterpret_cast<CreateExtensionStmt *>(stmt)->extname) &&
	       OidIsValid(get_extension_oid("outbox", true));
}

void
NoteStatementForLauncher(Node *stmt, bool outbox_existed) {
	if (!callbacks_registered) {
		RegisterXactCallback(outbox_launcher_xact_callback, nullptr);
		RegisterSubXactCallback(outbox_launcher_subxact_callback, nullptr);
		callbacks_registered = true;
	}
	if (IsA(stmt, CreateExtensionStmt) && IsOutbox(reinterpret_cast<CreateExtensionStmt *>(stmt)->extname)) {
		// IF NOT EXISTS of an installed extension created nothing: nothing to look at.
		if (!outbox_existed) {
			AddNote(Request::Look, MyDatabaseId);
		}
	} else if (IsA(stmt, AlterDatabaseSetStmt)) {
		const AlterDatabaseSetStmt *alter = reinterpret_cast<AlterDatabaseSetStmt *>(stmt);
		const char *name = alter->setstmt->name; // NULL: RESET ALL
		// It succeeded: the role was allowed to change that setting. Only outbox.workers changes
		// the relay (the other outbox.* a database may set are the sessions').
		bool workers = name == nullptr ? MaySetWorkers() : pg_strcasecmp(name, "outbox.workers") == 0;
		Oid db = get_database_oid(alter->dbname, true);
		if (workers && OidIsValid(db)) {
			AddNote(Request::Restart, db);
			AddNote(Request::Look, db);
		}
	} else if (IsA(stmt, DropStmt) && reinterpret_cast<DropStmt *>(stmt)->removeType == OBJECT_EXTENSION) {
		ListCell *cell;
		foreach (cell, reinterpret_cast<DropStmt *>(stmt)->objects) {
			if (IsOutbox(strVal(lfirst(cell)))) {
				AddNote(Request::WakeWorkers, MyDatabaseId);
			}
		}
	} else if (IsA(stmt, TransactionStmt) &&
	           reinterpret_cast<TransactionStmt *>(stmt)->kind == TRANS_STMT_COMMIT_PREPARED) {
		// Its transaction's events (or retries) became visible in this statement, and only here
		// (a prepared transaction belongs to the database it prepared in, and COMMIT PREPARED runs
		// there): no callback of the prepared transaction's own sessions is left to wake anyone.
		// A wake sets latches only: each of this database's workers claims once.
		AddNote(Request::WakeWorkers, MyDatabaseId);
	} else if (IsA(stmt, CreatedbStmt) || IsA(stmt, DropdbStmt) || IsA(stmt, AlterDatabaseStmt) ||
	           (IsA(stmt, RenameStmt) && reinterpret_cast<RenameStmt *>(stmt)->renameType == OBJECT_DATABASE)) {
		AddNote(Request::Rescan, InvalidOid);
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
