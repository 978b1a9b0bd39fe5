// outbox.delivery = exactly_once's side of Kafka (DESIGN.md "Exactly once"): the relay's producer
// made transactional (ProducerConfig::transactional_id), one Kafka transaction per batch, which
// also commits the batch's sequence number as the committed offset of a consumer group of the
// producer's own (group id = transactional.id) on partition 0 of the progress topic. That offset
// is Kafka's own record of the last batch it committed, read back after a crash to decide the
// batch's prepared Postgres transaction.
//
// Every call waits in slices of kafka::kMetadataLookupMs, at most its budget, and stops once the
// producer's stop check says so; librdkafka's transactional calls resume where a timed-out call
// left off. Same threading contract as kafka_producer.hpp: no Postgres, noexcept.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kafka/kafka_producer.hpp"

namespace outbox::kafka {

// librdkafka's message.timeout.ms (outbox.publish_timeout) must not pass transaction.timeout.ms;
// the batch's transaction stays open through the delivery wait, the PREPARE, the failover wait
// for it (outbox.failover_wait_timeout, when failover standbys are named) and the commit: a
// minute more than those. Capped by the brokers' transaction.max.timeout.ms default (15 minutes).
// A worker killed mid-transaction holds back read_committed consumers of the partitions it wrote
// at most this long (its restart's InitTransactions ends it sooner).
constexpr int
TransactionTimeoutMs(int publish_timeout_ms, int failover_wait_ms) {
	long ms = long(publish_timeout_ms) + long(failover_wait_ms) + 60000L;
	return ms < 900000L ? int(ms) : 900000;
}

enum class TxnResult {
	Done,
	Abortable, // the transaction failed (a record refused, a timeout on the broker): abort it
	Fatal,     // fenced by a newer producer of the id, or another fatal error: destroy the producer
	TimedOut,  // no answer within the budget: the outcome is unknown
	Stopped,   // the stop check said stop: the outcome is unknown
	Refused,   // a non-retriable error that is none of the above (not authorised, a bad topic)
};

// Fences every earlier producer of the id and aborts (or waits out) what it left open.
TxnResult InitTransactions(Producer *producer, int budget_ms, char *why, size_t len) noexcept;
TxnResult BeginTransaction(Producer *producer, char *why, size_t len) noexcept;
// Adds `sequence` as the offset of group `group` on partition 0 of `topic` to the transaction, with
// `mark` as the offset's metadata (the batch's own: a batch of the same number committed by
// another relay of the same identity does not carry it), then commits it. After anything but Done
// the outcome is unknown: destroy the producer and let recovery read the offset (never abort a
// commit that may have happened).
TxnResult CommitTransaction(Producer *producer, const char *group, const char *topic, int64_t sequence,
                            const char *mark, int budget_ms, char *why, size_t len) noexcept;
TxnResult AbortTransaction(Producer *producer, int budget_ms, char *why, size_t len) noexcept;
// The committed offset of `group` on partition 0 of `topic` (-1: none) and its metadata (into
// mark[mark_len], "" for none), read stable: no answer while a transaction holding the group's
// offset is still open (KIP-447), which InitTransactions has ended for the producer's own id.
TxnResult ReadCommittedOffset(Producer *producer, const char *group, const char *topic, int budget_ms,
                              int64_t *offset, char *mark, size_t mark_len, char *why, size_t len) noexcept;
// Makes `topic` with one partition (the brokers' replication default) unless it exists.
TxnResult EnsureProgressTopic(Producer *producer, const char *topic, int budget_ms, char *why, size_t len) noexcept;

} // namespace outbox::kafka
