// What kafka_transactions.cpp needs of a Producer (kafka_producer.cpp): its librdkafka handle
// and its stop check. kafka/ only.
#pragma once

#include "kafka/kafka_producer.hpp"

struct rd_kafka_s; // librdkafka's rd_kafka_t

namespace outbox::kafka {

// The first (for a transactional producer: the only) handle.
rd_kafka_s *HandleOf(Producer *producer) noexcept;
bool StopRequestedOf(const Producer *producer) noexcept;
// A consumer handle of consumer group `group` that reads committed offsets only
// (isolation.level=read_committed: its offset reads ask for stable offsets), made from the
// producer's connection properties (the bootstrap list and the user's TLS and SASL properties),
// never subscribed. Its log lines join the producer's. nullptr, with the reason in `why`, when it
// cannot be made. The caller destroys it (rd_kafka_destroy).
rd_kafka_s *NewGroupReader(Producer *producer, const char *group, char *why, size_t len) noexcept;

} // namespace outbox::kafka
