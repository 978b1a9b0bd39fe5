// Event ids: name-based UUIDs (RFC 9562 version 5, SHA-1) and the encoding of (aggregate,
// discriminator) pairs used by outbox.event_id(); the time-ordered ids enqueue gives an event the
// caller named none (version 7). Called from Postgres code only: UuidV5 may raise an ERROR.
#pragma once

#include <cstddef>
#include <cstdint>

namespace outbox {

constexpr size_t kUuidBytes = 16;

// The fixed namespace of outbox.event_id(aggregate, discriminator). Published in docs/sql-api.md;
// changing it would change every id ever derived, so it never changes.
// d4e3f08c-32f8-4d92-844f-adced4c5bfb1
extern const uint8_t kEventIdNamespace[kUuidBytes];

// RFC 9562 section 5.5: SHA-1 over namespace bytes then name bytes, version 5, variant 10.
// `name_parts` are hashed one after another, as if concatenated.
void UuidV5(const uint8_t ns[kUuidBytes], const void *const *name_parts, const size_t *part_lengths,
            size_t n_parts, uint8_t out[kUuidBytes]);

// RFC 9562 section 5.7: the Unix time in milliseconds (48 bits, big-endian), version 7, variant
// 10 and 74 bits of `random` (its bytes 0-9; the version and variant bits give way). Ids made in
// later milliseconds sort after earlier ones, so each lands at the right edge of the event-id
// index, as an identity's would, instead of on a random leaf (a page read, a split and, after a
// checkpoint, a full-page image per event on a large member). No finer time than the millisecond
// (a consumer reads the id: the sub-millisecond gap between two enqueues is the application's).
// That order is not a contract: within a millisecond it is random, and a clock stepped back
// gives smaller ids; commit order is order_lsn.
void UuidV7(uint64_t unix_ms, const uint8_t random[10], uint8_t out[kUuidBytes]);

// Whether `id` has UuidV7's version (7) and variant (10) bits: the kind of id enqueue generates.
// (A caller may pass such an id too: this says nothing of who made it.)
inline bool
IsUuidV7(const uint8_t id[kUuidBytes]) {
	return (id[6] >> 4) == 7 && (id[8] & 0xC0) == 0x80;
}

// Writes the netstring prefix "<length>:" of a part of `length` bytes into buf (at least 24
// bytes) and returns its length. The event-id name is netstring(aggregate) netstring(discriminator)
// where netstring(s) = "<byte length of s in decimal>:" s ",", so no two pairs share a name.
size_t NetstringPrefix(size_t length, char *buf);

} // namespace outbox
