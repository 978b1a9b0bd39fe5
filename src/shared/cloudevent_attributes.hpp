// What a CloudEvents 1.0 attribute value must look like to be read back by the SDKs (the Java
// SDK parses ce_source with java.net.URI and refuses the whole record when it fails). Pure
// functions: enqueue's arguments, the outbox.cloudevents_source setting and the relay's check of
// a claimed row use the same rules.
#pragma once

#include <cstddef>

namespace outbox::cloudevents {

// Why a source is not an RFC 3986 URI-reference (that java.net.URI also parses), or nullptr:
// not empty; only unreserved, reserved and %XX characters (a space must be written %20); a
// scheme before the first ':' that comes before any '/', '?' or '#', with something after it;
// '[' and ']' only around an IPv6 host; a port of at most 65535; at most one '#'.
const char *UriReferenceProblem(const char *value, size_t len) noexcept;

// Why a content type is not an RFC 2046 media type, or nullptr: type "/" subtype, both tokens,
// then parameters ';' name=value (a token or a quoted string), e.g. "text/plain; charset=utf-8".
const char *MediaTypeProblem(const char *value, size_t len) noexcept;

// Why UTF-8 text is not a CloudEvents String (ce_type), or nullptr: not empty, and without the
// control characters U+0000-U+001F and U+007F-U+009F or a Unicode noncharacter.
const char *StringAttributeProblem(const char *value, size_t len) noexcept;

// Whether a header of this name, in any case, would be read as an envelope attribute: the
// Python SDK lowercases header names before it looks for ce_* and content-type, the Java SDK
// lowercases the name after "ce_". An event's own header of such a name would be a second,
// conflicting attribute.
bool NamesEnvelopeAttribute(const char *name, size_t len) noexcept;

// The default ce_source path segment: the database name with every byte but A-Z a-z 0-9 - . _ ~
// written as %XX. PercentEncodedLength is its length; PercentEncode writes it and a NUL into
// out, which holds PercentEncodedLength(name, len) + 1 bytes.
size_t PercentEncodedLength(const char *name, size_t len) noexcept;
void PercentEncode(const char *name, size_t len, char *out) noexcept;

} // namespace outbox::cloudevents
