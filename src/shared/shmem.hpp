// Shared memory: one slot per relay worker of the cluster (what outbox.workers shows, and the
// latch that committed enqueues set to wake the worker), and what the launcher shares
// (launcher.cpp: its latch, requests from sessions, one row per database for outbox.launcher).
#pragma once

#include "shared/guc.hpp"
#include "shared/metrics.hpp"
#include "shared/kafka_names.hpp"
#include "shared/pg_include.hpp"

namespace outbox {

enum class WorkerState : int {
	Stopped = 0,
	Starting,
	Idle,
	Lingering, // outbox.batch_linger: between two batches under a steady load, not asleep
	Claiming,
	Publishing,
	Recording,
	BackingOff,
	Misconfigured,
	NoExtension,
	WaitingForStandby, // failover-safe publishing: a standby of outbox.failover_standbys lags or is gone
	Recovering, // exactly_once: deciding a batch in doubt from Kafka's record before claiming
	NoWorkerSlot, // never in a slot: outbox.workers shows it for workers the budget left out
};

enum class BrokerState : int { Unknown = 0, Up, Down };

const char *WorkerStateName(WorkerState s);
const char *BrokerStateName(BrokerState s);

struct WorkerSlot {
	slock_t mutex;
	int pid;
	Latch *latch;
	// Set (before the latch) by WakeWorkers: the worker's idle sleep ends for this, not for any
	// latch set (PostgreSQL's SIGALRM handler sets the latch too, also for a disarmed timer).
	pg_atomic_uint32 wake_requested;
	WorkerState state;
	BrokerState broker;
	uint64 published;
	uint64 failed;
	TimestampTz started_at;
	TimestampTz last_error_at;
	TimestampTz last_publish_at;
	char last_error[256];
	// When a cycle first succeeded after last_error (0: no error yet, or it is still current).
	TimestampTz recovered_at;
	WorkerMetrics metrics; // outbox.worker_metrics()
	// Written by the launcher when it reserves the slot (database InvalidOid: free): worker
	// `index` of `n_workers` of that database. `generation` changes with every reservation, so a
	// worker registered for an earlier one (by a launcher that was restarted) does not attach.
	Oid database;
	int index;
	int n_workers;
	uint32 generation;
	char database_name[NAMEDATALEN];
	// Set by the worker when its database has no extension outbox (it exits then): the
	// launcher does not start the database's workers again until CREATE EXTENSION or a probe.
	bool extension_missing;
	bool extension_present; // set by the worker once it found the extension
	// Set by the worker when outbox.workers, as its database sees it, is not n_workers (it exits
	// then, `wanted` says the count): the launcher restarts all of the database's workers with it.
	bool resize;
	int wanted;
	// Set by the worker once it has seen that its database's outbox.workers is n_workers: the
	// database keeps the slots of its restart (launcher.cpp) until its worker 0 says so.
	bool count_confirmed;

