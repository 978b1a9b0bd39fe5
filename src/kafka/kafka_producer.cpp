// librdkafka producer of a relay worker. See kafka_producer.hpp for the threading contract.
#include "kafka/kafka_producer.hpp"

#include <librdkafka/rdkafka.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <algorithm>
#include <atomic>
#include <fcntl.h>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <pthread.h>
#include <set>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <thread>
#include <unordered_map>
#include <unistd.h>
#include <vector>

#include "kafka/connect_error.hpp"
#include "kafka/kafka_reserved.hpp"
#include "kafka/kafka_transactions.hpp"
#include "kafka/producer_handle.hpp"
#include "shared/no_postgres.hpp"
#include "kafka/secret_mask.hpp"

namespace outbox::kafka {

namespace {

constexpr size_t kMaxBufferedLogLines = 256;
// How long librdkafka holds a partition's messages before a request. Handing a partition's share
// of a batch over takes well under this (PlanBatch groups each partition's messages), and a short
// one lets the first partitions leave while the rest are handed over; between the flush's slices,
// when no flush is running, it is all a handle waits before sending what a reply made room for.
constexpr int kLingerMs = 5;
// How long a topic's partition count, looked up by the relay to route its events to a
// connection, is used before it is asked again (librdkafka refreshes its own every 5 minutes);
// a topic the broker did not know (not made yet, no leader yet) is asked again sooner.
constexpr auto kPartitionCountMaxAge = std::chrono::seconds(60);
constexpr auto kUnknownTopicMaxAge = std::chrono::seconds(1);

std::string
Trim(const std::string &s) {
	size_t b = s.find_first_not_of(" \t\r\n");
	if (b == std::string::npos) {
		return "";
	}
	size_t e = s.find_last_not_of(" \t\r\n");
	return s.substr(b, e - b + 1);
}

// One librdkafka property of the producer. `source` and `entry` say where a user's came from:
// an entry of outbox.kafka_properties or a line of outbox.kafka_properties_file (1-based);
// entry 0 is the relay's own. Errors about a user entry name its place, never its value: a
// value may be a secret, and a fragment of one may sit where a name is expected.
struct Property {
	std::string name;
	std::string value;
	int entry;
	const char *source;

