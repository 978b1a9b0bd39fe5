// Shared memory for the relay workers' slots and the commit-order stripes. Requested at postmaster
// start, initialised once.
#include "shared/shmem.hpp"

#include "shared/boundary.hpp"
#include "shared/guc.hpp"
#include "shared/open_writers.hpp"

namespace outbox {

SharedState *shared = nullptr;

namespace {

#if OUTBOX_HAS_SHMEM_REQUEST_HOOK
shmem_request_hook_type previous_request_hook = nullptr;
#endif
shmem_startup_hook_type previous_startup_hook = nullptr;

BulkMarker *markers = nullptr;

} // namespace

// MaxBackends, known from PG15 on when memory is requested (shmem_request_hook); PG14 asks in
// _PG_init, before InitializeMaxBackends, so its sum is repeated here.
uint32
BackendCount() {
#if OUTBOX_HAS_SHMEM_REQUEST_HOOK
	return uint32(MaxBackends);
#else
	return uint32(MaxConnections + autovacuum_max_workers + 1 + max_worker_processes + max_wal_senders);
#endif
}

namespace {

Size
SharedSize() {
	return add_size(MAXALIGN(sizeof(SharedState)), mul_size(BackendCount(), sizeof(BulkMarker)));
}

void
RequestMemory() {
#if OUTBOX_HAS_SHMEM_REQUEST_HOOK
	if (previous_request_hook) {
		previous_request_hook();
	}
#endif
	RequestAddinShmemSpace(SharedSize());
	RequestOpenWritersMemory();
}

void
StartupMemory() {
	if (previous_startup_hook) {
		previous_startup_hook();
	}
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	bool found;
	shared = static_cast<SharedState *>(ShmemInitStruct("outbox", SharedSize(), &found));
	if (!found) {
		memset(shared, 0, SharedSize());
		for (int i = 0; i < kMaxSlots; i++) {
			SpinLockInit(&shared->slots[i].mutex);
			pg_atomic_init_u32(&shared->slots[i].wake_requested, 0);
		}
		SpinLockInit(&shared->launcher.mutex);
		for (uint32 i = 0; i < kOrderStripes; i++) {
			pg_atomic_init_u64(&shared->order_stripes[i], 0);
			pg_atomic_init_u32(&shared->bulk_marks[i], 0);
		}
	}
	markers = reinterpret_cast<BulkMarker *>(reinterpret_cast<char *>(shared) + MAXALIGN(sizeof(SharedState)));
	if (!found) {
		for (uint32 i = 0; i < BackendCount(); i++) {
			pg_atomic_init_u32(&markers[i].marking, 0);
		}
	}
	AttachOpenWriters();
	LWLockRelease(AddinShmemInitLock);
}

} // namespace

extern "C" {
static void
outbox_shmem_request(void) {
	CallFromPostgres("outbox_shmem_request", RequestMemory);
}
static void
outbox_shmem_startup(void) {
	CallFromPostgres("outbox_shmem_startup", StartupMemory);
}
}

void
RequestSharedMemory() {
	// One function for every supported version: PG15 added shmem_request_hook and made requests
	// outside it a FATAL error; PG13/14 take the request directly from _PG_init.
#if OUTBOX_HAS_SHMEM_REQUEST_HOOK
	previous_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_shmem_request;
#else
	outbox_shmem_request();
#endif
	previous_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_shmem_startup;
}

WorkerSlot *
SlotOf(int slot) {
	Assert(shared != nullptr && slot >= 0 && slot < kMaxSlots);
	return &shared->slots[slot];
}

pg_atomic_uint64 *
OrderStripe(uint64 key_hash) {
	Assert(shared != nullptr);
	return &shared->order_stripes[key_hash % kOrderStripes];
}

uint32
BulkMarkIndex(uint64 key_hash) {
	// Per database, like the key locks and the gates it sends a PREPARE to: a bulk commit waiting
	// in another database must not make this database's PREPAREs look for it.
	uint64 mixed = key_hash ^ (uint64(MyDatabaseId) * UINT64CONST(0x9E3779B97F4A7C15));
	return uint32(mixed % kOrderStripes);
}

pg_atomic_uint32 *
BulkMark(uint64 key_hash) {
	Assert(shared != nullptr);
	return &shared->bulk_marks[BulkMarkIndex(key_hash)];
}

uint32
BulkBackendCount() {
	return BackendCount();
}

BulkMarker *
BulkMarkerOf(uint32 backend) {
	Assert(markers != nullptr);
	if (backend >= BackendCount()) {
		elog(ERROR, "outbox: backend index %u is beyond the %u commit-order markers", backend, BackendCount());
	}
	return &markers[backend];
}

void
WakeWorkers(Oid db, const LaneMask &lanes) {
	if (shared == nullptr) {
		return;
	}
	// Only the slots the launcher hands out (outbox.max_workers): this runs at every commit.
	for (int i = 0; i < settings.max_workers; i++) {
		WorkerSlot *slot = &shared->slots[i];
		SpinLockAcquire(&slot->mutex);
		bool mine = slot->database == db && slot->n_workers > 0;
		int index = slot->index;
		int n = slot->n_workers;
		Latch *latch = slot->latch;
		SpinLockRelease(&slot->mutex);
		if (!mine || latch == nullptr) {
			continue;
		}
		bool owns = false;
		for (int lane = index; lane < kLaneCount && !owns; lane += n) {
			owns = (lanes.bits[lane / 64] >> (lane % 64)) & 1;
		}
		// A stale latch (worker just exited) belongs to some other PGPROC: a spurious wake-up is
		// harmless, every latch user re-checks its condition.
		if (owns) {
			pg_atomic_write_u32(&slot->wake_requested, 1);
			SetLatch(latch); // a barrier: the worker that sees the latch set sees the request
		}
	}
}

bool
TakeWakeRequest(WorkerSlot *slot) {
	return pg_atomic_exchange_u32(&slot->wake_requested, 0) != 0;
}

const char *
WorkerStateName(WorkerState s) {
	switch (s) {
	case WorkerState::Stopped:
		return "stopped";
	case WorkerState::Starting:
		return "starting";
	case WorkerState::Idle:
		return "idle";
	case WorkerState::Lingering:
		return "lingering";
	case WorkerState::Claiming:
		return "claiming";
	case WorkerState::Publishing:
		return "publishing";
	case WorkerState::Recording:
		return "recording";
	case WorkerState::BackingOff:
		return "backing off";
	case WorkerState::Misconfigured:
		return "misconfigured";
	case WorkerState::NoExtension:
		return "extension not installed";
	case WorkerState::WaitingForStandby:
		return "waiting for standby";
	case WorkerState::Recovering:
		return "recovering";
	case WorkerState::NoWorkerSlot:
		return "no worker slot";
	}
	return "unknown";
}

const char *
DatabaseStateName(DatabaseState s) {
	switch (s) {
	case DatabaseState::Starting:
		return "starting";
	case DatabaseState::Running:
		return "running";
	case DatabaseState::NoWorkerSlot:
		return "no worker slot";
	case DatabaseState::Disabled:
		return "disabled";
	case DatabaseState::StoppedForDrop:
		return "stopped for DROP DATABASE";
	}
	return "unknown";
}

const char *
BrokerStateName(BrokerState s) {
	switch (s) {
	case BrokerState::Unknown:
		return "unknown";
	case BrokerState::Up:
		return "up";
	case BrokerState::Down:
		return "down";
	}
	return "unknown";
}

void
SetWorkerState(WorkerSlot *slot, WorkerState state) {
	SpinLockAcquire(&slot->mutex);
	slot->state = state;
	SpinLockRelease(&slot->mutex);
}

void
SetWorkerError(WorkerSlot *slot, WorkerState state, const char *error) {
	TimestampTz now = GetCurrentTimestamp();
	SpinLockAcquire(&slot->mutex);
	slot->state = state;
	strlcpy(slot->last_error, error, sizeof(slot->last_error));
	slot->last_error_at = now;
	slot->recovered_at = 0;
	SpinLockRelease(&slot->mutex);
}

void
NoteCycleSucceeded(WorkerSlot *slot, TimestampTz cycle_start) {
	TimestampTz now = GetCurrentTimestamp();
	SpinLockAcquire(&slot->mutex);
	if (slot->last_error_at != 0 && slot->last_error_at < cycle_start && slot->recovered_at == 0) {
		slot->recovered_at = now;
	}
	SpinLockRelease(&slot->mutex);
}

} // namespace outbox