	// Set by the DROP DATABASE hook before it stops the worker: not to be restarted.
	bool stop_for_drop;
	// Set by a session's commit of ALTER DATABASE ... SET/RESET outbox.workers: the launcher
	// restarts the database's workers (on the slots themselves: no request list to overflow).
	bool restart_requested;
};

// A database the launcher serves, as outbox.launcher shows it (launcher.cpp).
enum class DatabaseState : int {
	Starting = 0,
	Running,
	NoWorkerSlot,   // the budget (outbox.max_workers or max_worker_processes) is used up
	Disabled,       // outbox.workers = 0 for this database
	StoppedForDrop, // the DROP DATABASE hook stopped its workers
};

const char *DatabaseStateName(DatabaseState s);

struct DatabaseRow {
	Oid database;
	char name[NAMEDATALEN];
	DatabaseState state;
	int workers; // wanted: outbox.workers for this database
	int running;
	char last_error[256];
	TimestampTz last_error_at;
};

constexpr int kMaxDatabaseRows = 128;   // rows of outbox.launcher (databases with the extension)
constexpr int kMaxLauncherRequests = 16;
constexpr int kMaxDropPauses = 8;

struct LauncherShared {
	slock_t mutex;
	int pid;
	Latch *latch;
	TimestampTz started_at;
	// Of the slots' reservations; in shared memory so that a restarted launcher never hands out
	// a generation a worker registered by its predecessor could still be waiting with.
	uint32 next_generation;
	// Requests from sessions (at the commit of a statement that succeeded: CREATE EXTENSION,
	// ALTER DATABASE, CREATE or DROP DATABASE): rescan pg_database, and look at these databases
	// again. Overflow: look at all again. A look restarts nothing (restarts: the slots' marks).
	bool rescan;
	bool look_all;
	int n_look;
	Oid look[kMaxLauncherRequests];
	// DROP DATABASE in progress: no worker is started for the database until `until`.
	Oid paused[kMaxDropPauses];
	TimestampTz paused_until[kMaxDropPauses];
	int n_rows;
	DatabaseRow rows[kMaxDatabaseRows];
};

// Commit order (commit_order.cpp): per stripe, the highest order_lsn a committing transaction
// gave a (topic, key) hashing to it. Raise-only; keys sharing a stripe only cost re-stamps.
constexpr uint32 kOrderStripes = 65536;

struct SharedState {
	WorkerSlot slots[kMaxSlots];
	LauncherShared launcher;
	pg_atomic_uint64 order_stripes[kOrderStripes];
	// Per stripe, how many keys hashing to it committers of many keys hold marked while they wait
	// for their keys (commit_order.cpp: a PREPARE of such a key looks for them in the markers).
	pg_atomic_uint32 bulk_marks[kOrderStripes];
	// Followed by one BulkMarker per backend (BulkMarkerOf).
};

// Commit order: what one backend's committer of many keys marked while it waits for its keys, so
// that a PREPARE finding one of its stripes marked waits for the committers that marked it and for
// no other (commit_order.cpp). Written only by its backend.
struct BulkMarker {
	pg_atomic_uint32 marking; // set after the fields below, cleared before them
	Oid database;
	LocalTransactionId lxid;              // with the backend's index, names its gate lock
	uint64 stripes[kOrderStripes / 64];   // a bit per BulkMarkIndex it marked
};

extern SharedState *shared;

// Called from _PG_init: asks for the memory (PG15+: through shmem_request_hook).
void RequestSharedMemory();

// Slot number `slot` of the cluster's kMaxSlots (the launcher hands them out).
WorkerSlot *SlotOf(int slot);

// The commit-order stripe of a (topic, key) hash.
pg_atomic_uint64 *OrderStripe(uint64 key_hash);

// The count of marks of committers of many keys of this database on that stripe (the stripe of
// (database, key hash): marks are per database like the key locks).
pg_atomic_uint32 *BulkMark(uint64 key_hash);
// That count's index, also the bit of BulkMarker::stripes.
uint32 BulkMarkIndex(uint64 key_hash);

// MaxBackends, also while shared memory is requested: one entry per backend
// (OutboxBackendIndex() is below it).
uint32 BackendCount();

// One marker per backend.
BulkMarker *BulkMarkerOf(uint32 backend);

// The lanes a transaction wrote to, one bit each.
struct LaneMask {
	uint64 bits[kLaneCount / 64];
};

// Sets the latch of each worker of database `db` that owns one of the lanes. Safe in a
// transaction callback (no ERROR).
void WakeWorkers(Oid db, const LaneMask &lanes);

// Whether WakeWorkers asked this slot's worker to look at the table since the last call.
bool TakeWakeRequest(WorkerSlot *slot);

void SetWorkerState(WorkerSlot *slot, WorkerState state);
void SetWorkerError(WorkerSlot *slot, WorkerState state, const char *error);
// A cycle begun at `cycle_start` ended without an error: an error set before it is stale now
// (outbox.workers.recovered_at). An error set during the cycle stays current.
void NoteCycleSucceeded(WorkerSlot *slot, TimestampTz cycle_start);

} // namespace outbox