	bool operator==(const Property &o) const {
		return name == o.name && value == o.value;
	}
};

using Properties = std::vector<Property>;

constexpr const char *kPropertiesEntry = "outbox.kafka_properties entry";
constexpr off_t kMaxPropertiesFileBytes = 1024 * 1024;
constexpr const char *kPropertiesFileLine = "outbox.kafka_properties_file line";

std::string
EntryError(const char *source, int entry, const char *what) {
	return std::string(source) + " " + std::to_string(entry) + " " + what;
}

// Each (position, text) entry is name=value: the first '=' separates, blanks around both are
// trimmed, an empty entry is skipped. Appends them to *out.
bool
AddEntries(const std::vector<std::pair<int, std::string>> &entries, const char *source, Properties *out,
           std::string *error) {
	for (const auto &[entry, text] : entries) {
		std::string item = Trim(text);
		if (item.empty()) {
			continue;
		}
		size_t eq = item.find('=');
		std::string name = Trim(item.substr(0, eq));
		if (eq == std::string::npos || name.empty()) {
			*error = EntryError(source, entry, "is not name=value (in outbox.kafka_properties entries are separated "
			                                   "by ';', and \\; is a ';' inside a value)");
			return false;
		}
		out->push_back(Property{name, Trim(item.substr(eq + 1)), entry, source});
	}
	return true;
}

// outbox.kafka_properties: entries separated by ';'; "\;" is a literal ';' and "\\" a
// backslash, any other backslash is an error.
bool
ParseUserProperties(const char *text, Properties *out, std::string *error) {
	std::vector<std::pair<int, std::string>> entries{{1, ""}};
	for (const char *c = text ? text : ""; *c; c++) {
		if (*c == ';') {
			entries.emplace_back(int(entries.size()) + 1, "");
		} else if (*c != '\\') {
			entries.back().second += *c;
		} else if (c[1] == ';' || c[1] == '\\') {
			entries.back().second += *++c;
		} else {
			*error = EntryError(kPropertiesEntry, int(entries.size()),
			                    "has a backslash that is neither \\; nor \\\\ (\\; is a literal semicolon, "
			                    "\\\\ a backslash)");
			return false;
		}
	}
	return AddEntries(entries, kPropertiesEntry, out, error);
}

// outbox.kafka_properties_file: one name=value a line, taken literally ('#' starts a comment
// line). The place for secrets: a setting's new value is written to the server log by the
// postmaster on every reload, a file's content never is. Refused while group or others may read
// it, like the server's TLS key.
bool
ParsePropertiesFile(const char *path, Properties *out, std::string *error) {
	if (path == nullptr || path[0] == '\0') {
		return true;
	}
	// O_NONBLOCK: a FIFO must not block the worker in open(); only a regular file is read.
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		*error = std::string("outbox.kafka_properties_file: cannot open \"") + path + "\": " + strerror(errno);
		if (fd >= 0) {
			close(fd);
		}
		return false;
	}
	if (!S_ISREG(st.st_mode) || (st.st_mode & (S_IRWXG | S_IRWXO)) != 0 || st.st_size > kMaxPropertiesFileBytes) {
		close(fd);
		*error = std::string("outbox.kafka_properties_file \"") + path +
		         "\" must be a regular file of at most 1 MB that only its owner can read (chmod 600)";
		return false;
	}
	std::string text;
	char buf[4096];
	ssize_t n = 0;
	while (text.size() <= size_t(kMaxPropertiesFileBytes) && (n = read(fd, buf, sizeof(buf))) > 0) {
		text.append(buf, size_t(n));
	}
	if (n < 0 || text.size() > size_t(kMaxPropertiesFileBytes)) {
		int read_errno = errno;
		close(fd);
		*error = std::string("outbox.kafka_properties_file \"") + path + "\": " +
		         (n < 0 ? strerror(read_errno) : "grew past 1 MB while being read");
		return false;
	}
	close(fd);
	std::vector<std::pair<int, std::string>> entries;
	size_t start = 0;
	for (int line = 1; start <= text.size(); line++) {
		size_t end = text.find('\n', start);
		std::string item = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
		if (Trim(item).rfind('#', 0) != 0) {
			entries.emplace_back(line, item);
		}
		if (end == std::string::npos) {
			break;
		}
		start = end + 1;
	}
	return AddEntries(entries, kPropertiesFileLine, out, error);
}

// Refuses a user property that would change a reserved one, by any spelling (kafka_reserved.hpp).
// A refused name is one librdkafka knows: safe to repeat.
bool
RefuseReserved(const Properties &properties, std::string *error) {
	ReservedGuard guard;
	for (const Property &p : properties) {
		if (p.entry == 0) {
			continue;
		}
		std::string refusal = guard.Refusal(p.name, p.value);
		if (!refusal.empty()) {
			*error = EntryError(p.source, p.entry, refusal.c_str());
			return false;
		}
	}
	return true;
}

bool
IsTransactional(const ProducerConfig &config) {
	return config.transactional_id != nullptr && config.transactional_id[0] != '\0';
}

// A Kafka transaction made of one batch (kafka_transactions.hpp): one handle.
int
HandleCount(const ProducerConfig &config) {
	return IsTransactional(config) ? 1 : std::max(1, config.connections);
}

// The whole librdkafka configuration of a producer, made from nothing but `config`: the one
// list both CreateProducer and ConfigDiffers use.
bool
BuildProperties(const ProducerConfig &config, Properties *out, std::string *error) {
	auto own = [out](const char *name, std::string value) {
		out->push_back(Property{name, std::move(value), 0, nullptr});
	};
	own("bootstrap.servers", config.bootstrap_servers ? config.bootstrap_servers : "");
	own("enable.idempotence", "true");
	own("acks", "all");
	// A batch the broker rejects must not be followed by its successors on the partition (they
	// would overtake it): librdkafka raises a fatal error instead, and the relay recreates the
	// producer and resends in order.
	own("enable.gapless.guarantee", "true");
	// Up to 5 requests in flight per broker, the idempotent producer's limit: librdkafka sends
	// one request per partition, so fewer would send a batch's partitions one round trip after
	// another (4 to 6 times slower here). Order across requests of one partition rests on the
	// broker's sequence check (what idempotence guarantees); and as the worker hands a
	// partition's share of a batch over in one go (PlanBatch) and waits for all of the batch
	// before the next, that share normally travels in a single request, so there is no second
	// request of that partition on the wire to overtake it.
	own("max.in.flight.requests.per.connection", "5");
	own("partitioner", "murmur2_random");
	own("message.timeout.ms", std::to_string(config.message_timeout_ms));
	// A topic that does not exist must fail as UNKNOWN_TOPIC (the event's fault) before its
	// messages time out (which would look like broker trouble).
	own("topic.metadata.propagation.max.ms", std::to_string(config.message_timeout_ms / 2));
	own("log.queue", "true");
	// Hold a partition's messages while the worker hands its share over, so that it does not
	// leave in two requests (above). Flush() then sends the rest at once (linger does not apply
	// during a flush).
	own("linger.ms", std::to_string(kLingerMs));
	own("socket.nagle.disable", "true");
	// Room for the largest event enqueue accepts plus record overhead (user-settable).
	own("message.max.bytes", std::to_string(std::max(1000000L, long(config.max_event_bytes) + 65536L)));
	if (IsTransactional(config)) {
		own("transactional.id", config.transactional_id);
		own("transaction.timeout.ms", std::to_string(config.transaction_timeout_ms));
	}
	return ParseUserProperties(config.extra_properties, out, error) &&
	       ParsePropertiesFile(config.properties_file, out, error) && RefuseReserved(*out, error);
}

// Properties whose values are secrets (librdkafka's own sensitive ones): their values, and any
// part of them, are masked in every text the relay passes on from librdkafka (log lines,
// connection errors).
bool
IsSecretProperty(const std::string &name) {
	return name.find("password") != std::string::npos || name.find("secret") != std::string::npos ||
	       name == "ssl.key.pem" || name == "ssl_key" || name == "sasl.oauthbearer.config";
}

SecretMask
SecretsOf(const Properties &properties) {
	SecretMask mask;
	for (const Property &p : properties) {
		if (p.entry > 0 && IsSecretProperty(p.name)) {
			mask.Add(p.value);
		}
	}
	return mask;
}

// librdkafka's own error texts may quote a value: every user value in `text` becomes ***, and
// every part of a secret one (first, so that masking a short value inside a secret cannot
// leave the secret's other pieces).
std::string
WithoutUserValues(const std::string &error, const Properties &properties) {
	std::string text = SecretsOf(properties).Apply(error);
	for (const Property &p : properties) {
		for (size_t at; p.entry > 0 && !p.value.empty() && (at = text.find(p.value)) != std::string::npos;) {
			text.replace(at, p.value.size(), "***");
		}
	}
	return text;
}

bool
StopRequested(const ProducerConfig &config) {
	return config.stop_requested != nullptr && config.stop_requested();
}

long
MillisSince(std::chrono::steady_clock::time_point start) {
	return long(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start)
	                .count());
}

