// Relay metrics in the worker slots (metrics.hpp). Each update is a few additions under the
// slot's spinlock; the timings come from a monotonic clock.
#include "shared/metrics.hpp"

#include "relay/relay_sql.hpp"
#include "shared/shmem.hpp"

namespace outbox {

// Batch sizes up to outbox.batch_size's default and beyond; seconds from a fast local claim
// (about a millisecond) to outbox.publish_timeout's default.
const double kBatchSizeBounds[kBatchSizeBuckets] = {1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 20000, 50000};
const double kSecondsBounds[kSecondsBuckets] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                0.25,   0.5,   1,      2.5,   5,    10,   30};

namespace {

// This process's early record time for the batch in flight (one worker per process).
double early_record_seconds = 0;

void
Observe(Histogram *h, const double *bounds, int n_bounds, double value) {
	int bucket = 0;
	while (bucket < n_bounds && value > bounds[bucket]) {
		bucket++;
	}
	h->counts[bucket]++;
	h->sum += value;
	h->count++;
}

double
SecondsSince(instr_time start) {
	instr_time now;
	INSTR_TIME_SET_CURRENT(now);
	INSTR_TIME_SUBTRACT(now, start);
	return INSTR_TIME_GET_DOUBLE(now);
}

void
ObserveSeconds(WorkerSlot *slot, Histogram WorkerMetrics::*which, double seconds) {
	SpinLockAcquire(&slot->mutex);
	Observe(&(slot->metrics.*which), kSecondsBounds, kSecondsBuckets, seconds);
	SpinLockRelease(&slot->mutex);
}

} // namespace

instr_time
MetricsNow() {
	instr_time now;
	INSTR_TIME_SET_CURRENT(now);
	return now;
}

void
MetricsResetLocked(WorkerMetrics *metrics) {
	early_record_seconds = 0;
	memset(metrics, 0, sizeof(*metrics));
}

void
MetricsNoteConnected(WorkerSlot *slot) {
	SpinLockAcquire(&slot->mutex);
	slot->metrics.database = MyDatabaseId;
	SpinLockRelease(&slot->mutex);
}

void
MetricsNoteClaim(WorkerSlot *slot, instr_time start) {
	early_record_seconds = 0; // a batch cut short by an ERROR leaves its early records here
	ObserveSeconds(slot, &WorkerMetrics::claim_seconds, SecondsSince(start));
}

void
MetricsNotePublish(WorkerSlot *slot, instr_time start) {
	ObserveSeconds(slot, &WorkerMetrics::publish_seconds, SecondsSince(start));
}

void
MetricsNoteEarlyRecord(instr_time start) {
	early_record_seconds += SecondsSince(start);
}

void
MetricsNoteBatch(WorkerSlot *slot, const Batch &batch, const Outcome *outcomes, int failed, instr_time record_start) {
	double record_seconds = early_record_seconds + SecondsSince(record_start);
	early_record_seconds = 0;
	// RecordOutcomes moves rejected events at max_attempts and quarantined ones to failed:
	// the rejected ones it did not move stay pending for a retry.
	int64 charged = 0;
	uint64 requeued = 0;
	for (int i = 0; i < batch.n; i++) {
		charged += outcomes[i] == Outcome::Rejected || outcomes[i] == Outcome::Quarantined;
		requeued += outcomes[i] == Outcome::Requeued || outcomes[i] == Outcome::Deferred;
	}
	SpinLockAcquire(&slot->mutex);
	WorkerMetrics &m = slot->metrics;
	Observe(&m.batch_size, kBatchSizeBounds, kBatchSizeBuckets, batch.n);
	Observe(&m.record_seconds, kSecondsBounds, kSecondsBuckets, record_seconds);
	m.retried += uint64(Max(charged - failed, int64(0)));
	m.requeued += requeued;
	SpinLockRelease(&slot->mutex);
}

void
MetricsNoteBackoff(WorkerSlot *slot, TimestampTz until) {
	SpinLockAcquire(&slot->mutex);
	slot->metrics.backoffs++;
	slot->metrics.backoff_until = until;
	SpinLockRelease(&slot->mutex);
}

void
MetricsNoteStepError(WorkerSlot *slot, uint64 resent, TimestampTz until) {
	SpinLockAcquire(&slot->mutex);
	slot->metrics.resent += resent;
	slot->metrics.backoff_until = until;
	SpinLockRelease(&slot->mutex);
}

void
MetricsNoteRingRetention(WorkerSlot *slot, TimestampTz oldest_sealed_at, bool stalled) {
	SpinLockAcquire(&slot->mutex);
	slot->metrics.ring_oldest_sealed_at = oldest_sealed_at;
	slot->metrics.ring_retention_stalls += stalled ? 1 : 0;
	SpinLockRelease(&slot->mutex);
}

} // namespace outbox
