// The relay's statements against outbox.events, over SPI with plans prepared once: a batch's
// claim and record share one transaction, the other steps have a short one each. Plain C-style code: results are copied into palloc'd memory of the
// caller's context; nothing here owns a C++ object.
#pragma once

#include "kafka/kafka_producer.hpp"
#include "shared/pg_include.hpp"

namespace outbox {

struct ClaimedEvent {
	int64 id;
	char event_id[40]; // text form, also published as the event_id header
	char *topic;
	char *key; // nullptr: unkeyed
	int key_len;
	char *payload; // nullptr: tombstone
	int payload_len;
	kafka::Header *headers; // user headers, then event_id (then a CloudEvent's ce_* headers)
	int n_headers;
	int32 partition;    // enqueue's partition argument, or -1: the partitioner picks by key
	int64 timestamp_ms; // the record's CreateTime (outbox.message_timestamp), or 0: the producer's clock
	// Set when the row cannot be published as it is (written by hand: a JSON null header, bytes
	// that are not UTF-8, a topic not allowed): it goes to failed with this reason.
	const char *quarantine;
};

// The order scope: two keyed events of one topic and key (Kafka's own unit: a key on two topics
// lands on two partitions, which no consumer reads in a defined relative order).
inline bool
SameTopicAndKey(const char *topic_a, const char *key_a, const char *topic_b, const char *key_b) {
	return key_a && key_b && strcmp(key_a, key_b) == 0 && strcmp(topic_a, topic_b) == 0;
}

inline bool
SameOrderScope(const ClaimedEvent &a, const ClaimedEvent &b) {
	return SameTopicAndKey(a.topic, a.key, b.topic, b.key);
}

struct Batch {
	int n;
	ClaimedEvent *events;
	// The claim stopped at a budget (batch_size, batch_max_bytes, a hole's window), so rows may be
	// waiting: the worker claims again at once instead of lingering (outbox.batch_linger). Not
	// enough to skip an empty claim's sleep: rows a session holds locked can make a claim cut with
	// nothing taken, again and again.
	bool cut;
	// The ring's empty claim moved on through rows (RecordCursor): its walk passed rows (held
	// behind their key), or a committed hole's walk went on. Each such claim passes rows that the
	// next one does not read again, so a cut empty claim that progressed is followed at once
	// without a loop; a cursor moved only to the WAL horizon is not progress.
	bool progressed;
};

// What happened to each claimed event.
enum class Outcome : char {
	Published = 'p',
	Rejected = 'r', // per-event error: attempts + 1, backoff, or failed at max_attempts
	Requeued = 'q', // not sent, broker-wide trouble, or unknown outcome: pending, no attempt used
	Deferred = 'd', // its partition was unavailable while others worked: pending after a delay,
	                // no attempt used (the key waits; other keys go on)
	Quarantined = 'x', // never sent: the row cannot be published as it is; failed, with the reason
};

// Whether outbox.events exists in this database, no DDL holds it, and the relay may use it.
// Logs nothing: Refused comes with a reason (LastStepProblem) for the worker to report.
enum class TableState {
	Ready,
	Missing, // no extension, schema or table
	Busy,    // DDL holds the table
	Refused, // not the extension's own objects, or outbox.relay_role is missing, a superuser or lacks rights
};

// Once per worker: lets a pending stop cancel a relay statement that runs too long (relay_sql.cpp).
void InitStatementStopCheck();

// Why the last step was Refused.
const char *LastStepProblem();

// The lane filter: worker `worker` of `n_workers` owns lanes with lane % n_workers = worker.
struct LaneSet {
	int worker;
	int n_workers;
};

// First puts orphaned in_flight rows of this worker's lanes back to pending (*requeued counts
// them), then returns the claimed batch (possibly empty) in `into`; the result says why nothing
// was claimed. With a non-empty batch the claim's transaction stays open, holding the rows'
// locks, and the caller must call RecordOutcomes (an ERROR meanwhile aborts it: the rows stay
// pending, unlocked).
// `max_events`: at most this many events (0: outbox.batch_size), for claims that must be small.
TableState ClaimBatch(const LaneSet &lanes, MemoryContext into, Batch *batch, int64 *requeued, int max_events = 0);

// Records published events (indices into the batch) in the claim's transaction and leaves it
// open: the worker records a batch's first acks while the rest of it is still in flight.
void RecordPublished(const Batch &batch, const int *events, int n, const kafka::Delivery *deliveries);

// Records every outcome but Requeued (and the published events `recorded` marks: recorded
// already) in the claim's transaction and commits it. Returns how many events moved to failed
// (their ids and errors are logged once here).
//
// With `prepare_gid` (outbox.delivery = exactly_once) the transaction is prepared under that gid
// instead of committed (prepared_batch.hpp decides it).
int RecordOutcomes(const Batch &batch, const Outcome *outcomes, const kafka::Delivery *deliveries,
                   const char *const *errors, long defer_ms, const bool *recorded,
                   const char *prepare_gid = nullptr);

// Milliseconds until the next retry of this worker's lanes is due, or -1 if none is waiting.
int64 MillisUntilNextRetry(const LaneSet &lanes);

// What a retention round on the ring (schema 0.4.0) left behind, read from outbox.ring_status in
// a step of its own after the round's commit (its failure cannot roll the round back), as of the
// round's now(). Plain data: the worker logs and counts it after the step.
struct RingRetentionOutcome {
	bool on_ring;                // the round ran on the ring (else nothing below is set)
	TimestampTz oldest_sealed_at; // the oldest sealed member's seal, 0 when none is sealed
	int overdue_member;           // the oldest member sealed past the window and still kept, or -1
	TimestampTz overdue_sealed_at;
	bool rotation_blocked;        // the member after the current one is not free
	char kept_because[192];       // why overdue_member is kept ("" when it could not be told)
};

// One retention batch in its own transaction; returns rows deleted. On the ring, `ring` tells
// what the round could not empty.
int64 PurgeBatch(int retention_s, int batch_size, RingRetentionOutcome *ring);

} // namespace outbox