// Blocks every signal in this thread while librdkafka starts its threads, so they inherit a
// fully blocked mask and no Postgres signal handler ever runs on them.
class AllSignalsBlocked {
public:
	AllSignalsBlocked() {
		sigset_t all;
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &saved_);
	}
	~AllSignalsBlocked() {
		pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
	}
	AllSignalsBlocked(const AllSignalsBlocked &) = delete;
	AllSignalsBlocked &operator=(const AllSignalsBlocked &) = delete;

private:
	sigset_t saved_;
};

// A topic as the relay last looked it up: its partition count (0: unknown, e.g. the topic does
// not exist) and when.
struct TopicInfo {
	int32_t partitions;
	std::chrono::steady_clock::time_point looked_up;
};

} // namespace

// Threads: the callbacks below run on the thread that polls or flushes their handle. Flush()
// flushes several handles at once, one thread each, so what the callbacks of different handles
// share is atomic or under `mutex`; results[i] is written by the one handle that sent message i.
// Everything else is touched by the worker's thread only, while no Flush() runs.
class Producer {
public:
	Producer() = default;
	Producer(const Producer &) = delete;
	Producer &operator=(const Producer &) = delete;
	~Producer();

	bool Init(const ProducerConfig &config, std::string *error);

	ProducerConfig config{};      // its strings are not kept: the settings may change under them
	Properties properties;        // the configuration the handle was made with
	int queue_full_wait_left_ms = 0; // of this batch
	// One librdkafka handle per connection (outbox.kafka_connections), each with its own
	// connection to every broker; handles[0] also makes the metadata look-ups. A keyed event of
	// partition P is only ever sent by handles[P % size] (RouteOf).
	std::vector<rd_kafka_t *> handles;
	uint32_t generation = 0;
	std::vector<Delivery> results;
	std::atomic<int> outstanding{0};
	std::atomic<int> acked{0};
	std::atomic<int> broker_up{-1};
	// A partition the relay chose was refused as unknown: the counts are looked up again.
	std::atomic<bool> partition_counts_stale{false};
	SecretMask secrets; // values of secret properties, masked (and their parts) in what is passed on
	std::string sasl_mechanism;       // "" unless SASL is configured
	// OpenSSL's verdict on the last broker certificate that failed verification; set on
	// librdkafka's broker threads (the verification callback), hence atomic.
	std::atomic<int> x509_error{0};
	std::mutex mutex; // guards the four below
	bool fatal = false;
	std::string fatal_reason;
	// The last failed connection, until a broker answers again.
	ConnectError connect_error{ConnectProblem::None, ""};
	std::deque<std::pair<int, std::string>> log_lines;
	std::atomic<bool> connect_error_set{false}; // connect_error is not None (read without the lock)
	// The topics looked up (std::less<>: found by const char *, no copy).
	std::map<std::string, TopicInfo, std::less<>> topics;
	// The current batch's routes, by message index, once PlanBatch made them.
	struct Route {
		int32_t partition;
		uint32_t handle;
	};
	std::vector<Route> routes;

	// With `mutex` held.
	void AddLogLineLocked(int level, const std::string &line) {
		if (log_lines.size() >= kMaxBufferedLogLines) {
			log_lines.pop_front();
		}
		log_lines.emplace_back(level, secrets.Apply(line));
	}

	void AddLogLine(int level, const std::string &line) {
		std::lock_guard<std::mutex> guard(mutex);
		AddLogLineLocked(level, line);
	}

	void MarkBrokerUp() {
		broker_up.store(1);
		x509_error.store(0);
		if (connect_error_set.load()) {
			std::lock_guard<std::mutex> guard(mutex);
			connect_error = ConnectError{ConnectProblem::None, ""};
			connect_error_set.store(false);
		}
	}
};

namespace {


// Delivery report: runs inside rd_kafka_poll() or rd_kafka_flush() on the thread that serves its handle
// (Flush). Writes only into the Producer; never calls Postgres.
void
OnDelivery(rd_kafka_t *, const rd_kafka_message_t *msg, void *opaque) noexcept {
	Producer *p = static_cast<Producer *>(opaque);
	uintptr_t tag = reinterpret_cast<uintptr_t>(msg->_private);
	uint32_t generation = uint32_t(tag >> 32);
	size_t index = size_t(tag & 0xffffffffu);
	if (generation != p->generation || index >= p->results.size() || p->results[index].reported) {
		return; // a report for a batch that was given up on
	}
	Delivery &d = p->results[index];
	d.reported = true;
	d.err = msg->err;
	d.partition = msg->partition;
	d.offset = msg->offset;
	p->outstanding--;
	if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
		p->acked++;
		p->MarkBrokerUp();
	} else if (d.partition_chosen && RefusesChosenPartition(msg->err)) {
		// The counts are looked up again before the next batch, as librdkafka refreshes its own
		// metadata on such an error.
		p->partition_counts_stale.store(true);
	}
}

