// The launcher (DESIGN.md "Launcher"). It reads pg_database (a shared catalog) and hands out the
// cluster's worker slots. It can see neither pg_extension (per database) nor a database's
// settings (pg_db_role_setting is shared, but not readable without a database), so a database of
// unknown state gets its worker 0 first: it checks for the extension and exits at once when it
// is missing (no process stays in a database without it), and reports outbox.workers as its
// database sets it, exiting for a restart with that count when it differs. CREATE EXTENSION
// outbox and ALTER DATABASE ... SET outbox.workers tell the launcher at commit
// (launcher_requests.cpp); otherwise such a database is probed again every
// outbox.launcher_naptime. A restart the launcher decides keeps the database's slots: a
// waiting database cannot take them meanwhile.
//
// A database gets all of its outbox.workers or none: worker i of n owns lanes lane % n = i, so a
// missing worker would leave its keys unpublished. A database's workers all run with the same n:
// when its outbox.workers changes, all of them stop before the new ones start.
//
// Plain data only on the stack (this file calls Postgres everywhere).
#include "launcher/launcher.hpp"

#include <csignal>

#include "shared/boundary.hpp"
#include "shared/guc.hpp"
#include "shared/shmem.hpp"
#include "relay/worker.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "catalog/pg_database.h"
}

