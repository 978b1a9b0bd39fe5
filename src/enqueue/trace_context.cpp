// W3C Trace Context validation (trace_context.hpp).
#include "enqueue/trace_context.hpp"

#include "shared/no_postgres.hpp"

namespace outbox {

namespace {

bool
IsLowerHex(char c) {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

// Whether value[from, from + n) is lowercase hex; *all_zero says whether it was all '0'.
bool
HexField(const char *value, size_t from, size_t n, bool *all_zero) {
	*all_zero = true;
	for (size_t i = from; i < from + n; i++) {
		if (!IsLowerHex(value[i])) {
			return false;
		}
		*all_zero = *all_zero && value[i] == '0';
	}
	return true;
}

bool
IsKeyChar(char c) {
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' || c == '/';
}

// One tracestate member: key=value (trace_context.hpp).
const char *
MemberProblem(const char *m, size_t n) {
	size_t eq = 0;
	while (eq < n && m[eq] != '=') {
		eq++;
	}
	if (eq == n) {
		return "a tracestate member is not key=value";
	}
	size_t at = eq;
	for (size_t i = 0; i < eq; i++) {
		if (m[i] == '@') {
			at = i;
			break;
		}
	}
	// key: simple-key, or tenant-id@system-id (tenant up to 241, system up to 14 characters)
	size_t key_len = eq, tenant_len = at, system_len = at < eq ? eq - at - 1 : 0;
	if (key_len == 0 || key_len > 256 || (at < eq && (tenant_len == 0 || tenant_len > 241 || system_len == 0 ||
	                                                  system_len > 14))) {
		return "a tracestate key must be 1 to 256 characters (tenant@system: at most 241@14)";
	}
	bool first_ok = (m[0] >= 'a' && m[0] <= 'z') || (m[0] >= '0' && m[0] <= '9');
	if (!first_ok || (at < eq && !((m[at + 1] >= 'a' && m[at + 1] <= 'z')))) {
		return "a tracestate key must start with a lowercase letter or a digit";
	}
	for (size_t i = 0; i < eq; i++) {
		if (i != at && !IsKeyChar(m[i])) {
			return "a tracestate key may contain only a-z, 0-9, '_', '-', '*', '/' (and one '@')";
		}
	}
	size_t value_len = n - eq - 1;
	if (value_len == 0 || value_len > 256) {
		return "a tracestate value must be 1 to 256 characters";
	}
	for (size_t i = eq + 1; i < n; i++) {
		char c = m[i];
		if (c < 0x20 || c > 0x7e || c == ',' || c == '=') {
			return "a tracestate value may contain only printable ASCII other than ',' and '='";
		}
	}
	if (m[n - 1] == ' ') {
		return "a tracestate value must not end in a space";
	}
	return nullptr;
}

} // namespace

const char *
TraceparentProblem(const char *value, size_t len) noexcept {
	if (len < 55) {
		return "a traceparent is 55 characters: 00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>";
	}
	bool zero;
	if (!HexField(value, 0, 2, &zero) || value[2] != '-' || value[35] != '-' || value[52] != '-') {
		return "a traceparent is version-traceid-parentid-flags in lowercase hex, separated by '-'";
	}
	if (value[0] == 'f' && value[1] == 'f') {
		return "traceparent version ff is invalid";
	}
	if (!HexField(value, 3, 32, &zero)) {
		return "the trace-id must be 32 lowercase hex digits";
	}
	if (zero) {
		return "the trace-id must not be all zeros";
	}
	if (!HexField(value, 36, 16, &zero)) {
		return "the parent-id must be 16 lowercase hex digits";
	}
	if (zero) {
		return "the parent-id must not be all zeros";
	}
	if (!HexField(value, 53, 2, &zero)) {
		return "the trace-flags must be 2 lowercase hex digits";
	}
	bool version_00 = value[0] == '0' && value[1] == '0';
	if (len > 55 && (version_00 || value[55] != '-')) {
		return version_00 ? "a version 00 traceparent is exactly 55 characters"
		                  : "a later traceparent version continues after the flags with '-'";
	}
	for (size_t i = 55; i < len; i++) {
		if (value[i] < 0x20 || value[i] > 0x7e) {
			return "a traceparent is printable ASCII";
		}
	}
	return nullptr;
}

const char *
TracestateProblem(const char *value, size_t len) noexcept {
	if (len > 512) {
		return "a tracestate is at most 512 characters";
	}
	int members = 0;
	for (size_t start = 0; start <= len;) {
		size_t end = start;
		while (end < len && value[end] != ',') {
			end++;
		}
		// Optional white space around a member; an empty member is allowed.
		size_t a = start, b = end;
		while (a < b && (value[a] == ' ' || value[a] == '\t')) {
			a++;
		}
		while (b > a && (value[b - 1] == ' ' || value[b - 1] == '\t')) {
			b--;
		}
		if (b > a) {
			if (++members > 32) {
				return "a tracestate has at most 32 members";
			}
			if (const char *problem = MemberProblem(value + a, b - a)) {
				return problem;
			}
		}
		start = end + 1;
	}
	return nullptr;
}

} // namespace outbox