void
OnError(rd_kafka_t *rk, int err, const char *reason, void *opaque) noexcept try {
	Producer *p = static_cast<Producer *>(opaque);
	std::lock_guard<std::mutex> guard(p->mutex);
	if (err == RD_KAFKA_RESP_ERR__FATAL) {
		char buf[512];
		rd_kafka_resp_err_t original = rd_kafka_fatal_error(rk, buf, sizeof(buf));
		if (!p->fatal) { // the first handle's reason is kept
			p->fatal = true;
			p->fatal_reason = p->secrets.Apply(std::string(rd_kafka_err2name(original)) + ": " + buf);
		}
		p->AddLogLineLocked(3, "fatal producer error: " + p->fatal_reason);
		return;
	}
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || err == RD_KAFKA_RESP_ERR__RESOLVE) {
		p->broker_up = 0;
	}
	if (err == RD_KAFKA_RESP_ERR__AUTHENTICATION || err == RD_KAFKA_RESP_ERR__SSL ||
	    err == RD_KAFKA_RESP_ERR__TRANSPORT || err == RD_KAFKA_RESP_ERR__RESOLVE) {
		ConnectErrorKind kind = err == RD_KAFKA_RESP_ERR__AUTHENTICATION ? ConnectErrorKind::Authentication
		                        : err == RD_KAFKA_RESP_ERR__SSL          ? ConnectErrorKind::Tls
		                                                                 : ConnectErrorKind::Transport;
		p->connect_error = DescribeConnectError(kind, p->secrets.Apply(reason), p->x509_error.load(),
		                                        p->sasl_mechanism, rd_kafka_version());
		p->connect_error_set.store(p->connect_error.problem != ConnectProblem::None);
	}
	// Connection errors also arrive as log lines (log.queue), which the worker forwards; only
	// what the log does not say is added here.
	if (err != RD_KAFKA_RESP_ERR__TRANSPORT && err != RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN &&
	    err != RD_KAFKA_RESP_ERR__AUTHENTICATION && err != RD_KAFKA_RESP_ERR__SSL) {
		p->AddLogLineLocked(4, std::string(rd_kafka_err2name(rd_kafka_resp_err_t(err))) + ": " + reason);
	}
} catch (...) {
	// Out of memory for a log line: drop it; nothing may unwind into librdkafka.
}

// With log.queue=true this runs from rd_kafka_poll on the worker's thread.
void
OnLog(const rd_kafka_t *rk, int level, const char *fac, const char *buf) noexcept try {
	Producer *p = static_cast<Producer *>(rd_kafka_opaque(rk));
	// We turn on enable.gapless.guarantee knowingly; its "experimental" warning is not news.
	if (strcmp(fac, "CONFWARN") == 0 && strstr(buf, "enable.gapless.guarantee") != nullptr) {
		return;
	}
	if (p) {
		p->AddLogLine(level, std::string(fac) + ": " + buf);
	}
} catch (...) {
}

// Runs on librdkafka's broker threads, for each certificate of a broker's chain: it keeps
// OpenSSL's own verdict (x509_error) and only notes it, so last_error can say what was wrong
// (an unknown CA and an expired certificate read alike in librdkafka's handshake error).
int
OnCertificateVerify(rd_kafka_t *, const char *, int32_t, int *x509_error, int, const char *, size_t, char *errstr,
                    size_t errstr_size, void *opaque) noexcept {
	if (*x509_error == 0) {
		return 1;
	}
	static_cast<Producer *>(opaque)->x509_error.store(*x509_error);
	snprintf(errstr, errstr_size, "%s", X509ErrorText(*x509_error));
	return 0;
}

} // namespace

Producer::~Producer() {
	// Give queued messages no further chance: the rows they came from go back to pending. Every
	// handle is purged before the first is destroyed, so none waits on another's destroy.
	for (rd_kafka_t *rk : handles) {
		rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		rd_kafka_poll(rk, 0);
	}
	for (rd_kafka_t *rk : handles) {
		rd_kafka_destroy(rk);
	}
}

