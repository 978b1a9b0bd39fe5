// The outbox.* settings (docs/settings.md).
#pragma once

namespace outbox {

enum class FailedEventPolicy { BlockKey = 0, Skip = 1 };

// The Kafka record's timestamp (CreateTime): the row's created_at, or the producer's clock.
enum class MessageTimestamp { Commit = 0, Publish = 1 };
// Failover-safe publishing (standby_wait.cpp): which standby position counts, and what a batch
// does when the standbys have not reached it within outbox.failover_wait_timeout.
enum class StandbyLsn { Flush = 0, Replay = 1 };
enum class FailoverTimeoutPolicy { Wait = 0, Publish = 1 };
// outbox.delivery: at least once (idempotent producer; a crash between the broker's ack and the
// record sends a batch again) or exactly once to read_committed consumers (Kafka transactions
// decided with a prepared Postgres transaction, DESIGN.md "Exactly once").
enum class Delivery { AtLeastOnce = 0, ExactlyOnce = 1 };

struct Settings {
	// Relay topology. database: "" relays every database with the extension (launcher.cpp),
	// a name only that one (deprecated). workers: per database (ALTER DATABASE ... SET), read by
	// the launcher. max_workers: the cluster's budget of relay workers (postmaster start only).
	char *database;
	int workers;
	int max_workers;
	int launcher_naptime_ms;
	// Kafka.
	char *bootstrap_servers;
	char *kafka_properties; // superuser-only and hidden: may hold SASL passwords
	char *kafka_properties_file; // path of name=value lines read by the worker (for secrets)
	int publish_timeout_ms;
	int kafka_connections; // librdkafka producers per worker, each sending its share of the partitions
	int delivery;          // Delivery
	char *transactional_id_prefix; // exactly_once: first part of each worker's transactional.id
	char *progress_topic;          // exactly_once: the topic whose partition 0 holds the batches' offsets
	// Batching and pacing.
	int batch_size;
	int batch_max_bytes;
	int poll_interval_ms;
	int batch_linger_ms; // least time from a claim to the next while the worker keeps up
	// Failures.
	int max_attempts;
	int backoff_base_ms;
	int backoff_max_ms;
	int failed_event_policy; // FailedEventPolicy
	// Retention.
	int retention_s;
	int purge_batch_size;
	int consumed_retention_s; // consumer dedup marks (read by SQL only: outbox.consume_once)
	// Input limits.
	int max_payload_bytes;
	// Privilege: the role the relay's statements run as, and the topics events may name.
	char *relay_role;
	char *allowed_topics; // "" = any topic; else a comma-separated list of names and prefix*
	// Envelopes (docs/envelopes.md).
	char *cloudevents_topics; // "" = none; else like allowed_topics: their events are CloudEvents
	char *cloudevents_source; // ce_source of events that name none ("" = /outbox/<database>)
	int message_timestamp;    // MessageTimestamp
	char *traceparent;        // session: W3C trace context captured by enqueue ("" = none)
	char *tracestate;
	// Bounds on the relay's own statements.
	int lock_timeout_ms;
	int statement_timeout_ms;
	// Failover-safe publishing (standby_wait.cpp): "" = off, "a, b" = all of them,
	// "ANY n (a, b)" = n of them, "ANY n (*)" = any n standbys.
	char *failover_standbys;
	int failover_standby_lsn; // StandbyLsn
	int failover_wait_timeout_ms;
	int failover_on_timeout; // FailoverTimeoutPolicy
#ifdef OUTBOX_TEST_SEAMS
	// Test-only fault injection: die right after the broker acknowledged this event_id.
	char *test_crash_after_ack;
	// Test-only fault injection (exactly_once): die at this point of a batch (worker.cpp
	// MaybeCrashAt: after_claim, after_produce, after_prepare, after_kafka_commit,
	// after_postgres_commit).
	char *test_crash_at;
	// Test-only fault injection: "step:N" makes the next N runs of that relay step (claim,
	// record, next retry, purge) raise an ERROR after their statement.
	char *test_fail_step;
	// Test-only: 'topic:key' makes a pre-commit callback registered after outbox's (a library
	// loaded later) enqueue an event of that key at each commit while it is set (commit_order.cpp).
	char *test_enqueue_at_pre_commit;
#endif
};

extern Settings settings;

constexpr int kMaxWorkers = 32; // per database
constexpr int kMaxSlots = 128;  // ceiling of outbox.max_workers

void DefineSettings();

// Whether outbox.allowed_topics lets events name this topic (len bytes, not NUL-terminated).
bool TopicAllowed(const char *topic, int len);

// Whether a list of names and prefix* (the allowed_topics syntax) names this topic; an empty
// list names none.
bool TopicListed(const char *list, const char *topic, int len);

} // namespace outbox
