// The producer properties the relay's guarantees rest on (or that have an outbox setting of their
// own), and the guard that keeps a user's property from changing one. Only kafka_producer.cpp
// uses it (C++ objects inside: no Postgres header may see it).
//
// The guard judges the effect, not the spelling: librdkafka reaches one property by several names
// (aliases such as linger.ms for queue.buffering.max.ms, a "topic." prefix for every topic
// property), so a list of names always misses one. Each user property is applied to two scratch
// configurations whose reserved properties hold two different values; a property that changes
// any of them in either is refused, whatever it was called and whatever value it gave (a value
// cannot equal both).
#pragma once

#include <string>
#include <vector>

struct rd_kafka_conf_s; // librdkafka's rd_kafka_conf_t

namespace outbox::kafka {

class ReservedGuard {
public:
	ReservedGuard();
	~ReservedGuard();
	ReservedGuard(const ReservedGuard &) = delete;
	ReservedGuard &operator=(const ReservedGuard &) = delete;

	// "" when name=value leaves every reserved property as it is (or names no property, or a
	// value librdkafka refuses: that is reported when the producer is made); else why not, naming
	// `name` as written and the reserved property it reaches. Never holds the value.
	std::string Refusal(const std::string &name, const std::string &value);

private:
	struct Scratch;
	Scratch *scratch_[2];
};

// The reserved properties' values in `conf`, in a fixed order: the producer compares them before
// and after the user's properties are applied, a last check behind the guard.
std::vector<std::string> ReservedValues(rd_kafka_conf_s *conf);

} // namespace outbox::kafka
