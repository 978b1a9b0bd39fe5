// The relay's Kafka producer: one librdkafka handle per relay worker, created in the worker
// process. The only file that includes rdkafka.h.
//
// Threads: librdkafka runs its own threads. None of them ever reaches Postgres code: delivery
// reports, errors and log lines are served from Serve() on the worker's own thread, and they
// only write into memory this object owns. The worker reads the results afterwards.
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
};

struct Delivery {
	bool reported;
	int err; // rd_kafka_resp_err_t; 0 = appended to the partition log
	int32_t partition;
	int64_t offset;
};

enum class ErrorClass {
	// The broker or the connection is in trouble, or the outcome is unknown: send the event again
	// later, without counting an attempt.
	BrokerWide,
	// This event was refused (too large, bad topic, not authorised, record rejected).
	PerEvent,
};

struct ProducerConfig {
	const char *bootstrap_servers;
	const char *extra_properties; // "name=value;name=value"
	int message_timeout_ms;
	int max_event_bytes; // outbox.max_payload_bytes
};

class Producer;

// nullptr on a bad configuration, with the reason in errbuf (names the bad property).
Producer *CreateProducer(const ProducerConfig &config, char *errbuf, size_t errlen) noexcept;
void DestroyProducer(Producer *producer) noexcept;

// Starts a batch of `n` messages: results are kept per index until the next BeginBatch.
// Reports of messages of an earlier batch (after a timeout) are ignored.
bool BeginBatch(Producer *producer, int n) noexcept;
// librdkafka 2.0.2 looks up a topic it has not seen on its next one-second metadata tick; a
// first publish to a topic would wait for it. This asks for the topic's metadata at once (once
// per topic and producer, bounded by timeout_ms).
void PrepareTopic(Producer *producer, const char *topic, int timeout_ms) noexcept;
// Enqueues message `index` of the batch. Returns 0, or the librdkafka error that refused it
// locally (its result is then not waited for). Waits for queue space when the queue is full.
int Produce(Producer *producer, int index, const Message &message) noexcept;
// Sends what is queued at once and waits up to max_wait_ms for its delivery reports (fewer when
// all are in), serving them on the calling thread.
void SendBatch(Producer *producer, int max_wait_ms) noexcept;
// Serves delivery reports, errors and logs on the calling thread; never blocks.
void Serve(Producer *producer) noexcept;
// How many messages of the current batch have no report yet.
int Outstanding(const Producer *producer) noexcept;
const Delivery &Result(const Producer *producer, int index) noexcept;

// A descriptor that becomes readable when librdkafka has something to serve (wait on it
// together with the latch). Drain() empties it.
int WakeFd(const Producer *producer) noexcept;
void Drain(Producer *producer) noexcept;

// The idempotent producer hit a fatal error: it must be destroyed and created anew.
bool IsFatal(const Producer *producer, char *errbuf, size_t errlen) noexcept;
// -1 unknown, 0 down, 1 up: from broker errors and delivery reports.
int BrokerUp(const Producer *producer) noexcept;
// Pops one buffered log or error line for the worker to log; false when none.
bool TakeLogLine(Producer *producer, char *buf, size_t len, int *syslog_level) noexcept;

ErrorClass Classify(int err) noexcept;
const char *ErrorName(int err) noexcept;
const char *ErrorText(int err) noexcept;
bool IsQueueFull(int err) noexcept;

} // namespace outbox::kafka
