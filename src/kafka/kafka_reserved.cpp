// The reserved producer properties and the guard over them (kafka_reserved.hpp).
#include "kafka/kafka_reserved.hpp"

#include <librdkafka/rdkafka.h>

#include <cstring>
#include <new>
#include <vector>

#include "shared/no_postgres.hpp"

namespace outbox::kafka {

namespace {

struct Reserved {
	const char *name; // librdkafka's own name (not an alias)
	const char *why;
	// Two values librdkafka accepts that differ from each other once parsed: a user's value that
	// reaches the property changes it in at least one scratch configuration.
	const char *value_a;
	const char *value_b;
};

const Reserved kReserved[] = {
    {"metadata.broker.list", "set outbox.bootstrap_servers instead", "a:1", "b:2"},
    {"message.timeout.ms", "set outbox.publish_timeout instead", "30000", "30001"},
    {"enable.idempotence", "the relay needs the idempotent producer for per-key order", "true", "false"},
    {"enable.gapless.guarantee", "the relay needs it for per-key order", "true", "false"},
    {"request.required.acks", "the relay needs acks=all", "-1", "1"},
    {"max.in.flight.requests.per.connection", "the idempotent producer sets it", "5", "4"},
    {"log.queue", "the relay serves logs on its own thread", "true", "false"},
    {"queue.buffering.max.ms", "the relay holds each batch and sends it in one go", "50", "51"},
    {"partitioner", "the relay places keys like the Java client (murmur2_random)", "murmur2_random", "random"},
    {"queuing.strategy", "lifo would send a key's events out of order", "fifo", "lifo"},
    {"transactional.id", "set outbox.delivery = exactly_once instead (the relay derives the id)", "a", "b"},
    {"transaction.timeout.ms", "the relay sets it from outbox.publish_timeout", "60000", "60001"},
    {"internal.termination.signal", "a signal handler would replace PostgreSQL's", "0", "1"},
    // Without reports of successes every acknowledged batch would time out and be sent again.
    {"delivery.report.only.error", "the relay records each event from its delivery report", "false", "true"},
    // The relay charges an unknown topic to the event after this long, not to the broker.
    {"topic.metadata.propagation.max.ms", "set outbox.publish_timeout instead (the relay uses half of it)", "15000",
     "15001"},
};

// Names refused before they are applied, even to a scratch configuration: setting them acts at
// once. librdkafka matches names exactly (case and blanks count) and these have no alias, so the
// name is the only spelling.
// Each would let whoever may set outbox.kafka_properties run code as the server's OS user (that is,
// be a superuser), or divert the events; the setting may be granted to a role that is none.
const Reserved kRefusedByName[] = {
    // Loads the libraries when set; a plugin's code would run inside the server process, and its
    // interceptors could change any property behind the guard.
    {"plugin.library.paths", "a plugin would run its own code inside the PostgreSQL server process", nullptr,
     nullptr},
    // A shell command the producer runs for GSSAPI (the default kinit command stays in use).
    {"sasl.kerberos.kinit.cmd", "it runs a shell command as the PostgreSQL server's OS user", nullptr, nullptr},
    // Shared objects OpenSSL loads into the server process.
    {"ssl.engine.location", "it loads a shared object into the PostgreSQL server process", nullptr, nullptr},
    {"ssl.providers", "it loads OpenSSL providers into the PostgreSQL server process", nullptr, nullptr},
};

// Name prefixes refused the same way: librdkafka's test.mock.* properties swap the brokers for an
// in-process mock when the producer is made (after every check), so events would be recorded as
// published that never reached Kafka.
const Reserved kRefusedByPrefix[] = {
    {"test.mock.", "it replaces the Kafka cluster with librdkafka's in-process mock", nullptr, nullptr},
};

std::string
ValueOf(rd_kafka_conf_t *conf, const char *name) {
	char buf[512];
	size_t size = sizeof(buf);
	if (rd_kafka_conf_get(conf, name, buf, &size) != RD_KAFKA_CONF_OK) {
		return std::string("\x01unset"); // cannot be a value librdkafka returns
	}
	return std::string(buf);
}

std::string
RefusalText(const std::string &written, const Reserved &r) {
	std::string text = "may not set \"" + written + "\"";
	if (written != r.name) {
		text += std::string(" (librdkafka's \"") + r.name + "\")";
	}
	return text + ": " + r.why;
}

} // namespace

struct ReservedGuard::Scratch {
	rd_kafka_conf_t *conf = nullptr;
	std::vector<std::string> values; // of kReserved, in order

	explicit Scratch(bool second) {
		conf = rd_kafka_conf_new();
		if (conf == nullptr) {
			throw std::bad_alloc();
		}
		char errstr[256];
		for (const Reserved &r : kReserved) {
			// Also makes the default topic configuration, which topic properties then reach.
			(void)rd_kafka_conf_set(conf, r.name, second ? r.value_b : r.value_a, errstr, sizeof(errstr));
		}
		values = ReservedValues(conf);
	}
	~Scratch() {
		rd_kafka_conf_destroy(conf);
	}
	Scratch(const Scratch &) = delete;
	Scratch &operator=(const Scratch &) = delete;
};

ReservedGuard::ReservedGuard() : scratch_{nullptr, nullptr} {
	scratch_[0] = new Scratch(false);
	try {
		scratch_[1] = new Scratch(true);
	} catch (...) {
		delete scratch_[0];
		throw;
	}
}

ReservedGuard::~ReservedGuard() {
	delete scratch_[0];
	delete scratch_[1];
}

std::string
ReservedGuard::Refusal(const std::string &name, const std::string &value) {
	for (const Reserved &r : kRefusedByName) {
		if (name == r.name) {
			return RefusalText(name, r);
		}
	}
	for (const Reserved &r : kRefusedByPrefix) {
		if (name.compare(0, strlen(r.name), r.name) == 0) {
			return "may not set \"" + name + "\": " + r.why;
		}
	}
	char errstr[512];
	for (Scratch *s : scratch_) {
		if (rd_kafka_conf_set(s->conf, name.c_str(), value.c_str(), errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK) {
			continue; // unchanged; the producer reports the property (by position or name)
		}
		for (size_t i = 0; i < s->values.size(); i++) {
			if (ValueOf(s->conf, kReserved[i].name) != s->values[i]) {
				return RefusalText(name, kReserved[i]);
			}
		}
	}
	return "";
}

std::vector<std::string>
ReservedValues(rd_kafka_conf_s *conf) {
	std::vector<std::string> values;
	for (const Reserved &r : kReserved) {
		values.push_back(ValueOf(conf, r.name));
	}
	return values;
}

} // namespace outbox::kafka