bool
Producer::Init(const ProducerConfig &from, std::string *error) {
	config = from;
	config.bootstrap_servers = nullptr;
	config.extra_properties = nullptr;
	config.properties_file = nullptr;
	config.transactional_id = nullptr;
	if (!BuildProperties(from, &properties, error)) {
		return false;
	}
	secrets = SecretsOf(properties);
	for (const Property &p : properties) {
		if (p.name == "sasl.mechanism" || p.name == "sasl.mechanisms") {
			sasl_mechanism = p.value;
		}
	}
	char errstr[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	std::vector<std::string> own_reserved; // before the first user property
	bool user_seen = false;
	for (const Property &p : properties) {
		if (p.entry > 0 && !user_seen) {
			user_seen = true;
			own_reserved = ReservedValues(conf);
		}
		rd_kafka_conf_res_t res = rd_kafka_conf_set(conf, p.name.c_str(), p.value.c_str(), errstr, sizeof(errstr));
		if (res == RD_KAFKA_CONF_OK) {
			continue;
		}
		if (p.entry == 0) {
			*error = "librdkafka property \"" + p.name + "\": " + errstr; // our own value, no secret
		} else if (res == RD_KAFKA_CONF_UNKNOWN) {
			// Not named: a name that is no property may be a fragment of a secret.
			*error = EntryError(p.source, p.entry, "names no librdkafka property");
		} else {
			// librdkafka's errstr quotes the value: not passed on.
			*error = EntryError(p.source, p.entry,
			                    ("sets \"" + p.name + "\" to a value librdkafka refuses (not shown)").c_str());
		}
		rd_kafka_conf_destroy(conf);
		return false;
	}
	// The guard (BuildProperties) judged each user property alone; this judges them together.
	if (user_seen && ReservedValues(conf) != own_reserved) {
		rd_kafka_conf_destroy(conf);
		*error = "the user's librdkafka properties together change a property the relay reserves";
		return false;
	}

	rd_kafka_conf_set_opaque(conf, this);
	rd_kafka_conf_set_dr_msg_cb(conf, OnDelivery);
	rd_kafka_conf_set_error_cb(conf, OnError);
	rd_kafka_conf_set_log_cb(conf, OnLog);
	// Without TLS support in librdkafka this fails, and so would any ssl.* property.
	(void)rd_kafka_conf_set_ssl_cert_verify_cb(conf, OnCertificateVerify);
	int n_handles = HandleCount(from);
	handles.reserve(size_t(n_handles));
	for (int i = 0; i < n_handles; i++) {
		// Each handle consumes a configuration of its own (on success only): the last takes conf.
		rd_kafka_conf_t *own = i + 1 < n_handles ? rd_kafka_conf_dup(conf) : conf;
		rd_kafka_t *rk;
		{
			AllSignalsBlocked blocked;
			rk = rd_kafka_new(RD_KAFKA_PRODUCER, own, errstr, sizeof(errstr));
		}
		if (rk == nullptr) {
			rd_kafka_conf_destroy(own);
			if (own != conf) {
				rd_kafka_conf_destroy(conf);
			}
			*error = WithoutUserValues(std::string("could not create the Kafka producer: ") + errstr, properties);
			return false; // the handles made so far go with the Producer
		}
		handles.push_back(rk);
		// Logs go to the main queue, so they are served by rd_kafka_poll on our thread like
		// everything else; the log callback then never runs on a librdkafka thread.
		rd_kafka_set_log_queue(rk, nullptr);
	}
	return true;
}

Producer *
CreateProducer(const ProducerConfig &config, char *errbuf, size_t errlen) noexcept {
	try {
		auto p = std::make_unique<Producer>();
		std::string error;
		if (!p->Init(config, &error)) {
			snprintf(errbuf, errlen, "%s", error.c_str());
			return nullptr;
		}
		return p.release();
	} catch (const std::exception &e) {
		snprintf(errbuf, errlen, "could not create the Kafka producer: %s", e.what());
		return nullptr;
	}
}

bool
SettingChangesReserved(const char *text, char *problem, size_t len, bool *holds_secret) noexcept {
	*holds_secret = false;
	try {
		Properties properties;
		std::string error;
		if (!ParseUserProperties(text, &properties, &error) || RefuseReserved(properties, &error)) {
			return false;
		}
		for (const Property &p : properties) {
			*holds_secret = *holds_secret || IsSecretProperty(p.name);
		}
		snprintf(problem, len, "%s", error.c_str());
		return true;
	} catch (const std::bad_alloc &) {
		return false; // the worker judges it again
	}
}

void
DestroyProducer(Producer *producer) noexcept {
	delete producer;
}

bool
ConfigDiffers(const Producer *p, const ProducerConfig &config) noexcept {
	try {
		Properties properties;
		std::string error;
		// A configuration that does not parse differs: remaking the producer reports it.
		return !BuildProperties(config, &properties, &error) || properties != p->properties ||
		       HandleCount(config) != int(p->handles.size());
	} catch (const std::bad_alloc &) {
		return true;
	}
}

bool
BeginBatch(Producer *p, int n) noexcept {
	try {
		p->generation++;
		p->results.assign(size_t(n), Delivery{false, false, 0, -1, -1, false});
		p->routes.clear();
		p->outstanding = 0;
		p->acked = 0;
		p->queue_full_wait_left_ms = kQueueFullBudgetMs;
		return true;
	} catch (const std::bad_alloc &) {
		return false;
	}
}

namespace {

// Asks handle rk's brokers, in one metadata request, for every topic the handle knows locally,
// after making each of `topics` known to it (librdkafka keeps what it learns for the handle's own
// partitioner and partition checks). *counts (when set) gets each of `topics`' partition count, 0
// for a topic the broker does not know. False when no broker answered within wait_ms.
bool
LookUpTopics(rd_kafka_t *rk, const std::vector<const char *> &topics, long wait_ms, std::vector<int32_t> *counts) {
	std::vector<rd_kafka_topic_t *> handles;
	handles.reserve(topics.size());
	for (const char *topic : topics) {
		if (rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, nullptr)) {
			handles.push_back(rkt);
		}
	}
	const struct rd_kafka_metadata *md = nullptr;
	// all_topics = 0 and no topic handle: the topics the handle knows, which now include these.
	rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, nullptr, &md, int(std::min<long>(wait_ms, kMetadataLookupMs)));
	if (counts) {
		counts->assign(topics.size(), 0);
		std::unordered_map<std::string_view, size_t> wanted;
		for (size_t i = 0; i < topics.size(); i++) {
			wanted.emplace(topics[i], i);
		}
		for (int t = 0; md && err == RD_KAFKA_RESP_ERR_NO_ERROR && t < md->topic_cnt; t++) {
			auto it = wanted.find(md->topics[t].topic);
			if (it != wanted.end() && md->topics[t].err == RD_KAFKA_RESP_ERR_NO_ERROR) {
				(*counts)[it->second] = md->topics[t].partition_cnt;
			}
		}
	}
	if (md) {
		rd_kafka_metadata_destroy(md);
	}
	for (rd_kafka_topic_t *rkt : handles) {
		rd_kafka_topic_destroy(rkt);
	}
	return err == RD_KAFKA_RESP_ERR_NO_ERROR;
}

} // namespace

