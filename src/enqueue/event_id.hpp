// Event ids: name-based UUIDs (RFC 9562 version 5, SHA-1) and the encoding of (aggregate,
// discriminator) pairs used by outbox.event_id(); the time-ordered, marked ids enqueue gives an
// event the caller named none (version 8). Called from Postgres code only: UuidV5 may raise an
// ERROR.
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

// The ids enqueue generates for an event the caller named none: RFC 9562 version 8 (section 5.8,
// the layout is ours), variant 10, laid out as version 7 is (the Unix time in milliseconds, 48
// bits big-endian, first, so they sort by the millisecond they were made in) but with the 12 bits
// after the version fixed to kGeneratedIdMark, then 62 bits of `random` (its bytes 0-7; the
// variant bits give way). That mark is why: on schema 0.4.1 a generated id has no entry in the
// event-id index and is not deduplicated, so one passed back to enqueue (or written by hand as a
// caller's id) must be recognised and refused; a caller's own ids (version 5 from
// outbox.event_id(), 4, 7 from any library) never carry it. No finer time than the millisecond
// (a consumer reads the id: the sub-millisecond gap between two enqueues is the application's).
// The time order is not a contract: within a millisecond it is random, and a clock stepped back
// gives smaller ids; commit order is order_lsn.
constexpr unsigned kGeneratedIdMark = 0x0B0; // the id's text reads xxxxxxxx-xxxx-80b0-...
void GeneratedUuid(uint64_t unix_ms, const uint8_t random[8], uint8_t out[kUuidBytes]);

// Whether `id` has GeneratedUuid's version, mark and variant: made by enqueue (or copied from
// one it made: who may write such a row is the member's INSERT privilege, DESIGN.md).
inline bool
IsGeneratedUuid(const uint8_t id[kUuidBytes]) {
	return id[6] == (0x80 | (kGeneratedIdMark >> 8)) && id[7] == (kGeneratedIdMark & 0xFF) && (id[8] & 0xC0) == 0x80;
}

// Writes the netstring prefix "<length>:" of a part of `length` bytes into buf (at least 24
// bytes) and returns its length. The event-id name is netstring(aggregate) netstring(discriminator)
// where netstring(s) = "<byte length of s in decimal>:" s ",", so no two pairs share a name.
size_t NetstringPrefix(size_t length, char *buf);

} // namespace outbox
