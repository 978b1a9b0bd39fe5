// W3C Trace Context (https://www.w3.org/TR/trace-context/): what a traceparent and a tracestate
// must look like to travel on a Kafka record. Pure functions: the settings' check hooks and
// enqueue's arguments use the same rules.
#pragma once

#include <cstddef>

namespace outbox {

constexpr const char *kTraceparentHeader = "traceparent";
constexpr const char *kTracestateHeader = "tracestate";

// Why a traceparent is invalid, or nullptr: version-traceid-parentid-flags, lowercase hex,
// "00-<32 hex, not all 0>-<16 hex, not all 0>-<2 hex>". Version ff is invalid; a later version
// (01..fe) may append "-..." after the same four fields.
const char *TraceparentProblem(const char *value, size_t len) noexcept;

// Why a tracestate is invalid, or nullptr: at most 512 characters and 32 comma-separated
// key=value members; keys [a-z0-9][a-z0-9_*/-]{0,255}, or tenant@system; values 1 to 256
// printable ASCII characters other than ',' and '=' that do not end in a space.
const char *TracestateProblem(const char *value, size_t len) noexcept;

} // namespace outbox