void
PrepareTopics(Producer *p, const char *const *topics, int n_topics, int budget_ms) noexcept {
	auto start = std::chrono::steady_clock::now();
	if (p->partition_counts_stale.exchange(false)) {
		p->topics.clear();
	}
	if (StopRequested(p->config)) {
		return;
	}
	try {
		// The batch's topics not looked up yet, or (several handles) whose count is a minute old.
		std::vector<const char *> wanted;
		std::set<std::string_view> seen;
		for (int i = 0; i < n_topics; i++) {
			// Called with every event's topic: a topic already seen is found without a string copy.
			auto known = p->topics.find(topics[i]);
			if (known != p->topics.end() &&
			    start - known->second.looked_up <
			        (known->second.partitions > 0 ? kPartitionCountMaxAge : kUnknownTopicMaxAge)) {
				continue;
			}
			if (seen.insert(topics[i]).second) {
				wanted.push_back(topics[i]);
			}
		}
		if (wanted.empty()) {
			return;
		}
		long wait_ms = std::min<long>(budget_ms, kMetadataLookupMs);
		std::vector<int32_t> counts;
		if (!LookUpTopics(p->handles[0], wanted, wait_ms, &counts)) {
			return; // no answer: looked up again next batch; librdkafka looks them up itself meanwhile
		}
		// The other handles learn a topic that is new, or whose count changed (a handle refuses a
		// partition it does not know of), at the same time, one thread each (signals blocked;
		// nothing but librdkafka calls), each bounded like the first.
		std::vector<const char *> for_others;
		for (size_t i = 0; i < wanted.size(); i++) {
			auto known = p->topics.find(wanted[i]);
			if (known == p->topics.end() || known->second.partitions != counts[i]) {
				for_others.push_back(wanted[i]);
			}
		}
		std::vector<char> answered(p->handles.size(), 1);
		if (!for_others.empty() && p->handles.size() > 1) {
			std::fill(answered.begin() + 1, answered.end(), 0); // until its thread says otherwise
			std::vector<std::thread> helpers;
			helpers.reserve(p->handles.size());
			{
				AllSignalsBlocked blocked;
				for (size_t h = 1; h < p->handles.size() && !StopRequested(p->config); h++) {
					try {
						helpers.emplace_back([&, h]() noexcept {
							try {
								answered[h] = LookUpTopics(p->handles[h], for_others, wait_ms, nullptr);
							} catch (...) {
							}
						});
					} catch (...) {
						break; // no thread: those handles are asked next batch
					}
				}
			}
			for (std::thread &t : helpers) {
				t.join();
			}
		}
		bool all_answered = std::all_of(answered.begin(), answered.end(), [](char a) { return a != 0; });
		for (size_t i = 0; i < wanted.size(); i++) {
			bool told_others = std::find(for_others.begin(), for_others.end(), wanted[i]) != for_others.end();
			if (!told_others || all_answered) { // else asked again next batch, the old count kept
				p->topics.insert_or_assign(wanted[i], TopicInfo{counts[i], start});
			}
		}
	} catch (...) {
		// Out of memory or no thread: only an optimisation; a topic not noted is looked up again
		// next batch and meanwhile goes the first handle's way.
	}
}

bool
BrokerReachable(Producer *p, int budget_ms) noexcept {
	auto start = std::chrono::steady_clock::now();
	while (p->broker_up != 1) { // down, or a new producer that has not heard from any broker yet
		long left_ms = budget_ms - MillisSince(start);
		if (left_ms <= 0 || StopRequested(p->config)) {
			if (left_ms <= 0) {
				p->broker_up = 0; // asked for the whole budget: no broker answers
			}
			return false;
		}
		for (rd_kafka_t *rk : p->handles) {
			rd_kafka_poll(rk, 0); // errors and logs meanwhile, on this thread
		}
		const struct rd_kafka_metadata *md = nullptr;
		rd_kafka_resp_err_t err =
		    rd_kafka_metadata(p->handles[0], 0, nullptr, &md, int(std::min<long>(left_ms, kMetadataLookupMs)));
		if (md) {
			rd_kafka_metadata_destroy(md);
		}
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
			p->MarkBrokerUp();
		}
	}
	return true;
}

ConnectProblem
LastConnectProblem(const Producer *p, char *buf, size_t len) noexcept {
	std::lock_guard<std::mutex> guard(const_cast<Producer *>(p)->mutex);
	snprintf(buf, len, "%s", p->connect_error.text.c_str());
	return p->connect_error.problem;
}

namespace {

// The handle that sends `m`, and the partition it names (*partition; -1: the handle's
// partitioner picks). A keyed event's partition P is sent by handle P % handles only: a
// connection then carries a share of the partitions, and a batch needs as many requests per
// connection (librdkafka sends one request per partition, and up to 5 at once per connection) as
// that share has partitions. So that a key keeps its partition, the relay partitions as
// librdkafka would (murmur2 of the key over the topic's partition count) when it knows the
// count. A keyless event goes through the first handle, whose sticky partitioner picks (and
// passes over partitions without a leader); so does every event of a topic whose count is not
// known. Per-key order across handles: a key's events of one batch go to one partition (unless
// they name partitions) and so to one handle, and a batch is sent only once every report of the
// one before is in or the producer was remade (DESIGN.md "Publish").
size_t
RouteOf(Producer *p, const Message &m, int32_t *partition) {
	*partition = m.partition;
	auto topic = p->topics.find(m.topic);
	if (topic == p->topics.end() || topic->second.partitions <= 0) {
		// The first handle partitions the topic's unnamed events: its named ones go with them,
		// so that no partition of it has two handles in one batch.
		return 0;
	}
	if (*partition < 0) {
		if (!m.key) {
			return 0;
		}
		// The partitioner's function takes no topic handle for a key (it is murmur2 % count).
		*partition =
		    rd_kafka_msg_partitioner_murmur2(nullptr, m.key, m.key_len, topic->second.partitions, nullptr, nullptr);
	}
	return size_t(*partition) % p->handles.size();
}

} // namespace