namespace outbox {

namespace {

constexpr int kRestartSeconds = 5;      // after a worker stopped that nobody asked to stop
constexpr long kTickMs = 1000;          // the launcher's longest sleep between looks at its slots
constexpr long kAdoptWaitMs = 10000;

enum class Extension { Unknown, Present, Missing };

// What the launcher knows of one database (its own memory, not shared).
struct Database {
	Oid oid;
	char name[NAMEDATALEN];
	int wanted;      // outbox.workers for it, as its worker 0 last saw it
	bool exists;     // in the last scan of pg_database
	Extension extension;
	TimestampTz next_probe;  // Missing: when to look again
	TimestampTz not_before;  // no start before (restart delay, no slot)
	bool stopping;           // the launcher asked its workers to stop
	uint64 asked;            // the ask (below) of a session's commit that last asked to look at it
	bool template_logged;    // made a template (ALTER DATABASE ... IS_TEMPLATE): said once
	// Slots it held before the launcher stopped its workers for a restart (or one stopped by
	// itself): no other database may take them until it runs again or gives them up.
	int kept;
	DatabaseState state;
	char error[256];
	TimestampTz error_at;
};

Database *databases = nullptr;
int n_databases = 0;
int databases_capacity = 0;
BackgroundWorkerHandle *handles[kMaxSlots];
// Sessions' asks are counted, not timed: "asked after this worker started" must not depend on a
// wall clock that can step back (the launcher compares them, never the time).
uint64 asks = 0;
uint64 registered_after[kMaxSlots]; // the last ask before the slot's worker was started
MemoryContext launcher_context = nullptr;

TimestampTz
Now() {
	return GetCurrentTimestamp();
}

// --- slots -----------------------------------------------------------------------------------

int
SlotsOf(Oid db, int *out) {
	int n = 0;
	for (int i = 0; i < settings.max_workers; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		bool mine = slot->database == db;
		SpinLockRelease(&slot->mutex);
		if (mine) {
			out[n++] = i;
		}
	}
	return n;
}

int
FreeSlots() {
	int n = 0;
	for (int i = 0; i < settings.max_workers; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		n += slot->database == InvalidOid;
		SpinLockRelease(&slot->mutex);
	}
	return n;
}

void
ReserveSlot(int s, const Database &db, int index, int n_workers) {
	WorkerSlot *slot = SlotOf(s);
	SpinLockAcquire(&slot->mutex);
	slot->database = db.oid;
	slot->index = index;
	slot->n_workers = n_workers;
	slot->generation = ++shared->launcher.next_generation; // only the launcher writes it
	strlcpy(slot->database_name, db.name, sizeof(slot->database_name));
	slot->extension_missing = false;
	slot->extension_present = false;
	slot->resize = false;
	slot->wanted = n_workers;
	slot->count_confirmed = false;
	slot->stop_for_drop = false;
	slot->restart_requested = false; // a new reservation's workers read the committed count
	slot->pid = 0;
	slot->latch = nullptr;
	slot->state = WorkerState::Starting;
	slot->broker = BrokerState::Unknown;
	slot->published = 0;
	slot->failed = 0;
	slot->started_at = 0;
	slot->last_error[0] = '\0';
	slot->last_error_at = 0;
	slot->recovered_at = 0;
	slot->last_publish_at = 0;
	SpinLockRelease(&slot->mutex);
}

void
ReleaseSlot(int s) {
	WorkerSlot *slot = SlotOf(s);
	SpinLockAcquire(&slot->mutex);
	slot->database = InvalidOid;
	slot->n_workers = 0;
	slot->pid = 0;
	slot->latch = nullptr;
	slot->state = WorkerState::Stopped;
	SpinLockRelease(&slot->mutex);
	if (handles[s]) {
		pfree(handles[s]);
		handles[s] = nullptr;
	}
}

bool
Paused(Oid db, TimestampTz now) {
	bool paused = false;
	SpinLockAcquire(&shared->launcher.mutex);
	for (int i = 0; i < kMaxDropPauses; i++) {
		paused |= shared->launcher.paused[i] == db && shared->launcher.paused_until[i] > now;
	}
	SpinLockRelease(&shared->launcher.mutex);
	return paused;
}

void
NoteProblem(Database *db, DatabaseState state, const char *error) {
	if (db->state != state || strcmp(db->error, error) != 0) {
		ereport(LOG, (errmsg("outbox launcher: database \"%s\": %s", db->name, error)));
	}
	db->state = state;
	strlcpy(db->error, error, sizeof(db->error));
	db->error_at = Now();
}

// --- the catalogs ------------------------------------------------------------------------------

// The count a database's first worker starts with before it has seen the database's own
// outbox.workers (at least 1, or a database with outbox.workers = 0 in the configuration files
// and its own ALTER DATABASE ... SET would never be looked at).
int
ProbeCount() {
	return Max(1, settings.workers);
}

Database *
FindDatabase(Oid oid) {
	for (int i = 0; i < n_databases; i++) {
		if (databases[i].oid == oid) {
			return &databases[i];
		}
	}
	return nullptr;
}

Database *
AddDatabase(Oid oid, const char *name) {
	if (n_databases == databases_capacity) {
		databases_capacity = Max(16, databases_capacity * 2);
		databases = static_cast<Database *>(databases == nullptr
		                                        ? MemoryContextAllocZero(launcher_context,
		                                                                 sizeof(Database) * databases_capacity)
		                                        : repalloc(databases, sizeof(Database) * databases_capacity));
	}
	Database *db = &databases[n_databases++];
	memset(db, 0, sizeof(*db));
	db->oid = oid;
	strlcpy(db->name, name, sizeof(db->name));
	// outbox.database names the one database: its workers wait for the extension themselves.
	db->extension = SingleDatabaseMode() ? Extension::Present : Extension::Unknown;
	db->state = DatabaseState::Starting;
	db->wanted = ProbeCount();
	return db;
}

// pg_database (no templates, none half dropped).
void
ScanDatabases() {
	for (int i = 0; i < n_databases; i++) {
		databases[i].exists = false;
	}
	StartTransactionCommand();
	(void)GetTransactionSnapshot();
	Relation db_rel = table_open(DatabaseRelationId, AccessShareLock);
	TableScanDesc scan = table_beginscan_catalog(db_rel, 0, nullptr);
	HeapTuple tuple;
	bool single_found = false;
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
		Form_pg_database row = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
		// -2: DATCONNLIMIT_INVALID_DB, a DROP DATABASE that was interrupted.
		if (row->datistemplate || row->datconnlimit == -2) {
			Database *known = FindDatabase(row->oid);
			if (row->datistemplate && known != nullptr && known->extension == Extension::Present &&
			    !known->template_logged) {
				known->template_logged = true;
				// Its owner may do this (no superuser needed): the relay must not stop unseen.
				ereport(LOG, (errmsg("outbox launcher: database \"%s\" is a template now: its relay stops and its "
				                     "events wait",
				                     NameStr(row->datname)),
				              errhint("ALTER DATABASE ... IS_TEMPLATE false starts it again.")));
			}
			continue;
		}
		const char *name = NameStr(row->datname);
		if (SingleDatabaseMode() && strcmp(name, settings.database) != 0) {
			continue;
		}
		single_found = true;
		MemoryContext old = MemoryContextSwitchTo(launcher_context);
		Database *db = FindDatabase(row->oid);
		if (db == nullptr) {
			db = AddDatabase(row->oid, name);
		}
		MemoryContextSwitchTo(old);
		strlcpy(db->name, name, sizeof(db->name)); // ALTER DATABASE ... RENAME
		db->exists = true;
	}
	table_endscan(scan);
	table_close(db_rel, AccessShareLock);
	CommitTransactionCommand();
	static bool missing_logged = false;
	if (SingleDatabaseMode() && !single_found && !missing_logged) {
		ereport(LOG, (errmsg("outbox launcher: outbox.database \"%s\" does not exist; waiting for CREATE DATABASE",
		                     settings.database)));
	}
	missing_logged = SingleDatabaseMode() && !single_found;
}

// --- starting and stopping ------------------------------------------------------------------

void
TerminateAll(Database *db, const int *slots, int n) {
	db->stopping = true;
	db->kept = Max(db->kept, n); // its slots wait for its restart
	for (int i = 0; i < n; i++) {
		if (handles[slots[i]]) {
			TerminateBackgroundWorker(handles[slots[i]]);
		} else {
			ReleaseSlot(slots[i]); // reserved, never started
		}
	}
}

// Starts the workers of reserved slots that have none; false (and all of the database's slots
// given back) when max_worker_processes has no room.
bool
StartWorkers(Database *db, const int *slots, int n, bool only_first) {
	for (int i = 0; i < n; i++) {
		int s = slots[i];
		WorkerSlot *slot = SlotOf(s);
		SpinLockAcquire(&slot->mutex);
		int index = slot->index;
		uint32 generation = slot->generation;
		SpinLockRelease(&slot->mutex);
		if (handles[s] != nullptr || (only_first && index != 0)) {
			continue;
		}
		MemoryContext old = MemoryContextSwitchTo(launcher_context);
		registered_after[s] = asks;
		bool started = StartRelayWorker(s, generation, &handles[s]);
		MemoryContextSwitchTo(old);
		if (!started) {
			handles[s] = nullptr;
			TerminateAll(db, slots, n);
			char error[256];
			snprintf(error, sizeof(error),
			         "no worker slot: max_worker_processes (%d) is used up; %d relay workers wanted, retrying every "
			         "outbox.launcher_naptime",
			         max_worker_processes, db->wanted);
			NoteProblem(db, DatabaseState::NoWorkerSlot, error);
			db->not_before = TimestampTzPlusMilliseconds(Now(), settings.launcher_naptime_ms);
			return false;
		}
	}
	return true;
}

// Collects the database's stopped workers and gives their slots back; returns how many slots
// it still holds (in slots[]).
int
ReapStopped(Database *db, int *slots) {
	int n = SlotsOf(db->oid, slots);
	int kept = 0;
	for (int i = 0; i < n; i++) {
		int s = slots[i];
		WorkerSlot *slot = SlotOf(s);
		pid_t pid;
		if (handles[s] == nullptr || GetBackgroundWorkerPid(handles[s], &pid) != BGWH_STOPPED) {
			SpinLockAcquire(&slot->mutex);
			bool present = slot->extension_present;
			SpinLockRelease(&slot->mutex);
			if (present) {
				db->extension = Extension::Present;
			}
			slots[kept++] = s;
			continue;
		}
		SpinLockAcquire(&slot->mutex);
		bool missing = slot->extension_missing;
		bool present = slot->extension_present;
		bool resize = slot->resize;
		int wanted = slot->wanted;
		SpinLockRelease(&slot->mutex);
		if (resize && wanted == 0 && db->asked > registered_after[s]) {
			// It saw 0, but a session's commit asked again since it started (a RESET of
			// outbox.workers committed between its exit and this reap): what it saw may be stale,
			// and no worker would be left to correct it until outbox.launcher_naptime.
			db->wanted = ProbeCount();
			db->stopping = true;
			db->next_probe = 0;
		} else if (resize) {
			// Its database wants another count: all of its workers stop, then that many start.
			db->wanted = wanted;
			db->stopping = true; // Reconcile stops the others (their count is not wanted)
			if (wanted == 0) {
				db->next_probe = TimestampTzPlusMilliseconds(Now(), settings.launcher_naptime_ms);
			}
		}
		if (missing && db->asked > registered_after[s]) {
			missing = false; // CREATE EXTENSION may have committed after it looked: look again
			db->extension = Extension::Unknown;
		} else if (missing) {
			db->extension = Extension::Missing;
			db->next_probe = TimestampTzPlusMilliseconds(Now(), settings.launcher_naptime_ms);
		} else if (present) {
			db->extension = Extension::Present;
		}
		if (!db->stopping && !missing && !resize) {
			// Stopped by itself (an ERROR it could not recover from, pg_terminate_backend, a
			// failed connection): started again after a pause, so a fault cannot loop fast.
			db->not_before = TimestampTzPlusMilliseconds(Now(), kRestartSeconds * 1000L);
		}
		db->kept = Max(db->kept, n); // given back to the pool, kept for this database's restart
		ReleaseSlot(s);
	}
	return kept;
}

// Free slots that `db` may take: those other databases keep for their restart are not.
int
AvailableSlotsFor(const Database *db) {
	int available = FreeSlots();
	for (int i = 0; i < n_databases; i++) {
		const Database &other = databases[i];
		if (other.oid != db->oid && other.kept > 0) {
			int slots[kMaxSlots];
			available -= Max(0, other.kept - SlotsOf(other.oid, slots));
		}
	}
	return available;
}

void
Reconcile(Database *db, TimestampTz now) {
	int slots[kMaxSlots];
	int n = ReapStopped(db, slots);
	if (n == 0) {
		db->stopping = false;
	}
	if (db->extension == Extension::Missing && now >= db->next_probe) {
		db->extension = Extension::Unknown;
	}
	if (db->wanted == 0 && n == 0 && now >= db->next_probe) {
		db->wanted = ProbeCount(); // has ALTER DATABASE ... SET outbox.workers changed?
		db->extension = SingleDatabaseMode() ? Extension::Present : Extension::Unknown;
	}
	bool paused = Paused(db->oid, now);
	int want = (!db->exists || paused || db->extension == Extension::Missing) ? 0 : db->wanted;
	if (want == 0) {
		db->kept = 0; // gone, dropped, disabled or without the extension: nothing to keep
	}
	int running_with = 0;
	if (n > 0) {
		WorkerSlot *slot = SlotOf(slots[0]);
		SpinLockAcquire(&slot->mutex);
		running_with = slot->n_workers;
		SpinLockRelease(&slot->mutex);
	}
	if (paused) {
		db->state = DatabaseState::StoppedForDrop;
	} else if (db->exists && db->wanted == 0) {
		db->state = DatabaseState::Disabled;
	}
	// Fewer slots than its count: one of its workers stopped by itself. All or none: the rest
	// stop too, and all start again on the slots it keeps.
	if (n > 0 && (want == 0 || running_with != want || n < running_with)) {
		TerminateAll(db, slots, n); // all stop before a new count starts
		return;
	}
	if (want == 0 || db->stopping || now < db->not_before) {
		return;
	}
	if (n == 0) {
		if (AvailableSlotsFor(db) < want) {
			db->kept = 0; // what it kept is not enough: it waits like the others
			// More than the whole budget never fits, however many slots are freed: say so.
			char error[256];
			if (db->extension != Extension::Present) {
				// Every database is looked into (the launcher cannot see pg_extension): a database
				// without the extension must not read as one that wants a relay.
				snprintf(error, sizeof(error),
				         "no worker slot to look into it (whether the extension is installed there): "
				         "outbox.max_workers = %d used up; retrying when a slot is freed",
				         settings.max_workers);
			} else if (want > settings.max_workers) {
				snprintf(error, sizeof(error),
				         "no worker slot: outbox.workers = %d for this database is more than outbox.max_workers = %d; "
				         "lower it (ALTER DATABASE ... SET outbox.workers) or raise outbox.max_workers",
				         want, settings.max_workers);
			} else {
				snprintf(error, sizeof(error),
				         "no worker slot: %d relay workers wanted, outbox.max_workers = %d used up by other databases; "
				         "retrying when a slot is freed",
				         want, settings.max_workers);
			}
			NoteProblem(db, DatabaseState::NoWorkerSlot, error);
			return;
		}
		for (int i = 0, s = 0; i < want; s++) {
			WorkerSlot *slot = SlotOf(s);
			SpinLockAcquire(&slot->mutex);
			bool free_slot = slot->database == InvalidOid;
			SpinLockRelease(&slot->mutex);
			if (free_slot) {
				ReserveSlot(s, *db, i, want);
				slots[i++] = s;
			}
		}
		n = want;
	}
	// Unknown: worker 0 alone looks for the extension; the others follow once it found it.
	if (!StartWorkers(db, slots, n, db->extension != Extension::Present)) {
		db->kept = 0;
		return;
	}
	int running = 0;
	bool confirmed = false; // worker 0 saw the database's count is n
	for (int i = 0; i < n; i++) {
		WorkerSlot *slot = SlotOf(slots[i]);
		SpinLockAcquire(&slot->mutex);
		running += slot->pid != 0;
		confirmed |= slot->index == 0 && slot->count_confirmed;
		SpinLockRelease(&slot->mutex);
	}
	db->state = running == want ? DatabaseState::Running : DatabaseState::Starting;
	if (db->state == DatabaseState::Running) {
		db->error[0] = '\0';
	}
	if (db->state == DatabaseState::Running && confirmed) {
		db->kept = 0; // it runs with its database's count: what it holds is all it needs
	}
}

// outbox.launcher: the databases with the extension (or not known yet), budget problems included.
// Built aside, then copied under the spinlock in one go.
void
PublishRows() {
	static DatabaseRow rows[kMaxDatabaseRows];
	int n = 0;
	for (int i = 0; i < n_databases && n < kMaxDatabaseRows; i++) {
		const Database &db = databases[i];
		bool shown = (db.exists && db.extension == Extension::Present) ||
		             db.state == DatabaseState::NoWorkerSlot || db.state == DatabaseState::StoppedForDrop;
		if (!shown) {
			continue;
		}
		DatabaseRow *row = &rows[n++];
		row->database = db.oid;
		strlcpy(row->name, db.name, sizeof(row->name));
		row->state = db.state;
		row->workers = db.wanted;
		row->running = 0;
		strlcpy(row->last_error, db.error, sizeof(row->last_error));
		row->last_error_at = db.error_at;
	}
	for (int i = 0; i < settings.max_workers; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		Oid db = slot->pid != 0 ? slot->database : InvalidOid;
		SpinLockRelease(&slot->mutex);
		for (int r = 0; r < n && db != InvalidOid; r++) {
			rows[r].running += rows[r].database == db;
		}
	}
	SpinLockAcquire(&shared->launcher.mutex);
	memcpy(shared->launcher.rows, rows, sizeof(rows[0]) * n);
	shared->launcher.n_rows = n;
	SpinLockRelease(&shared->launcher.mutex);
}

// A launcher that starts while workers run (it was restarted itself) has no handles for them:
// it stops them and starts afresh. Workers registered but not started yet find their slot's
// generation changed and exit.
void
AdoptOrphans() {
	for (int i = 0; i < kMaxSlots; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		int pid = slot->pid;
		SpinLockRelease(&slot->mutex);
		if (pid != 0) {
			kill(pid, SIGTERM);
		}
	}
	TimestampTz deadline = TimestampTzPlusMilliseconds(Now(), kAdoptWaitMs);
	for (;;) {
		bool running = false;
		for (int i = 0; i < kMaxSlots; i++) {
			WorkerSlot *slot = SlotOf(i);
			SpinLockAcquire(&slot->mutex);
			running |= slot->pid != 0;
			SpinLockRelease(&slot->mutex);
		}
		if (!running || Now() >= deadline || ShutdownRequestPending) {
			break;
		}
		(void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 100, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	for (int i = 0; i < kMaxSlots; i++) {
		ReleaseSlot(i);
	}
}

void
OnLauncherExit(int, Datum) {
	SpinLockAcquire(&shared->launcher.mutex);
	shared->launcher.pid = 0;
	shared->launcher.latch = nullptr;
	SpinLockRelease(&shared->launcher.mutex);
}

// Requests from sessions: which databases to look at again. A look at a database that holds
// slots restarts nothing (its workers see what they need themselves); one without slots starts
// afresh with the probe count, as it may wait for a count nobody wants any more.
bool
TakeRequests() {
	Oid look[kMaxLauncherRequests];
	SpinLockAcquire(&shared->launcher.mutex);
	bool rescan = shared->launcher.rescan;
	bool look_all = shared->launcher.look_all;
	int n = shared->launcher.n_look;
	memcpy(look, shared->launcher.look, sizeof(look[0]) * n);
	shared->launcher.rescan = false;
	shared->launcher.look_all = false;
	shared->launcher.n_look = 0;
	SpinLockRelease(&shared->launcher.mutex);
	for (int i = 0; i < n_databases; i++) {
		Database *db = &databases[i];
		bool asked = look_all;
		for (int j = 0; j < n && !asked; j++) {
			asked = look[j] == db->oid;
		}
		if (!asked) {
			continue;
		}
		// A look under way that finds no extension may have looked before this commit.
		db->asked = ++asks;
		int slots[kMaxSlots];
		if (SlotsOf(db->oid, slots) == 0) {
			if (!SingleDatabaseMode()) {
				db->extension = Extension::Unknown;
			}
			db->wanted = ProbeCount();
			db->next_probe = 0;
			db->not_before = 0;
		}
	}
	return rescan || look_all || n > 0;
}

// Restarts sessions asked for on a database's slots (its outbox.workers changed, which only a
// worker connected to it sees): all of its workers stop and start again with the count they ran
// with (worker 0 corrects it), on the slots the database keeps meanwhile.
void
TakeRestarts() {
	for (int s = 0; s < settings.max_workers; s++) {
		WorkerSlot *slot = SlotOf(s);
		SpinLockAcquire(&slot->mutex);
		Oid oid = slot->restart_requested ? slot->database : InvalidOid;
		slot->restart_requested = false;
		SpinLockRelease(&slot->mutex);
		Database *db = OidIsValid(oid) ? FindDatabase(oid) : nullptr;
		if (db == nullptr) {
			continue;
		}
		int slots[kMaxSlots];
		int n = SlotsOf(oid, slots);
		for (int i = 0; i < n; i++) { // the database's other marks are served by this restart
			WorkerSlot *other = SlotOf(slots[i]);
			SpinLockAcquire(&other->mutex);
			other->restart_requested = false;
			SpinLockRelease(&other->mutex);
		}
		TerminateAll(db, slots, n);
		db->asked = ++asks;
		if (!SingleDatabaseMode()) {
			db->extension = Extension::Unknown;
		}
		// Again with the count it ran with, on the slots it keeps (worker 0 corrects a changed
		// count): the files' count may need more slots than it kept, and leave it with none.
		db->wanted = n > 0 ? n : ProbeCount();
		db->next_probe = 0;
		db->not_before = 0;
	}
}

// Databases that hold no slot start next with the configuration files' count, corrected by
// their first worker: the count they wait for may be one nobody wants any more.
void
ProbeAgainWithoutSlots() {
	for (int i = 0; i < n_databases; i++) {
		int slots[kMaxSlots];
		if (databases[i].wanted != 0 && SlotsOf(databases[i].oid, slots) == 0) {
			databases[i].wanted = ProbeCount();
		}
	}
}

void
LauncherMain(Datum) {
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	ConfigReloadPending = true; // a reload signalled before the handler was ignored (worker.cpp)
	// Shared catalogs only (pg_database, pg_db_role_setting): the launcher holds no database, so
	// it never stands in the way of DROP DATABASE.
	BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
	pgstat_report_appname("outbox launcher");
	launcher_context = AllocSetContextCreate(TopMemoryContext, "outbox launcher", ALLOCSET_DEFAULT_SIZES);

	SpinLockAcquire(&shared->launcher.mutex);
	shared->launcher.pid = MyProcPid;
	shared->launcher.latch = MyLatch;
	shared->launcher.started_at = Now();
	SpinLockRelease(&shared->launcher.mutex);
	before_shmem_exit(OnLauncherExit, 0);
	AdoptOrphans();

	if (SingleDatabaseMode()) {
		ereport(LOG, (errmsg("outbox launcher: outbox.database is deprecated: relaying database \"%s\" only",
		                     settings.database),
		              errhint("Set outbox.database = '' to relay every database where the extension is installed; "
		                      "ALTER DATABASE ... SET outbox.workers = 0 keeps one out.")));
	} else {
		ereport(LOG, (errmsg("outbox launcher started: relaying every database where the extension is installed "
		                     "(outbox.max_workers = %d)",
		                     settings.max_workers)));
	}

	TimestampTz next_scan = 0;
	while (!ShutdownRequestPending) {
		CHECK_FOR_INTERRUPTS();
		bool reloaded = false;
		if (ConfigReloadPending) {
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			reloaded = true;
		}
		if (reloaded) {
			ProbeAgainWithoutSlots(); // outbox.workers of the configuration files may have changed
		}
		TimestampTz now = Now();
		TakeRestarts();
		if (TakeRequests() || reloaded || now >= next_scan) {
			ScanDatabases();
			next_scan = TimestampTzPlusMilliseconds(now, settings.launcher_naptime_ms);
		}
		now = Now();
		for (int i = 0; i < n_databases; i++) {
			Reconcile(&databases[i], now);
		}
		// Forget databases that are gone once their workers are.
		for (int i = 0; i < n_databases;) {
			int slots[kMaxSlots];
			if (!databases[i].exists && SlotsOf(databases[i].oid, slots) == 0) {
				databases[i] = databases[--n_databases];
			} else {
				i++;
			}
		}
		PublishRows();
		long sleep_ms = Min(kTickMs, TimestampDifferenceMilliseconds(Now(), next_scan));
		int rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, Max(sleep_ms, 1L),
		                   PG_WAIT_EXTENSION);
		if (rc & WL_LATCH_SET) {
			ResetLatch(MyLatch);
		}
	}
	ereport(LOG, (errmsg("outbox launcher stopping")));
	// Exit code 1: restarted after bgw_restart_time unless the server is shutting down.
	proc_exit(1);
}

} // namespace

bool
SingleDatabaseMode() {
	return settings.database != nullptr && settings.database[0] != '\0';
}

bool
ExtensionInstalled() {
	StartTransactionCommand();
	bool installed = OidIsValid(get_extension_oid("outbox", true));
	CommitTransactionCommand();
	return installed;
}

void
ExitForMissingExtension(const char *database, int worker_index) {
	ereport(LOG, (errmsg("outbox relay %d: extension \"outbox\" is not installed in database \"%s\"; stopping "
	                     "(CREATE EXTENSION outbox starts the relay there again)",
	                     worker_index, database)));
	proc_exit(0);
}

void
RegisterLauncher() {
	if (settings.max_workers == 0) {
		return;
	}
	// Said at start, not at the first database that does not fit: the budget and PostgreSQL's
	// own limit are set in the same file, by someone who may not know the launcher takes one.
	if (settings.max_workers + 1 > max_worker_processes) {
		ereport(WARNING,
		        (errmsg("outbox.max_workers = %d and the launcher need %d background workers, more than "
		                "max_worker_processes = %d",
		                settings.max_workers, settings.max_workers + 1, max_worker_processes),
		         errhint("Raise max_worker_processes to at least %d plus what parallel query, logical replication "
		                 "and other extensions use, or lower outbox.max_workers; databases whose workers do not "
		                 "fit get none (state 'no worker slot').",
		                 settings.max_workers + 1)));
	}
	BackgroundWorker worker;
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	// Never on a hot standby; starts after promotion.
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = kRestartSeconds;
	strlcpy(worker.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, "outbox_launcher_main", BGW_MAXLEN);
	strlcpy(worker.bgw_name, "outbox launcher", BGW_MAXLEN);
	strlcpy(worker.bgw_type, "outbox launcher", BGW_MAXLEN);
	RegisterBackgroundWorker(&worker);
}

} // namespace outbox

extern "C" {
PGDLLEXPORT void outbox_launcher_main(Datum arg);

void
outbox_launcher_main(Datum arg) {
	outbox::CallFromPostgres("outbox_launcher_main", outbox::LauncherMain, arg);
}
}
