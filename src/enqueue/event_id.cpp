// RFC 9562 UUID version 5. The SHA-1 is PostgreSQL's own (common/cryptohash.h: OpenSSL's when the
// server is built with it, else its built-in one); test vectors in sql/event_id.sql pin the ids.
// Postgres code: only plain data on the stack (a failing hash raises an ERROR; the server's
// resource owner frees the hash context then).
#include "enqueue/event_id.hpp"

#include "shared/pg_include.hpp"

extern "C" {
#include "common/cryptohash.h"
#include "common/sha1.h" // SHA1_DIGEST_LENGTH
}

namespace outbox {

const uint8_t kEventIdNamespace[kUuidBytes] = {0xd4, 0xe3, 0xf0, 0x8c, 0x32, 0xf8, 0x4d, 0x92,
                                                0x84, 0x4f, 0xad, 0xce, 0xd4, 0xc5, 0xbf, 0xb1};

namespace {

[[noreturn]] void
HashFailed(pg_cryptohash_ctx *ctx) {
#if PG_VERSION_NUM >= 150000
	const char *reason = pstrdup(pg_cryptohash_error(ctx));
#else
	const char *reason = "SHA-1 failed";
#endif
	pg_cryptohash_free(ctx);
	ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("could not compute an event id: %s", reason)));
	pg_unreachable();
}

} // namespace

void
UuidV5(const uint8_t ns[kUuidBytes], const void *const *name_parts, const size_t *part_lengths, size_t n_parts,
       uint8_t out[kUuidBytes]) {
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA1);
	if (ctx == nullptr) {
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	}
	if (pg_cryptohash_init(ctx) < 0 || pg_cryptohash_update(ctx, ns, kUuidBytes) < 0) {
		HashFailed(ctx);
	}
	for (size_t i = 0; i < n_parts; i++) {
		if (pg_cryptohash_update(ctx, static_cast<const uint8 *>(name_parts[i]), part_lengths[i]) < 0) {
			HashFailed(ctx);
		}
	}
	uint8 digest[SHA1_DIGEST_LENGTH];
	if (pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0) {
		HashFailed(ctx);
	}
	pg_cryptohash_free(ctx);
	memcpy(out, digest, kUuidBytes);
	out[6] = uint8_t((out[6] & 0x0F) | 0x50); // version 5
	out[8] = uint8_t((out[8] & 0x3F) | 0x80); // variant 10xx
}

void
GeneratedUuid(uint64_t unix_ms, const uint8_t random[8], uint8_t out[kUuidBytes]) {
	for (int i = 0; i < 6; i++) {
		out[i] = uint8_t(unix_ms >> (8 * (5 - i)));
	}
	out[6] = uint8_t(0x80 | (kGeneratedIdMark >> 8)); // version 8, then the mark's 12 bits
	out[7] = uint8_t(kGeneratedIdMark & 0xFF);
	memcpy(out + 8, random, 8);
	out[8] = uint8_t((out[8] & 0x3F) | 0x80); // variant 10xx
}

size_t
NetstringPrefix(size_t length, char *buf) {
	int n = snprintf(buf, 24, "%zu:", length);
	return n < 0 ? 0 : size_t(n);
}

} // namespace outbox
