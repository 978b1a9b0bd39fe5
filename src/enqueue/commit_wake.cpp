// The lanes a transaction asked to wake, kept until it ends, and the transaction callback that
// wakes their workers at commit (commit_wake.hpp); outbox.wake_relay_at_commit(), the internal
// function the retry functions call.
#include "enqueue/commit_wake.hpp"

#include "shared/boundary.hpp"
#include "shared/shmem.hpp"

namespace {

// Lanes this transaction asked to wake: at commit, the workers of this database owning them are
// woken. Only bits: a transaction that asks a million times wakes each worker once.
outbox::LaneMask wake_lanes = {};
bool xact_callback_registered = false;

void
OnTransactionEnd(XactEvent event, void *) {
	switch (event) {
	case XACT_EVENT_COMMIT:
	case XACT_EVENT_PARALLEL_COMMIT:
		// Called after the commit is visible to other snapshots: the woken worker sees the rows.
		outbox::WakeWorkers(MyDatabaseId, wake_lanes);
		wake_lanes = {};
		break;
	case XACT_EVENT_ABORT:
	case XACT_EVENT_PARALLEL_ABORT:
	case XACT_EVENT_PREPARE:
		// A prepared transaction does not wake the relay when COMMIT PREPARED runs later; the
		// poll interval picks its events up (docs/settings.md: outbox.poll_interval).
		wake_lanes = {};
		break;
	default:
		break;
	}
}

extern "C" void
outbox_xact_callback(XactEvent event, void *arg) {
	outbox::CallFromPostgres("outbox_xact_callback", OnTransactionEnd, event, arg);
}

void
RegisterOnce() {
	if (!xact_callback_registered) {
		RegisterXactCallback(outbox_xact_callback, nullptr);
		xact_callback_registered = true;
	}
}

} // namespace

namespace outbox {

void
WakeLaneAtCommit(int lane) {
	RegisterOnce();
	wake_lanes.bits[lane / 64] |= uint64(1) << (lane % 64);
}

void
WakeAllAtCommit() {
	RegisterOnce();
	for (uint64 &bits : wake_lanes.bits) {
		bits = ~uint64(0);
	}
}

} // namespace outbox

// outbox.wake_relay_at_commit(): for outbox.retry() and retry_failed() (SECURITY DEFINER), granted
// to nobody. Even a caller with EXECUTE could only set bits: each of its commits wakes each
// worker once, as one committed enqueue per lane would.
OUTBOX_SQL_FUNCTION(outbox_wake_relay_at_commit) {
	(void)fcinfo; // no arguments
	outbox::WakeAllAtCommit();
	PG_RETURN_VOID();
}
