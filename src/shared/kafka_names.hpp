// What Kafka accepts as a topic name, and how keys map to relay lanes. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace outbox {

constexpr size_t kMaxTopicLength = 249;

// Longest key enqueue accepts: keys are in the per-key indexes, whose entries have a size limit
// (about 2.7 kB with the id); the table checks the same bound (events_key_length_check).
constexpr int kMaxKeyBytes = 2048;

// The header the relay sets on every record itself; events may not carry one of that name.
constexpr const char *kEventIdHeader = "event_id";

// Why a topic name is illegal, or nullptr when Kafka would accept it: 1 to 249 characters of
// [a-zA-Z0-9._-], and not "." or "..".
inline const char *
TopicNameProblem(const char *name, size_t len) noexcept {
	if (len == 0) {
		return "a topic name must not be empty";
	}
	if (len > kMaxTopicLength) {
		return "a topic name is at most 249 characters long";
	}
	if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.')) {
		return "\".\" and \"..\" are not legal topic names";
	}
	for (size_t i = 0; i < len; i++) {
		char c = name[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		          c == '_' || c == '-';
		if (!ok) {
			return "a topic name may contain only ASCII letters, digits, '.', '_' and '-'";
		}
	}
	return nullptr;
}

// Relay lanes: a key's lane decides which worker publishes it (lane % outbox.workers). The hash
// is ours (32-bit FNV-1a), not a server function, so it never changes across server versions
// and pg_upgrade: a key keeps its lane forever.
constexpr int kLaneCount = 1024;

inline int
LaneOf(const void *bytes, size_t len) noexcept {
	const uint8_t *p = static_cast<const uint8_t *>(bytes);
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 16777619u;
	}
	return int(h % kLaneCount);
}

constexpr size_t kEventIdBytes = 16;

// A row's lane: its key's, or for an unkeyed event its event id's (key == nullptr).
inline int
LaneOfEvent(const char *key, size_t key_len, const unsigned char *event_id) noexcept {
	return key ? LaneOf(key, key_len) : LaneOf(event_id, kEventIdBytes);
}

} // namespace outbox
