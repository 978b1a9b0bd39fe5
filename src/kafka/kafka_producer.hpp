// The relay's Kafka producer: outbox.kafka_connections librdkafka handles per relay worker,
// created in the worker process, each partition sent by one of them. The only file that
// includes rdkafka.h, with kafka_reserved.cpp.
//
// Threads: librdkafka runs its own threads. None of them ever reaches Postgres code: delivery
// reports, errors and log lines are served from Flush() (on the worker's thread and, with
// several handles, threads of Flush's own that it joins before returning) and from the waits
// below, and they only write into memory this object owns. The worker reads the results
// afterwards.
// Interface: plain data and noexcept functions, so callers that also call Postgres hold no C++
// objects on their stack.
#pragma once

#include <cstddef>
#include <cstdint>

namespace outbox::kafka {

struct Header {
	const char *name;
	const void *value;
	size_t value_len;
};

struct Message {
	const char *topic;
	const void *key; // nullptr: no key
	size_t key_len;
	const void *value; // nullptr: tombstone
	size_t value_len;
	const Header *headers;
	int n_headers;
	int32_t partition;    // -1: the partitioner picks (by key)
	int64_t timestamp_ms; // CreateTime in ms since the Unix epoch; 0: now
};

struct Delivery {
	bool reported;
	bool refused_at_produce; // refused by the producer itself, before any broker saw it
	int err;                 // rd_kafka_resp_err_t; 0 = appended to the partition log
	int32_t partition;
	int64_t offset;
	// The event did not name its partition (the relay or librdkafka chose it): a refusal of it
	// as not the topic's is a stale partition count (the topic made anew with fewer partitions),
	// not the event's fault (RefusesChosenPartition).
	bool partition_chosen;
};

enum class ErrorClass {
	// The broker or the connection is in trouble, or the outcome is unknown: send the event again
	// later, without counting an attempt.
	BrokerWide,
	// This event was refused (bad topic, topic not authorised): every event of the topic is.
	PerEvent,
	// The broker refused the record batch the event travelled in (over the topic's
	// max.message.bytes, an unkeyed record for a compacted topic, ...): Kafka refuses record
	// batches, not records, so the fault may be another event's of the same partition. Per
	// event only when the event was alone in its batch (or refused by the producer itself).
	RecordBatch,
	// Dropped from the producer's queue, never sent, after another event's fatal error: not
	// this event's fault, nor the broker's.
	Purged,
	// The event names a partition its topic does not have (enqueue's partition argument): the
	// topic's configuration, not a passing state, so retrying would not help. (A partition the
	// relay chose is another matter: RefusesChosenPartition.)
	UnknownPartition,
};

// Why no broker answers (connect_error.hpp puts librdkafka's reasons in words).
enum class ConnectProblem {
	None,        // no failed connection since a broker last answered
	Unreachable, // down, no route, a TLS connection closed by the other side: retry with backoff
	Refused,     // the broker answered and refused the relay (its SASL login, a TLS certificate)
};

// Polled between the time slices of every wait in this file: the worker's interrupt flags
// (shutdown, cancel, postmaster death), read without calling Postgres.
using StopCheck = bool (*)() noexcept;

// Every setting the producer's librdkafka configuration is made from. ConfigDiffers() compares
// the configuration these give with the producer's own, so a reload of any of them remakes it.
struct ProducerConfig {
	const char *bootstrap_servers;
	const char *extra_properties; // name=value;name=value, where \; is a literal ; and \\ a backslash
	const char *properties_file;  // "" or a path: name=value lines (secrets)
	int message_timeout_ms;
	int max_event_bytes; // outbox.max_payload_bytes
	int connections;     // outbox.kafka_connections: librdkafka handles, each partition sent by one
	StopCheck stop_requested;
	// "" for the idempotent producer (at least once); else outbox.delivery = exactly_once's
	// transactional.id (kafka_transactions.hpp): one handle whatever `connections` says.
	const char *transactional_id;
	int transaction_timeout_ms; // exactly_once: kafka_transactions.hpp TransactionTimeoutMs
};

class Producer;

// nullptr on a bad configuration, with the reason in errbuf. The reason never holds a value of
// extra_properties (it may be a secret): it names a known property or an entry's position.
Producer *CreateProducer(const ProducerConfig &config, char *errbuf, size_t errlen) noexcept;
// For the check hook of outbox.kafka_properties: true, with the reason in problem (no value in
// it), when an entry would change a property the relay reserves. What else may be wrong with the
// text (its syntax, unknown names, bad values) is left to the worker, which reports it
// (misconfigured); so is the file, which only the worker reads. *holds_secret: an entry sets a
// secret property (a password).
bool SettingChangesReserved(const char *text, char *problem, size_t len, bool *holds_secret) noexcept;
// Purges what is queued or in flight and destroys the handle (its rows go back to pending).
void DestroyProducer(Producer *producer) noexcept;
// Whether `config` would give a librdkafka configuration other than the producer's.
bool ConfigDiffers(const Producer *producer, const ProducerConfig &config) noexcept;

// Starts a batch of `n` messages: results are kept per index until the next BeginBatch.
// Reports of messages of an earlier batch (after a timeout) are ignored.
bool BeginBatch(Producer *producer, int n) noexcept;
// librdkafka 2.0.2 looks up a topic it has not seen on its next one-second metadata tick; a
// first publish to a topic would wait for it. And the relay routes a keyed event by its topic's
// partition count. This asks, in one metadata request, for the topics not seen yet and those
// whose count is a minute old (a second for one the broker did not know): the first handle,
// then the others at the same time for a topic new to them or whose count changed; each request
// waits at most min(kMetadataLookupMs, budget_ms), none starts after the stop check said stop.
// A topic not looked up here goes the first handle's way, which partitions it itself.
void PrepareTopics(Producer *producer, const char *const *topics, int n_topics, int budget_ms) noexcept;
// Whether a broker answers: at once true when the producer's last word from the brokers was an
// ack; otherwise (a new producer, every broker down, a name that does not resolve) a metadata
// request asks, in kMetadataLookupMs slices up to budget_ms, ended by the stop check.
bool BrokerReachable(Producer *producer, int budget_ms) noexcept;
// Why the last connection to a broker failed, since one last answered (text in buf, no secret
// in it): Refused when the broker refused the relay's login or a certificate.
ConnectProblem LastConnectProblem(const Producer *producer, char *buf, size_t len) noexcept;
// Fixes the route of each of the batch's n messages (the handle and partition that will send
// it; Produce takes it from here) and gives, in order[0..n), the order to hand them over in:
// grouped by handle and partition, batch order inside each group, so a key's messages keep their
// order (batch order when a keyed message names its own partition: its key may have two). With a short linger, a partition's share then leaves in one request while the next
// partitions are still being handed over. False when out of memory (then: batch order, routes
// made at Produce).
bool PlanBatch(Producer *producer, const Message *messages, int n, int *order) noexcept;
// Enqueues message `index` of the batch. Returns 0, or the librdkafka error that refused it
// locally (its result is then not waited for). When the queue is full it waits for room, in
// slices, at most kQueueFullBudgetMs per batch, and not once the stop check is true.
int Produce(Producer *producer, int index, const Message &message) noexcept;
// Sends what is queued at once (no lingering meanwhile) and serves delivery reports for up to
// max_wait_ms (less when all are in): every handle that holds something at the same time, the
// first on the calling thread.
void Flush(Producer *producer, int max_wait_ms) noexcept;
// How many messages of the current batch have no report yet.
int Outstanding(const Producer *producer) noexcept;
// How many messages of the current batch were reported appended to their partition.
int Acked(const Producer *producer) noexcept;
const Delivery &Result(const Producer *producer, int index) noexcept;

// The idempotent producer hit a fatal error: it must be destroyed and created anew.
bool IsFatal(const Producer *producer, char *errbuf, size_t errlen) noexcept;
// -1 unknown, 0 down, 1 up: from broker errors and delivery reports.
int BrokerUp(const Producer *producer) noexcept;
// Pops one buffered log or error line for the worker to log; false when none.
bool TakeLogLine(Producer *producer, char *buf, size_t len, int *syslog_level) noexcept;

ErrorClass Classify(int err) noexcept;
// A refusal that says the topic has no such partition. For a partition the event did not name
// (Delivery::partition_chosen) the count it was chosen by was stale (a topic made anew with fewer
// partitions): not the event's fault; the relay's counts are looked up again before the next
// batch (librdkafka refreshes its own on such an error).
bool RefusesChosenPartition(int err) noexcept;
const char *ErrorName(int err) noexcept;
const char *ErrorText(int err) noexcept;
// The librdkafka the server loaded ("2.8.0"): the one this module was linked against only when
// its rpath (make RDKAFKA_PREFIX=...) or the system's library search found that one.
const char *LibraryVersion() noexcept;

// The waits' bounds (docs/settings.md, DESIGN.md "Failures").
constexpr int kMetadataLookupMs = 500;
constexpr int kQueueFullBudgetMs = 5000;
constexpr int kWaitSliceMs = 100;
// outbox.kafka_connections' upper bound.
constexpr int kMaxConnections = 16;

} // namespace outbox::kafka