bool
PlanBatch(Producer *p, const Message *messages, int n, int *order) noexcept {
	try {
		p->routes.resize(size_t(n));
		bool keyed_partition = false;
		for (int j = 0; j < n; j++) {
			Producer::Route &r = p->routes[size_t(j)];
			r.handle = uint32_t(RouteOf(p, messages[j], &r.partition));
			order[j] = j;
			keyed_partition = keyed_partition || (messages[j].key && messages[j].partition >= 0);
		}
		// Each message is handed over in the group of its route, except that a keyed event
		// that names its partition may put its (topic, key) on two routes in one batch: then
		// every event of a (topic, key) goes in the group of its first event's route, so that a
		// (topic, key)'s events are still handed over in batch order and a later one is never
		// handed over before an earlier one the producer refuses (the worker's rule).
		std::vector<int> group(static_cast<size_t>(n));
		std::unordered_map<std::string, int> first_of_key;
		for (int j = 0; j < n; j++) {
			group[size_t(j)] = j;
			if (keyed_partition && messages[j].key) {
				std::string scope(messages[j].topic);
				scope.push_back('\0');
				scope.append(static_cast<const char *>(messages[j].key), messages[j].key_len);
				group[size_t(j)] = first_of_key.emplace(std::move(scope), j).first->second;
			}
		}
		std::stable_sort(order, order + n, [p, messages, &group](int a, int b) {
			a = group[size_t(a)];
			b = group[size_t(b)];
			const Producer::Route &x = p->routes[size_t(a)], &y = p->routes[size_t(b)];
			if (x.handle != y.handle) {
				return x.handle < y.handle;
			}
			if (x.partition != y.partition) {
				return x.partition < y.partition;
			}
			return strcmp(messages[a].topic, messages[b].topic) < 0;
		});
		return true;
	} catch (const std::bad_alloc &) {
		p->routes.clear();
		for (int j = 0; j < n; j++) {
			order[j] = j;
		}
		return false;
	}
}

int
Produce(Producer *p, int index, const Message &m) noexcept {
	int32_t partition;
	size_t handle;
	if (size_t(index) < p->routes.size()) {
		partition = p->routes[size_t(index)].partition;
		handle = p->routes[size_t(index)].handle;
	} else {
		handle = RouteOf(p, m, &partition);
	}
	rd_kafka_t *rk = p->handles[handle];
	p->results[size_t(index)].partition_chosen = m.partition < 0;
	rd_kafka_headers_t *headers = rd_kafka_headers_new(size_t(m.n_headers));
	for (int i = 0; i < m.n_headers; i++) {
		rd_kafka_header_add(headers, m.headers[i].name, -1, m.headers[i].value, ssize_t(m.headers[i].value_len));
	}
	uintptr_t tag = (uintptr_t(p->generation) << 32) | uintptr_t(uint32_t(index));
	for (;;) {
		rd_kafka_resp_err_t err = rd_kafka_producev(
		    rk, RD_KAFKA_V_TOPIC(m.topic), RD_KAFKA_V_PARTITION(partition), RD_KAFKA_V_TIMESTAMP(m.timestamp_ms),
		    RD_KAFKA_V_KEY(const_cast<void *>(m.key), m.key_len),
		    RD_KAFKA_V_VALUE(const_cast<void *>(m.value), m.value_len), RD_KAFKA_V_HEADERS(headers),
		    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(reinterpret_cast<void *>(tag)),
		    RD_KAFKA_V_END);
		if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && p->queue_full_wait_left_ms > 0 && !StopRequested(p->config)) {
			// Serve reports to make room, a slice at a time. Bounded per batch: past it the
			// event goes back to pending (QUEUE_FULL is not the event's fault) and the worker is
			// not held up.
			auto start = std::chrono::steady_clock::now();
			rd_kafka_poll(rk, std::min(kWaitSliceMs, p->queue_full_wait_left_ms));
			p->queue_full_wait_left_ms -= std::max(1L, MillisSince(start));
			continue;
		}
		if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
			rd_kafka_headers_destroy(headers); // owned by the message only on success
			Delivery &d = p->results[size_t(index)];
			d.reported = true;
			d.refused_at_produce = true;
			d.err = err;
			d.partition = partition;
			if (m.partition < 0 && RefusesChosenPartition(err)) {
				p->partition_counts_stale.store(true);
			}
			return err;
		}
		p->outstanding++;
		return 0;
	}
}

void
Flush(Producer *p, int max_wait_ms) noexcept {
	// While rd_kafka_flush runs, the broker threads send without lingering, and it serves the
	// delivery reports on the calling thread. A zero-timeout flush would not do: it can return
	// before a broker thread wakes up, which then lingers after all. So the handles that hold
	// messages or reports are flushed at the same time: the first on this thread, each other on
	// a thread of its own (every signal blocked, no Postgres call: it only runs the callbacks
	// above), all joined before this returns.
	rd_kafka_t *busy[kMaxConnections];
	size_t n_busy = 0;
	for (rd_kafka_t *rk : p->handles) {
		if (rd_kafka_outq_len(rk) > 0 && n_busy < kMaxConnections) {
			busy[n_busy++] = rk;
		}
	}
	if (n_busy <= 1) {
		(void)rd_kafka_flush(n_busy == 1 ? busy[0] : p->handles[0], max_wait_ms);
		return;
	}
	std::thread helpers[kMaxConnections];
	size_t started = 1;
	{
		AllSignalsBlocked blocked; // inherited by the threads
		for (; started < n_busy; started++) {
			try {
				helpers[started] = std::thread([rk = busy[started], max_wait_ms] { (void)rd_kafka_flush(rk, max_wait_ms); });
			} catch (...) {
				break; // no thread to be had: the rest are flushed after, briefly
			}
		}
	}
	(void)rd_kafka_flush(busy[0], max_wait_ms);
	for (size_t i = 1; i < started; i++) {
		helpers[i].join();
	}
	for (size_t i = started; i < n_busy; i++) {
		(void)rd_kafka_flush(busy[i], 1);
	}
}

