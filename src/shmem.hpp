// Shared memory: one slot per relay worker (what outbox.workers shows, and the latch that
// committed enqueues set to wake the worker).
#pragma once

#include "guc.hpp"
#include "metrics.hpp"
#include "pg_include.hpp"

namespace outbox {

enum class WorkerState : int {
	Stopped = 0,
	Starting,
	Idle,
	Claiming,
	Publishing,
	Recording,
	BackingOff,
	Misconfigured,
	NoExtension,
	WaitingForStandby, // failover-safe publishing: a standby of outbox.failover_standbys lags or is gone
};

enum class BrokerState : int { Unknown = 0, Up, Down };

const char *WorkerStateName(WorkerState s);
const char *BrokerStateName(BrokerState s);

struct WorkerSlot {
	slock_t mutex;
	int pid;
	Latch *latch;
	WorkerState state;
	BrokerState broker;
	uint64 published;
	uint64 failed;
	TimestampTz started_at;
	TimestampTz last_error_at;
	TimestampTz last_publish_at;
	char last_error[256];
	// Set when the worker could not connect to outbox.database; the next start waits before
	// trying again, so a missing database gives one log line per retry period, not a crash loop.
	int connect_failures;
	WorkerMetrics metrics; // outbox.worker_metrics()
};

// Commit order (commit_order.cpp): per stripe, the highest order_lsn a committing transaction
// gave a (topic, key) hashing to it. Raise-only; keys sharing a stripe only cost re-stamps.
constexpr uint32 kOrderStripes = 65536;

struct SharedState {
	WorkerSlot slots[kMaxWorkers];
	pg_atomic_uint64 order_stripes[kOrderStripes];
};

extern SharedState *shared;

// Called from _PG_init: asks for the memory (PG15+: through shmem_request_hook).
void RequestSharedMemory();

WorkerSlot *SlotOf(int worker);

// The commit-order stripe of a (topic, key) hash.
pg_atomic_uint64 *OrderStripe(uint64 key_hash);

// Sets the latch of each worker in the bitmask. Safe in a transaction callback (no ERROR).
void WakeWorkers(uint32 worker_mask);

void SetWorkerState(WorkerSlot *slot, WorkerState state);
void SetWorkerError(WorkerSlot *slot, WorkerState state, const char *error);

} // namespace outbox
