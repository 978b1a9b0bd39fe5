// Definitions of the outbox.* settings. Structural ones need a restart; the rest reload on SIGHUP.
#include "shared/guc.hpp"

#include "shared/boundary.hpp"
#include "shared/cloudevent_attributes.hpp"
#include "enqueue/commit_order.hpp"
#include "kafka/kafka_producer.hpp"
#include "enqueue/trace_context.hpp"
#include "shared/pg_include.hpp"
#include "relay/standby_wait.hpp"

namespace outbox {

Settings settings;

namespace {

const struct config_enum_entry kFailedEventPolicies[] = {
    {"block_key", int(FailedEventPolicy::BlockKey), false},
    {"skip", int(FailedEventPolicy::Skip), false},
    {nullptr, 0, false},
};

const struct config_enum_entry kMessageTimestamps[] = {
    {"commit", int(MessageTimestamp::Commit), false},
    {"publish", int(MessageTimestamp::Publish), false},
    {nullptr, 0, false},
};

// The trace context and CloudEvents source settings hold a valid value or none: a bad one is
// refused when it is set (SQLSTATE 22023, from the GUC machinery), not later by each enqueue.
bool
CheckValue(char **newval, const char *(*problem_of)(const char *, size_t) noexcept, const char *hint) {
	if (*newval == nullptr || (*newval)[0] == '\0') {
		return true;
	}
	if (const char *problem = problem_of(*newval, strlen(*newval))) {
		GUC_check_errdetail("%s.", problem);
		GUC_check_errhint("%s", hint);
		return false;
	}
	return true;
}

bool
CheckTraceparent(char **newval, void **, GucSource) {
	return CheckValue(newval, TraceparentProblem,
	                       "Set the W3C traceparent of the current span, e.g. "
	                       "'00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', or '' for none.");
}

bool
CheckTracestate(char **newval, void **, GucSource) {
	return CheckValue(newval, TracestateProblem,
	                       "Set the W3C tracestate that goes with outbox.traceparent, e.g. 'vendor=value', or '' "
	                       "for none.");
}

// A source every event that names none will carry: refused when set, not quarantined later.
bool
CheckCloudEventsSource(char **newval, void **, GucSource) {
	if (*newval == nullptr || (*newval)[0] == '\0') {
		return true;
	}
	if (const char *problem = cloudevents::UriReferenceProblem(*newval, strlen(*newval))) {
		GUC_check_errdetail("CloudEvents 1.0 requires a URI-reference (RFC 3986): %s.", problem);
		GUC_check_errhint("Set e.g. 'https://billing.example.com/outbox', 'urn:billing:outbox' or '/billing/outbox' "
		                  "(a space written %%20), or '' for /outbox/<database>.");
		return false;
	}
	return true;
}

extern "C" bool
outbox_check_cloudevents_source(char **newval, void **extra, GucSource source) {
	return CallFromPostgres("outbox_check_cloudevents_source", CheckCloudEventsSource, newval, extra, source);
}

// A property the relay reserves is refused when the setting is made (ALTER SYSTEM, a reload),
// with its own message: PostgreSQL's default one would quote the value, which may hold a secret.
// Not while the server starts (shared_preload_libraries): a refused value would be dropped for
// the empty default, and the relay run without the operator's TLS or SASL properties; the worker
// refuses it instead (misconfigured). Nor in a statement (ALTER SYSTEM) when the value holds a
// secret: PostgreSQL would log the refused statement's text (log_min_error_statement); the reload
// that follows refuses it, with nothing but this message in the log.
bool
CheckKafkaProperties(char **newval, void **, GucSource) {
	char problem[512];
	bool holds_secret = false;
	if (process_shared_preload_libraries_in_progress || *newval == nullptr ||
	    !kafka::SettingChangesReserved(*newval, problem, sizeof(problem), &holds_secret) ||
	    (holds_secret && debug_query_string != nullptr)) {
		return true;
	}
	GUC_check_errmsg("%s", problem);
	GUC_check_errhint("Remove the entry: the relay sets that property itself (docs/settings.md).");
	return false;
}

extern "C" bool
outbox_check_kafka_properties(char **newval, void **extra, GucSource source) {
	return CallFromPostgres("outbox_check_kafka_properties", CheckKafkaProperties, newval, extra, source);
}

extern "C" bool
outbox_check_traceparent(char **newval, void **extra, GucSource source) {
	return CallFromPostgres("outbox_check_traceparent", CheckTraceparent, newval, extra, source);
}

extern "C" bool
outbox_check_tracestate(char **newval, void **extra, GucSource source) {
	return CallFromPostgres("outbox_check_tracestate", CheckTracestate, newval, extra, source);
}

const struct config_enum_entry kDeliveries[] = {
    {"at_least_once", int(Delivery::AtLeastOnce), false},
    {"exactly_once", int(Delivery::ExactlyOnce), false},
    {nullptr, 0, false},
};

// A name that goes into Kafka's transactional.id, a consumer group id and a prepared
// transaction's gid (at most 200 bytes with the rest): letters, digits, '.', '_' and '-'.
bool
CheckKafkaName(char **newval, const char *what, int max_len) {
	const char *value = *newval ? *newval : "";
	size_t len = strlen(value);
	bool ok = len > 0 && len <= size_t(max_len);
	for (size_t i = 0; ok && i < len; i++) {
		char c = value[i];
		ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		     c == '-';
	}
	if (!ok) {
		GUC_check_errdetail("%s must be 1 to %d letters, digits, '.', '_' or '-'.", what, max_len);
		return false;
	}
	return true;
}

bool
CheckTransactionalIdPrefix(char **newval, void **, GucSource) {
	return CheckKafkaName(newval, "outbox.transactional_id_prefix", 64);
}

bool
CheckProgressTopic(char **newval, void **, GucSource) {
	return CheckKafkaName(newval, "outbox.progress_topic", 249);
}

extern "C" bool
outbox_check_transactional_id_prefix(char **newval, void **extra, GucSource source) {
	return CallFromPostgres("outbox_check_transactional_id_prefix", CheckTransactionalIdPrefix, newval, extra, source);
}

extern "C" bool
outbox_check_progress_topic(char **newval, void **extra, GucSource source) {
	return CallFromPostgres("outbox_check_progress_topic", CheckProgressTopic, newval, extra, source);
}

// Exactly-once delivery (DESIGN.md "Exactly once", docs/exactly-once.md). SIGHUP: how events
// reach Kafka is the operator's decision; a change remakes each worker's producer between batches.
void
DefineDeliverySettings() {
	DefineCustomEnumVariable("outbox.delivery", "How the relay delivers: at_least_once or exactly_once.",
	                         "exactly_once: one Kafka transaction per batch, its Postgres record prepared before "
	                         "the Kafka commit; consumers read with isolation.level=read_committed. Needs "
	                         "max_prepared_transactions >= the relay's workers.",
	                         &settings.delivery, int(Delivery::AtLeastOnce), kDeliveries, PGC_SIGHUP, 0, nullptr,
	                         nullptr, nullptr);
	DefineCustomStringVariable("outbox.transactional_id_prefix",
	                           "exactly_once: the first part of each relay worker's Kafka transactional.id.",
	                           "The id is <prefix>-<system identifier>-<database oid>-<workers>-<worker>; two "
	                           "clusters made from one backup need different prefixes.",
	                           &settings.transactional_id_prefix, "outbox", PGC_SIGHUP, 0,
	                           outbox_check_transactional_id_prefix, nullptr, nullptr);
	DefineCustomStringVariable("outbox.progress_topic",
	                           "exactly_once: the Kafka topic whose partition 0 holds each worker's committed batch "
	                           "count (a consumer group offset; no record is written to it).",
	                           nullptr, &settings.progress_topic, "outbox.progress", PGC_SIGHUP, 0,
	                           outbox_check_progress_topic, nullptr, nullptr);
}

const struct config_enum_entry kStandbyLsns[] = {
    {"flush", int(StandbyLsn::Flush), false},
    {"replay", int(StandbyLsn::Replay), false},
    {nullptr, 0, false},
};

const struct config_enum_entry kFailoverTimeoutPolicies[] = {
    {"wait", int(FailoverTimeoutPolicy::Wait), false},
    {"publish", int(FailoverTimeoutPolicy::Publish), false},
    {nullptr, 0, false},
};

// Failover-safe publishing (standby_wait.cpp, docs/failover.md). SIGHUP: which
// standbys a failover may go to is the operator's decision, not a session's.
void
DefineFailoverSettings() {
	DefineCustomStringVariable(
	    "outbox.failover_standbys", "Standbys that must have a batch's WAL before the relay publishes it (empty: off).",
	    "Their application_name: 'a, b' (all of them), 'ANY n (a, b)' (n of them) or 'ANY n (*)' (any n "
	    "standbys). Keeps Kafka from holding events that a failover to one of them would lose.",
	    &settings.failover_standbys, "", PGC_SIGHUP, 0, CheckFailoverStandbys, AssignFailoverStandbys, nullptr);
	DefineCustomEnumVariable("outbox.failover_standby_lsn",
	                         "Which position of the failover standbys must reach the batch's WAL.",
	                         "flush (on the standby's disk) or replay (also visible to its queries).",
	                         &settings.failover_standby_lsn, int(StandbyLsn::Flush), kStandbyLsns, PGC_SIGHUP, 0,
	                         nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.failover_wait_timeout",
	                        "How long a claimed batch waits for the failover standbys.",
	                        "The batch's rows stay locked meanwhile; then outbox.failover_on_timeout decides.",
	                        &settings.failover_wait_timeout_ms, 10000, 0, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr,
	                        nullptr, nullptr);
	DefineCustomEnumVariable("outbox.failover_on_timeout",
	                         "What a batch does when the failover standbys did not confirm it in time.",
	                         "wait (default): not published; the rows are released and the relay waits for the "
	                         "standbys, state 'waiting for standby'. publish: published anyway (a failover may "
	                         "then lose business rows whose events Kafka has).",
	                         &settings.failover_on_timeout, int(FailoverTimeoutPolicy::Wait),
	                         kFailoverTimeoutPolicies, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
}

// outbox.workers comes from the configuration files or ALTER DATABASE ... SET, which a
// relay worker sees at connect; a SET in a session (or a function's SET clause) would change
// nothing, so it is refused rather than silently ignored.
bool
CheckWorkersSource(int *, void **, GucSource source) {
	if (source < PGC_S_SESSION) {
		return true;
	}
	GUC_check_errcode(ERRCODE_CANT_CHANGE_RUNTIME_PARAM);
	GUC_check_errmsg("outbox.workers cannot be set in a session");
	GUC_check_errhint("Set it per database: ALTER DATABASE name SET outbox.workers = n (that database's relay "
	                  "restarts with it), or for every database in postgresql.conf and reload.");
	return false;
}

} // namespace

#ifdef OUTBOX_TEST_SEAMS
extern "C" {
// Registers in the backend, when first given a value (SET): later than outbox's own callbacks.
static void
outbox_assign_test_enqueue_at_pre_commit(const char *newval, void *) {
	if (newval != nullptr && newval[0] != '\0') {
		CallFromPostgres("outbox_assign_test_enqueue_at_pre_commit", RegisterPreCommitEnqueueForTest);
	}
}
}
#endif

extern "C" {
static bool
outbox_check_workers(int *newval, void **extra, GucSource source) {
	return CallFromPostgres("outbox_check_workers", CheckWorkersSource, newval, extra, source);
}
}

void
DefineSettings() {
	DefineCustomStringVariable("outbox.database",
	                           "Deprecated: the only database the relay publishes from (empty: every database "
	                           "where the extension is installed).",
	                           nullptr, &settings.database, "", PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);
	// SUSET, not POSTMASTER, so that ALTER DATABASE ... SET gives each database its own count; the
	// launcher reads it from pg_db_role_setting (only the database's own entry, not a role's)
	// and from the configuration files. A session's SET changes nothing.
	DefineCustomIntVariable("outbox.workers", "Relay workers per database (0: no relay).",
	                        "Set it per database with ALTER DATABASE ... SET outbox.workers. Each key is always "
	                        "published by the same worker, so per-key order holds with any number.",
	                        &settings.workers, 1, 0, kMaxWorkers, PGC_SUSET, 0, outbox_check_workers, nullptr, nullptr);
	DefineCustomIntVariable("outbox.max_workers", "Relay workers the whole cluster may run (0: no relay).",
	                        "Each is a background worker: max_worker_processes must leave room for them and the "
	                        "launcher. A database whose workers do not fit gets none (state 'no worker slot').",
	                        // 4: with the launcher, 5 of PostgreSQL's default 8 background workers, leaving
	                        // 3 for parallel query, logical replication and other extensions.
	                        &settings.max_workers, 4, 0, kMaxSlots, PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.launcher_naptime",
	                        "How often the launcher looks for new databases and new CREATE EXTENSION outbox.",
	                        "A backstop: CREATE EXTENSION, CREATE/DROP DATABASE and ALTER DATABASE wake it at once.",
	                        &settings.launcher_naptime_ms, 60000, 100, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr,
	                        nullptr, nullptr);
	DefineCustomStringVariable("outbox.bootstrap_servers", "Kafka bootstrap servers (host:port,...).", nullptr,
	                           &settings.bootstrap_servers, "localhost:9092", PGC_SIGHUP, 0, nullptr, nullptr,
	                           nullptr);
	DefineCustomStringVariable(
	    "outbox.kafka_properties", "Extra librdkafka producer properties, as name=value pairs separated by ';'.",
	    "For TLS, SASL, compression and tuning. May hold secrets: only superusers can read it.",
	    &settings.kafka_properties, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
	    outbox_check_kafka_properties, nullptr, nullptr);
	DefineCustomStringVariable(
	    "outbox.kafka_properties_file", "File of extra librdkafka producer properties, one name=value a line.",
	    "For secrets (SASL passwords, key passwords): the worker reads the file, so the values never pass through "
	    "a setting, whose new value the server logs on reload. Only its owner may read it.",
	    &settings.kafka_properties_file, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.publish_timeout", "How long one event may stay in flight to Kafka.",
	                        "librdkafka's message.timeout.ms; bounds how long a claimed batch waits for the broker.",
	                        &settings.publish_timeout_ms, 30000, 1000, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr,
	                        nullptr, nullptr);
	DefineCustomIntVariable("outbox.kafka_connections", "Kafka producers per relay worker, each with its own "
	                        "connection to every broker.",
	                        "A keyed event's partition is always sent by the same one, so per-key order holds with any number. "
	                        "More connections send a batch in fewer round trips when a broker leads many partitions.",
	                        &settings.kafka_connections, 4, 1, kafka::kMaxConnections, PGC_SIGHUP, 0, nullptr,
	                        nullptr, nullptr);
	DefineCustomIntVariable("outbox.batch_size", "Most events a relay worker claims at once.", nullptr,
	                        &settings.batch_size, 20000, 1, 100000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.batch_max_bytes", "Most payload bytes a relay worker claims at once.",
	                        "Bounds the worker's memory however large the backlog; one event is always taken.",
	                        &settings.batch_max_bytes, 16 * 1024 * 1024, 1024, INT_MAX, PGC_SIGHUP, GUC_UNIT_BYTE,
	                        nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.batch_linger", "Least time between two claims of a relay worker that keeps up.",
	                        "Events committed meanwhile share the next batch: fewer relay writes per event for at "
	                        "most this much latency. A worker behind claims at once; 0 turns it off.",
	                        &settings.batch_linger_ms, 10, 0, 60000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr,
	                        nullptr);
	DefineCustomIntVariable("outbox.poll_interval", "Longest sleep of an idle relay worker.",
	                        "A backstop only: committed enqueues wake the relay at once.", &settings.poll_interval_ms,
	                        10000, 10, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.max_attempts", "Attempts before an event the broker rejects moves to failed.",
	                        "Only per-event errors count; broker-wide trouble never uses up attempts.",
	                        &settings.max_attempts, 10, 1, 1000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.backoff_base", "First retry delay; doubles with each attempt or outage step.",
	                        nullptr, &settings.backoff_base_ms, 1000, 1, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr,
	                        nullptr, nullptr);
	DefineCustomIntVariable("outbox.backoff_max", "Longest retry delay.", nullptr, &settings.backoff_max_ms, 300000,
	                        1, 86400000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
	DefineCustomEnumVariable("outbox.on_failed_event", "What a failed event does to later events of its key.",
	                         "block_key (default) holds them until the failed event is retried or deleted, "
	                         "keeping per-key order; skip lets them go ahead.",
	                         &settings.failed_event_policy, int(FailedEventPolicy::BlockKey), kFailedEventPolicies,
	                         PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.retention", "How long published events are kept (0: the relay never purges).",
	                        nullptr, &settings.retention_s, 7 * 24 * 3600, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S,
	                        nullptr, nullptr, nullptr);
	// SIGHUP, not per session: consume_once purges with it, and a consumer role must not be able to
	// shorten the dedup window of the others.
	DefineCustomIntVariable("outbox.consumed_retention",
	                        "How long consumers' dedup marks (outbox.consumed) are kept (0: forever).",
	                        "A duplicate delivered after its mark was purged is applied again.",
	                        &settings.consumed_retention_s, 30 * 24 * 3600, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S,
	                        nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.purge_batch_size", "Rows the relay deletes per retention transaction.", nullptr,
	                        &settings.purge_batch_size, 10000, 1, 1000000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("outbox.max_payload_bytes",
	                        "Largest event (key + payload + headers) that outbox.enqueue() accepts.",
	                        "Keep it at or below the broker's message.max.bytes.", &settings.max_payload_bytes,
	                        1024 * 1024, 0, INT_MAX, PGC_SUSET, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
	// PGC_SIGHUP, not SUSET: who may publish what is the operator's decision, not a session's.
	DefineCustomStringVariable(
	    "outbox.relay_role", "Role the relay's statements run as.",
	    "A role without superuser rights; it needs USAGE on schema outbox and SELECT, UPDATE, DELETE on "
	    "outbox.events (CREATE EXTENSION grants them to outbox_relay).",
	    &settings.relay_role, "outbox_relay", PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	DefineCustomStringVariable("outbox.allowed_topics", "Topics events may name (empty: any topic).",
	                           "A comma-separated list of topic names; a name ending in * is a prefix.",
	                           &settings.allowed_topics, "", PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	DefineCustomStringVariable("outbox.cloudevents_topics", "Topics whose events are published as CloudEvents.",
	                           "A comma-separated list of topic names; a name ending in * is a prefix. Empty: none "
	                           "(enqueue's cloudevents argument still chooses per event). Read by enqueue.",
	                           &settings.cloudevents_topics, "", PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	DefineCustomStringVariable("outbox.cloudevents_source", "CloudEvents source (ce_source) of events that name none.",
	                           "A URI-reference identifying the producer; empty: /outbox/ followed by the database's "
	                           "name, percent-encoded.",
	                           &settings.cloudevents_source, "", PGC_SIGHUP, 0, outbox_check_cloudevents_source,
	                           nullptr, nullptr);
	DefineCustomEnumVariable("outbox.message_timestamp", "Timestamp of the Kafka record.",
	                         "commit (default): the event's created_at, its enqueuing transaction's start; publish: "
	                         "the time the relay hands it to the producer.",
	                         &settings.message_timestamp, int(MessageTimestamp::Commit), kMessageTimestamps,
	                         PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	// PGC_USERSET: an application's tracing sets them, typically with SET LOCAL per transaction.
	DefineCustomStringVariable("outbox.traceparent", "W3C traceparent that enqueue puts on the session's events.",
	                           "Sent as the traceparent header; enqueue's traceparent argument overrides it.",
	                           &settings.traceparent, "", PGC_USERSET, GUC_NOT_IN_SAMPLE, outbox_check_traceparent,
	                           nullptr, nullptr);
	DefineCustomStringVariable("outbox.tracestate", "W3C tracestate that goes with outbox.traceparent.", nullptr,
	                           &settings.tracestate, "", PGC_USERSET, GUC_NOT_IN_SAMPLE, outbox_check_tracestate,
	                           nullptr, nullptr);
	DefineCustomIntVariable("outbox.lock_timeout", "How long a relay statement waits for a row or table lock.",
	                        "A session holding outbox rows past it makes the step fail; the relay recovers.",
	                        &settings.lock_timeout_ms, 10000, 1, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr,
	                        nullptr);
	DefineCustomIntVariable("outbox.statement_timeout", "Longest a relay statement may run.", nullptr,
	                        &settings.statement_timeout_ms, 60000, 1, 3600000, PGC_SIGHUP, GUC_UNIT_MS, nullptr,
	                        nullptr, nullptr);
	DefineFailoverSettings();
	DefineDeliverySettings();
#ifdef OUTBOX_TEST_SEAMS
	DefineCustomStringVariable("outbox.test_crash_at", "Test only: crash the relay at this point of an exactly_once batch.",
	                           nullptr, &settings.test_crash_at, "", PGC_SIGHUP,
	                           GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE, nullptr, nullptr, nullptr);
	DefineCustomStringVariable("outbox.test_crash_after_ack", "Test only: crash the relay after this event is acked.",
	                           nullptr, &settings.test_crash_after_ack, "", PGC_SIGHUP,
	                           GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE, nullptr, nullptr, nullptr);
	DefineCustomStringVariable("outbox.test_fail_step", "Test only: 'step:N' fails the next N runs of a relay step.",
	                           nullptr, &settings.test_fail_step, "", PGC_SIGHUP,
	                           GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE, nullptr, nullptr, nullptr);
	DefineCustomStringVariable("outbox.test_enqueue_at_pre_commit",
	                           "Test only: 'topic:key' enqueues at pre-commit from a callback registered late.",
	                           nullptr, &settings.test_enqueue_at_pre_commit, "", PGC_SUSET,
	                           GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE, nullptr,
	                           outbox_assign_test_enqueue_at_pre_commit, nullptr);
#endif
#if PG_VERSION_NUM >= 150000
	MarkGUCPrefixReserved("outbox");
#else
	EmitWarningsOnPlaceholders("outbox");
#endif
}

bool
TopicAllowed(const char *topic, int len) {
	const char *list = settings.allowed_topics;
	return list == nullptr || list[0] == '\0' || TopicListed(list, topic, len);
}

bool
TopicListed(const char *list, const char *topic, int len) {
	if (list == nullptr) {
		return false;
	}
	// Entries are trimmed of spaces; "billing.*" allows every topic that starts with "billing.".
	for (const char *p = list; *p;) {
		while (*p == ' ' || *p == ',') {
			p++;
		}
		const char *start = p;
		while (*p && *p != ',') {
			p++;
		}
		const char *end = p;
		while (end > start && end[-1] == ' ') {
			end--;
		}
		int n = int(end - start);
		if (n > 0 && start[n - 1] == '*') {
			if (len >= n - 1 && memcmp(topic, start, n - 1) == 0) {
				return true;
			}
		} else if (n > 0 && n == len && memcmp(topic, start, n) == 0) {
			return true;
		}
	}
	return false;
}

} // namespace outbox
