// The outbox.* settings (README "Settings").
#pragma once

namespace outbox {

enum class FailedEventPolicy { BlockKey = 0, Skip = 1 };

struct Settings {
	// Relay topology (postmaster start only).
	char *database;
	int workers;
	// Kafka.
	char *bootstrap_servers;
	char *kafka_properties; // superuser-only and hidden: may hold SASL passwords
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
	// Input limits.
	int max_payload_bytes;
	// Test-only fault injection: die right after the broker acknowledged this event_id.
	char *test_crash_after_ack;
};

extern Settings settings;

constexpr int kMaxWorkers = 32;

void DefineSettings();

} // namespace outbox
