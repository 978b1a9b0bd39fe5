// SHA-1 and RFC 9562 UUID version 5. Written out here (rather than taken from Postgres'
// cryptohash API, which only exists from PostgreSQL 14) so the ids are the same on every
// supported server version, and so the code can be checked against other implementations alone.
#include "event_id.hpp"

#include <cstdio>
#include <cstring>

#include "no_postgres.hpp"

namespace outbox {

const uint8_t kEventIdNamespace[kUuidBytes] = {0xd4, 0xe3, 0xf0, 0x8c, 0x32, 0xf8, 0x4d, 0x92,
                                                0x84, 0x4f, 0xad, 0xce, 0xd4, 0xc5, 0xbf, 0xb1};

namespace {

inline uint32_t
RotateLeft(uint32_t x, int n) noexcept {
	return (x << n) | (x >> (32 - n));
}

} // namespace

Sha1::Sha1() noexcept
    : h_{0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u}, length_bits_(0), buffer_{},
      buffered_(0) {
}

void
Sha1::Block(const uint8_t block[64]) noexcept {
	uint32_t w[80];
	for (int i = 0; i < 16; i++) {
		w[i] = (uint32_t(block[4 * i]) << 24) | (uint32_t(block[4 * i + 1]) << 16) |
		       (uint32_t(block[4 * i + 2]) << 8) | uint32_t(block[4 * i + 3]);
	}
	for (int i = 16; i < 80; i++) {
		w[i] = RotateLeft(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
	}
	uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4];
	for (int i = 0; i < 80; i++) {
		uint32_t f, k;
		if (i < 20) {
			f = (b & c) | (~b & d);
			k = 0x5A827999u;
		} else if (i < 40) {
			f = b ^ c ^ d;
			k = 0x6ED9EBA1u;
		} else if (i < 60) {
			f = (b & c) | (b & d) | (c & d);
			k = 0x8F1BBCDCu;
		} else {
			f = b ^ c ^ d;
			k = 0xCA62C1D6u;
		}
		uint32_t t = RotateLeft(a, 5) + f + e + k + w[i];
		e = d;
		d = c;
		c = RotateLeft(b, 30);
		b = a;
		a = t;
	}
	h_[0] += a;
	h_[1] += b;
	h_[2] += c;
	h_[3] += d;
	h_[4] += e;
}

void
Sha1::Update(const void *data, size_t len) noexcept {
	const uint8_t *p = static_cast<const uint8_t *>(data);
	length_bits_ += uint64_t(len) * 8;
	while (len > 0) {
		size_t take = sizeof(buffer_) - buffered_;
		if (take > len) {
			take = len;
		}
		memcpy(buffer_ + buffered_, p, take);
		buffered_ += take;
		p += take;
		len -= take;
		if (buffered_ == sizeof(buffer_)) {
			Block(buffer_);
			buffered_ = 0;
		}
	}
}

void
Sha1::Finish(uint8_t digest[20]) noexcept {
	uint64_t total_bits = length_bits_;
	const uint8_t pad_start = 0x80;
	const uint8_t zero = 0;
	Update(&pad_start, 1);
	while (buffered_ != 56) {
		Update(&zero, 1);
	}
	uint8_t length_be[8];
	for (int i = 0; i < 8; i++) {
		length_be[i] = uint8_t(total_bits >> (56 - 8 * i));
	}
	Update(length_be, 8);
	for (int i = 0; i < 5; i++) {
		digest[4 * i] = uint8_t(h_[i] >> 24);
		digest[4 * i + 1] = uint8_t(h_[i] >> 16);
		digest[4 * i + 2] = uint8_t(h_[i] >> 8);
		digest[4 * i + 3] = uint8_t(h_[i]);
	}
}

void
UuidV5(const uint8_t ns[kUuidBytes], const void *const *name_parts, const size_t *part_lengths,
       size_t n_parts, uint8_t out[kUuidBytes]) noexcept {
	Sha1 sha;
	sha.Update(ns, kUuidBytes);
	for (size_t i = 0; i < n_parts; i++) {
		sha.Update(name_parts[i], part_lengths[i]);
	}
	uint8_t digest[20];
	sha.Finish(digest);
	memcpy(out, digest, kUuidBytes);
	out[6] = uint8_t((out[6] & 0x0F) | 0x50); // version 5
	out[8] = uint8_t((out[8] & 0x3F) | 0x80); // variant 10xx
}

size_t
NetstringPrefix(size_t length, char *buf) noexcept {
	int n = snprintf(buf, 24, "%zu:", length);
	return n < 0 ? 0 : size_t(n);
}

} // namespace outbox
