// CloudEvents attribute values (cloudevent_attributes.hpp).
#include "shared/cloudevent_attributes.hpp"

#include <arpa/inet.h>
#include <cstring>

#include "shared/no_postgres.hpp"

namespace outbox::cloudevents {

namespace {

bool
IsAlpha(char c) {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

bool
IsDigit(char c) {
	return c >= '0' && c <= '9';
}

bool
IsHex(char c) {
	return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool
IsUnreserved(char c) {
	return IsAlpha(c) || IsDigit(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

bool
IsSubDelim(char c) {
	return c != '\0' && strchr("!$&'()*+,;=", c) != nullptr;
}

// Whether s[from, to) holds only unreserved, sub-delims, %XX and the characters of `extra`.
const char *
CharsProblem(const char *s, size_t from, size_t to, const char *extra) {
	for (size_t i = from; i < to; i++) {
		char c = s[i];
		if (c == '%') {
			if (i + 2 >= to || !IsHex(s[i + 1]) || !IsHex(s[i + 2])) {
				return "a '%' must be followed by two hex digits";
			}
			i += 2;
		} else if (!IsUnreserved(c) && !IsSubDelim(c) && (c == '\0' || strchr(extra, c) == nullptr)) {
			if (c == ' ') {
				return "it contains a space (write it as %20)";
			}
			if (c == '[' || c == ']') {
				return "'[' and ']' may only enclose an IPv6 host";
			}
			if (c == '#') {
				return "it contains a second '#'";
			}
			return "it contains a character that must be percent-encoded (only A-Z a-z 0-9 -._~ :/?#[]@ "
			       "!$&'()*+,;= and %XX may appear)";
		}
	}
	return nullptr;
}

size_t
FindAny(const char *s, size_t from, size_t to, const char *stops) {
	while (from < to && strchr(stops, s[from]) == nullptr) {
		from++;
	}
	return from;
}

// authority = [ userinfo "@" ] host [ ":" port ], host an IPv6 literal in brackets or a reg-name.
const char *
AuthorityProblem(const char *s, size_t from, size_t to) {
	size_t host = from;
	for (size_t i = to; i > from; i--) {
		if (s[i - 1] == '@') {
			if (const char *problem = CharsProblem(s, from, i - 1, ":")) {
				return problem;
			}
			host = i;
			break;
		}
	}
	size_t port = to;
	if (host < to && s[host] == '[') {
		size_t close = FindAny(s, host, to, "]");
		char literal[INET6_ADDRSTRLEN + 1];
		size_t n = close - host - 1;
		struct in6_addr addr;
		if (close == to || n == 0 || n >= sizeof(literal)) {
			return "an IPv6 host must be written [address]";
		}
		memcpy(literal, s + host + 1, n);
		literal[n] = '\0';
		if (inet_pton(AF_INET6, literal, &addr) != 1) {
			return "the host in [ ] is not an IPv6 address";
		}
		if (close + 1 < to && s[close + 1] != ':') {
			return "an IPv6 host must be followed by ':port' or the end of the authority";
		}
		port = close + 1;
	} else {
		port = FindAny(s, host, to, ":");
		if (const char *problem = CharsProblem(s, host, port, "")) {
			return problem;
		}
	}
	// java.net.URI reads the port as an int: beyond 2^31-1 it refuses a bracketed host and
	// reads any other authority as registry-based (no host). A TCP port is at most 65535: above
	// that, refuse every host form. Leading zeros are fine (java.net.URI's Integer.parseInt).
	unsigned long value = 0;
	for (size_t i = port + 1; i < to; i++) {
		if (!IsDigit(s[i])) {
			return "the port after the host's ':' must be digits";
		}
		value = value * 10 + unsigned(s[i] - '0');
		if (value > 65535) {
			return "the port after the host's ':' is above 65535";
		}
	}
	return nullptr;
}

// The code point at s[*i] (valid UTF-8: the caller converted it), advancing *i past it.
unsigned
NextCodePoint(const unsigned char *s, size_t len, size_t *i) {
	unsigned c = s[*i];
	int extra = c < 0x80 ? 0 : c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3;
	unsigned cp = extra == 0 ? c : extra == 1 ? c & 0x1f : extra == 2 ? c & 0x0f : c & 0x07;
	(*i)++;
	for (int k = 0; k < extra && *i < len; k++, (*i)++) {
		cp = (cp << 6) | (s[*i] & 0x3f);
	}
	return cp;
}

bool
IsTokenChar(char c) {
	return c > 0x20 && c < 0x7f && strchr("()<>@,;:\\\"/[]?=", c) == nullptr;
}

size_t
TokenEnd(const char *s, size_t from, size_t len) {
	while (from < len && IsTokenChar(s[from])) {
		from++;
	}
	return from;
}

size_t
SkipSpace(const char *s, size_t from, size_t len) {
	while (from < len && (s[from] == ' ' || s[from] == '\t')) {
		from++;
	}
	return from;
}

} // namespace

const char *
UriReferenceProblem(const char *s, size_t len) noexcept {
	if (len == 0) {
		return "it is empty";
	}
	size_t i = 0;
	size_t first = FindAny(s, 0, len, ":/?#");
	if (first < len && s[first] == ':') {
		// URI: scheme ":" hier-part. A relative reference's first segment cannot hold a ':'.
		if (first == 0 || !IsAlpha(s[0])) {
			return "the part before its first ':' is not a scheme (a letter, then letters, digits, '+', '-', '.'), "
			       "and a relative reference's first segment cannot contain ':'";
		}
		for (size_t k = 1; k < first; k++) {
			if (!IsAlpha(s[k]) && !IsDigit(s[k]) && s[k] != '+' && s[k] != '-' && s[k] != '.') {
				return "the part before its first ':' is not a scheme (a letter, then letters, digits, '+', '-', "
				       "'.'), and a relative reference's first segment cannot contain ':'";
			}
		}
		if (first + 1 == len || s[first + 1] == '#') {
			return "nothing follows the scheme's ':' (java.net.URI needs a scheme-specific part)";
		}
		i = first + 1;
	}
	if (i + 1 < len && s[i] == '/' && s[i + 1] == '/') {
		size_t end = FindAny(s, i + 2, len, "/?#");
		if (end == i + 2 && end == len) {
			return "an empty authority ('//' at the end) is refused by java.net.URI";
		}
		if (const char *problem = AuthorityProblem(s, i + 2, end)) {
			return problem;
		}
		i = end;
	}
	size_t query = FindAny(s, i, len, "?#");
	if (const char *problem = CharsProblem(s, i, query, ":@/")) {
		return problem;
	}
	size_t fragment = FindAny(s, query, len, "#");
	if (const char *problem = CharsProblem(s, query < len ? query + 1 : len, fragment, ":@/?")) {
		return problem;
	}
	return CharsProblem(s, fragment < len ? fragment + 1 : len, len, ":@/?");
}

const char *
MediaTypeProblem(const char *s, size_t len) noexcept {
	size_t slash = TokenEnd(s, 0, len);
	if (slash == 0 || slash == len || s[slash] != '/') {
		return "it does not start with type/subtype";
	}
	size_t i = TokenEnd(s, slash + 1, len);
	if (i == slash + 1) {
		return "it does not start with type/subtype";
	}
	while ((i = SkipSpace(s, i, len)) < len) {
		if (s[i] != ';') {
			return "type/subtype must be followed by parameters, each '; name=value'";
		}
		i = SkipSpace(s, i + 1, len);
		size_t name_end = TokenEnd(s, i, len);
		if (name_end == i || name_end == len || s[name_end] != '=') {
			return "a parameter is not name=value";
		}
		i = name_end + 1;
		if (i < len && s[i] == '"') {
			for (i++; i < len && s[i] != '"'; i++) {
				if (s[i] == '\\') {
					i++;
				}
				if (i >= len || (static_cast<unsigned char>(s[i]) < 0x20 && s[i] != '\t') || s[i] == 0x7f ||
				    static_cast<unsigned char>(s[i]) > 0x7f) {
					return "a quoted parameter value holds a character it may not";
				}
			}
			if (i >= len) {
				return "a quoted parameter value is not closed";
			}
			i++;
		} else {
			size_t value_end = TokenEnd(s, i, len);
			if (value_end == i) {
				return "a parameter value is neither a token nor a quoted string";
			}
			i = value_end;
		}
	}
	return nullptr;
}

const char *
StringAttributeProblem(const char *value, size_t len) noexcept {
	if (len == 0) {
		return "it is empty";
	}
	const auto *s = reinterpret_cast<const unsigned char *>(value);
	for (size_t i = 0; i < len;) {
		unsigned cp = NextCodePoint(s, len, &i);
		if (cp <= 0x1f || (cp >= 0x7f && cp <= 0x9f)) {
			return "it contains a control character (U+0000-U+001F, U+007F-U+009F)";
		}
		if ((cp >= 0xfdd0 && cp <= 0xfdef) || (cp & 0xfffe) == 0xfffe) {
			return "it contains a Unicode noncharacter";
		}
	}
	return nullptr;
}

bool
NamesEnvelopeAttribute(const char *name, size_t len) noexcept {
	return (len >= 3 && strncasecmp(name, "ce_", 3) == 0) || (len == 12 && strncasecmp(name, "content-type", 12) == 0);
}

size_t
PercentEncodedLength(const char *name, size_t len) noexcept {
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		n += IsUnreserved(name[i]) ? 1 : 3;
	}
	return n;
}

void
PercentEncode(const char *name, size_t len, char *out) noexcept {
	static const char kHex[] = "0123456789ABCDEF";
	for (size_t i = 0; i < len; i++) {
		auto c = static_cast<unsigned char>(name[i]);
		if (IsUnreserved(char(c))) {
			*out++ = char(c);
		} else {
			*out++ = '%';
			*out++ = kHex[c >> 4];
			*out++ = kHex[c & 0xf];
		}
	}
	*out = '\0';
}

} // namespace outbox::cloudevents