int
Outstanding(const Producer *p) noexcept {
	return p->outstanding;
}

int
Acked(const Producer *p) noexcept {
	return p->acked;
}

const Delivery &
Result(const Producer *p, int index) noexcept {
	return p->results[size_t(index)];
}

rd_kafka_t *
HandleOf(Producer *p) noexcept {
	return p->handles[0];
}

bool
StopRequestedOf(const Producer *p) noexcept {
	return StopRequested(p->config);
}

rd_kafka_t *
NewGroupReader(Producer *p, const char *group, char *why, size_t len) noexcept {
	try {
		char errstr[512];
		rd_kafka_conf_t *conf = rd_kafka_conf_new();
		// The producer's own properties are for producing (idempotence, acks, linger, the
		// transactional id): only its bootstrap list, then every property of the user's (TLS,
		// SASL), which librdkafka takes for a consumer too (a producer-only one is ignored, with
		// a configuration warning in the log).
		Properties own = {{"group.id", group, 0, nullptr},
		                  {"isolation.level", "read_committed", 0, nullptr},
		                  {"enable.auto.commit", "false", 0, nullptr},
		                  {"enable.auto.offset.store", "false", 0, nullptr}};
		for (const Property &property : p->properties) {
			if (property.entry > 0 || property.name == "bootstrap.servers") {
				own.push_back(property);
			}
		}
		for (const Property &property : own) {
			if (rd_kafka_conf_set(conf, property.name.c_str(), property.value.c_str(), errstr, sizeof(errstr)) !=
			    RD_KAFKA_CONF_OK) {
				rd_kafka_conf_destroy(conf);
				snprintf(why, len, "%s",
				         WithoutUserValues("could not configure the relay's group reader for property \"" +
				                               property.name + "\"",
				                           p->properties)
				             .c_str());
				return nullptr;
			}
		}
		rd_kafka_conf_set_opaque(conf, p);
		rd_kafka_conf_set_log_cb(conf, OnLog); // thread-safe: it only appends to the producer's lines
		rd_kafka_t *rk;
		{
			AllSignalsBlocked blocked;
			rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
		}
		if (rk == nullptr) {
			rd_kafka_conf_destroy(conf);
			snprintf(why, len, "%s",
			         WithoutUserValues(std::string("could not create the relay's group reader: ") + errstr, p->properties)
			             .c_str());
		}
		return rk;
	} catch (const std::exception &e) {
		snprintf(why, len, "could not create the relay's group reader: %s", e.what());
		return nullptr;
	}
}

bool
IsFatal(const Producer *p, char *errbuf, size_t errlen) noexcept {
	std::lock_guard<std::mutex> guard(const_cast<Producer *>(p)->mutex);
	if (p->fatal) {
		snprintf(errbuf, errlen, "%s", p->fatal_reason.c_str());
	}
	return p->fatal;
}

int
BrokerUp(const Producer *p) noexcept {
	return p->broker_up;
}

bool
TakeLogLine(Producer *p, char *buf, size_t len, int *syslog_level) noexcept {
	std::lock_guard<std::mutex> guard(p->mutex);
	if (p->log_lines.empty()) {
		return false;
	}
	*syslog_level = p->log_lines.front().first;
	snprintf(buf, len, "%s", p->log_lines.front().second.c_str());
	p->log_lines.pop_front();
	return true;
}

bool
RefusesChosenPartition(int err) noexcept {
	return err == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION || err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
}

ErrorClass
Classify(int err) noexcept {
	switch (rd_kafka_resp_err_t(err)) {
	// The broker refused the record batch: this event's fault, or another's of its batch.
	case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
	case RD_KAFKA_RESP_ERR_INVALID_RECORD:
	case RD_KAFKA_RESP_ERR_INVALID_MSG:
	case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
	case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
	case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
	case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
		return ErrorClass::RecordBatch;
	// The event's topic is refused, for every event of it: count an attempt.
	case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
	case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
	case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
	case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
	case RD_KAFKA_RESP_ERR__INVALID_ARG:
	case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
		return ErrorClass::PerEvent;
	case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
	case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
		return ErrorClass::Purged;
	// Checked against the topic's partition count (the producer's metadata), at produce or,
	// when the topic was not known yet, once its metadata arrives.
	case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
		return ErrorClass::UnknownPartition;
	// Everything else is about the broker, the connection or the producer (timeouts, transport,
	// not enough replicas, purged by a fatal error, out-of-order after a rejected predecessor):
	// the event did nothing wrong and must not use up its attempts.
	default:
		return ErrorClass::BrokerWide;
	}
}

const char *
ErrorName(int err) noexcept {
	return rd_kafka_err2name(rd_kafka_resp_err_t(err));
}

const char *
LibraryVersion() noexcept {
	return rd_kafka_version_str();
}

const char *
ErrorText(int err) noexcept {
	return rd_kafka_err2str(rd_kafka_resp_err_t(err));
}

} // namespace outbox::kafka
