// The outbox.* settings (README "Settings").
#pragma once

namespace outbox {

enum class FailedEventPolicy { BlockKey = 0, Skip = 1 };

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
	// Batching and pacing.
	int batch_size;
	int batch_max_bytes;
	int poll_interval_ms;
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
	// Bounds on the relay's own statements.
	int lock_timeout_ms;
	int statement_timeout_ms;
#ifdef OUTBOX_TEST_SEAMS
	// Test-only fault injection: die right after the broker acknowledged this event_id.
	char *test_crash_after_ack;
	// Test-only fault injection: "step:N" makes the next N runs of that relay step (claim,
	// record, next retry, purge) raise an ERROR after their statement.
	char *test_fail_step;
#endif
};

extern Settings settings;

constexpr int kMaxWorkers = 32; // per database
constexpr int kMaxSlots = 128;  // ceiling of outbox.max_workers

void DefineSettings();

// Whether outbox.allowed_topics lets events name this topic (len bytes, not NUL-terminated).
bool TopicAllowed(const char *topic, int len);

} // namespace outbox
