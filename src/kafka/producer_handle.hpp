// What kafka_transactions.cpp needs of a Producer (kafka_producer.cpp): its librdkafka handle
// and its stop check. kafka/ only.
#pragma once

#include "kafka/kafka_producer.hpp"

struct rd_kafka_s; // librdkafka's rd_kafka_t

namespace outbox::kafka {

// The first (for a transactional producer: the only) handle.
rd_kafka_s *HandleOf(Producer *producer) noexcept;
bool StopRequestedOf(const Producer *producer) noexcept;

} // namespace outbox::kafka
