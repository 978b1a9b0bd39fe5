// Name-based UUIDs (RFC 9562 version 5, SHA-1) and the encoding of (aggregate, discriminator)
// pairs used by outbox.event_id(). Pure C++: no Postgres headers, no allocation, no exceptions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace outbox {

constexpr size_t kUuidBytes = 16;

// The fixed namespace of outbox.event_id(aggregate, discriminator). Published in the README;
// changing it would change every id ever derived, so it never changes.
// d4e3f08c-32f8-4d92-844f-adced4c5bfb1
extern const uint8_t kEventIdNamespace[kUuidBytes];

// Streaming SHA-1 (FIPS 180-4). Only what UUID v5 needs.
class Sha1 {
public:
	Sha1() noexcept;
	void Update(const void *data, size_t len) noexcept;
	void Finish(uint8_t digest[20]) noexcept;

private:
	void Block(const uint8_t block[64]) noexcept;
	uint32_t h_[5];
	uint64_t length_bits_;
	uint8_t buffer_[64];
	size_t buffered_;
};

// RFC 9562 section 5.5: SHA-1 over namespace bytes then name bytes, version 5, variant 10.
// `name_parts` are hashed one after another, as if concatenated.
void UuidV5(const uint8_t ns[kUuidBytes], const void *const *name_parts, const size_t *part_lengths,
            size_t n_parts, uint8_t out[kUuidBytes]) noexcept;

// Writes the netstring prefix "<length>:" of a part of `length` bytes into buf (at least 24
// bytes) and returns its length. The event-id name is netstring(aggregate) netstring(discriminator)
// where netstring(s) = "<byte length of s in decimal>:" s ",", so no two pairs share a name.
size_t NetstringPrefix(size_t length, char *buf) noexcept;

} // namespace outbox
