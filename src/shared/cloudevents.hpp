// CloudEvents 1.0 over Kafka (the Kafka protocol binding, binary content mode): the attributes
// travel as ce_* headers and the payload is the record's value, its content type the
// content-type header. Constants and pure helpers shared by enqueue (sizes, content types) and the
// relay (cloudevent_headers.cpp, which writes the headers at publish time).
#pragma once

#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace outbox::cloudevents {

constexpr const char *kSpecVersion = "1.0";
constexpr const char *kIdHeader = "ce_id";
constexpr const char *kSourceHeader = "ce_source";
constexpr const char *kTypeHeader = "ce_type";
constexpr const char *kSpecVersionHeader = "ce_specversion";
constexpr const char *kTimeHeader = "ce_time";
constexpr const char *kContentTypeHeader = "content-type";
constexpr int kHeaderCount = 6;

// The payload's content type, by the enqueue variant that stored it.
constexpr const char *kJsonContentType = "application/json";
constexpr const char *kTextContentType = "text/plain; charset=utf-8";
constexpr const char *kBinaryContentType = "application/octet-stream";
// The prefix of structured content mode's media types (application/cloudevents+json,
// application/cloudevents-batch+json): never a binary-mode record's content-type.
constexpr const char *kStructuredContentTypePrefix = "application/cloudevents";

// ce_time: RFC 3339 in UTC with microseconds, "2026-12-01T13:58:34.123456Z".
constexpr size_t kTimeLength = 27;

// Whether a header of this name belongs to the envelope (ce_*, content-type), as the table's
// CHECK (row_check.cpp) has it since 0.2.0. enqueue and the relay refuse more: the same names in
// any case (NamesEnvelopeAttribute, cloudevent_attributes.hpp); the CHECK stays as it validated
// existing rows, and the relay quarantines the rest.
inline bool
IsEnvelopeHeader(const char *name, size_t len) noexcept {
	return (len >= 3 && memcmp(name, "ce_", 3) == 0) || (len == 12 && memcmp(name, "content-type", 12) == 0);
}

// Bytes the envelope adds to a record (names, values, 10 bytes of framing each), for the size limit.
inline int64_t
HeaderBytes(size_t id_len, size_t source_len, size_t type_len, size_t content_type_len) noexcept {
	return int64_t(strlen(kIdHeader) + id_len + strlen(kSourceHeader) + source_len + strlen(kTypeHeader) + type_len +
	               strlen(kSpecVersionHeader) + strlen(kSpecVersion) + strlen(kTimeHeader) + kTimeLength +
	               strlen(kContentTypeHeader) + content_type_len + 10 * kHeaderCount);
}

// Whether ce_time can state this time (microseconds since the Unix epoch): RFC 3339 has
// four-digit years, 0001 to 9999. A row written by hand may hold any timestamptz.
inline bool
TimeRepresentable(int64_t unix_us) noexcept {
	constexpr int64_t kYear1 = -62135596800LL * 1000000, kYear10000 = 253402300800LL * 1000000;
	return unix_us >= kYear1 && unix_us < kYear10000;
}

// Writes ce_time for a time in microseconds since the Unix epoch (TimeRepresentable); buf holds
// kTimeLength + 1.
inline void
FormatTime(int64_t unix_us, char *buf) noexcept {
	int64_t seconds = unix_us / 1000000, micros = unix_us % 1000000;
	if (micros < 0) {
		micros += 1000000;
		seconds -= 1;
	}
	time_t t = time_t(seconds);
	struct tm tm;
	gmtime_r(&t, &tm);
	snprintf(buf, kTimeLength + 1, "%04d-%02d-%02dT%02d:%02d:%02d.%06" PRId64 "Z", tm.tm_year + 1900, tm.tm_mon + 1,
	         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, micros);
}

} // namespace outbox::cloudevents
