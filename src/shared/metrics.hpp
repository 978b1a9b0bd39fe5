// Relay metrics (docs/metrics.md): counters and fixed-bucket histograms in each worker's
// shared-memory slot, updated by the worker under the slot's spinlock and read by
// outbox.worker_metrics(). Histograms are Prometheus style: per-bucket counts, a sum and a count.
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

struct WorkerSlot;
struct Batch;
enum class Outcome : char;

// Upper bounds (inclusive, `le`) of the finite buckets; a last bucket takes everything above.
constexpr int kBatchSizeBuckets = 12;
constexpr int kSecondsBuckets = 15;
constexpr int kMaxBuckets = 15;
extern const double kBatchSizeBounds[kBatchSizeBuckets];
extern const double kSecondsBounds[kSecondsBuckets];

struct Histogram {
	uint64 counts[kMaxBuckets + 1]; // per bucket, not cumulative; [n_bounds] is above the last bound
	double sum;
	uint64 count;
};

struct WorkerMetrics {
	Oid database;               // the database the worker is connected to (InvalidOid before)
	uint64 retried;             // refused by the broker, pending again for a retry (attempt used)
	uint64 requeued;            // pending again without an attempt (broker trouble, not sent, deferred)
	uint64 backoffs;            // rounds of broker-wide trouble that made the worker back off
	uint64 resent;              // acked by Kafka, outcome not recorded (a step's ERROR): sent again
	TimestampTz backoff_until;  // end of the current (or last) broker backoff
	TimestampTz ring_oldest_sealed_at; // the ring's oldest sealed member at the last retention round (0: none)
	uint64 ring_retention_stalls;      // retention rounds that left a member sealed past the window
	Histogram batch_size;       // events per claimed batch
	Histogram publish_seconds;  // a batch's publish: produce to the last delivery report
	Histogram claim_seconds;    // every claim statement, empty claims included
	Histogram record_seconds;   // a batch's record statements (early records and the final one)
};

// Starting points for the timings: a monotonic clock.
instr_time MetricsNow();

// At worker start, with the slot's spinlock held, together with the slot's other per-run fields:
// a scrape never sees the new run's start beside the previous run's counters (a start that
// cannot connect waits minutes in the slot).
void MetricsResetLocked(WorkerMetrics *metrics);
// Once connected: notes the database.
void MetricsNoteConnected(WorkerSlot *slot);
void MetricsNoteClaim(WorkerSlot *slot, instr_time start);
void MetricsNotePublish(WorkerSlot *slot, instr_time start);
// Early records (acks recorded while the batch is in flight) add to the batch's record time.
void MetricsNoteEarlyRecord(instr_time start);
// After the final record: the batch's size, record time and outcomes (`failed`: moved to failed).
void MetricsNoteBatch(WorkerSlot *slot, const Batch &batch, const Outcome *outcomes, int failed,
                      instr_time record_start);
void MetricsNoteBackoff(WorkerSlot *slot, TimestampTz until);
// A step's ERROR: `resent` acked events of the batch stay pending (they go to Kafka again), and
// the worker backs off until `until` (not a broker backoff: backoffs is not counted).
void MetricsNoteStepError(WorkerSlot *slot, uint64 resent, TimestampTz until);
// After a retention round on the ring (worker 0): the oldest sealed member's seal (0: none) and
// whether the round left a member sealed past the window (a stall).
void MetricsNoteRingRetention(WorkerSlot *slot, TimestampTz oldest_sealed_at, bool stalled);

} // namespace outbox
