// SQL entry points of the deterministic event ids (the hashing itself is in event_id.cpp).
#include "shared/boundary.hpp"
#include "enqueue/event_id.hpp"

namespace {

// Text arguments are hashed as UTF-8, whatever the database encoding, so ids match other
// languages' uuid5() over the same strings.
const char *
Utf8Of(text *t, size_t *len) {
	const char *data = VARDATA_ANY(t);
	int n = VARSIZE_ANY_EXHDR(t);
	const char *utf8 = pg_server_to_any(data, n, PG_UTF8);
	*len = utf8 == data ? size_t(n) : strlen(utf8);
	return utf8;
}

void
RequireArgument(FunctionCallInfo fcinfo, int arg, const char *name) {
	if (PG_ARGISNULL(arg)) {
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("%s must not be NULL", name),
		                errhint("A NULL part would give every replay a different id; pass an empty string if "
		                        "the part is empty.")));
	}
}

Datum
ReturnUuid(const uint8_t bytes[outbox::kUuidBytes]) {
	pg_uuid_t *out = static_cast<pg_uuid_t *>(palloc(sizeof(pg_uuid_t)));
	memcpy(out->data, bytes, UUID_LEN);
	return UUIDPGetDatum(out);
}

} // namespace

// outbox.event_id(namespace uuid, name text): plain RFC 9562 version 5.
OUTBOX_SQL_FUNCTION(outbox_uuid_v5) {
	RequireArgument(fcinfo, 0, "namespace");
	RequireArgument(fcinfo, 1, "name");
	pg_uuid_t *ns = PG_GETARG_UUID_P(0);
	size_t len;
	const void *parts[1];
	parts[0] = Utf8Of(PG_GETARG_TEXT_PP(1), &len);
	size_t lengths[1] = {len};
	uint8_t out[outbox::kUuidBytes];
	outbox::UuidV5(ns->data, parts, lengths, 1, out);
	return ReturnUuid(out);
}

// outbox.event_id(aggregate text, discriminator text): version 5 under the outbox namespace of
// netstring(aggregate) || netstring(discriminator).
OUTBOX_SQL_FUNCTION(outbox_event_id) {
	RequireArgument(fcinfo, 0, "aggregate");
	RequireArgument(fcinfo, 1, "discriminator");
	size_t aggregate_len, discriminator_len;
	const char *aggregate = Utf8Of(PG_GETARG_TEXT_PP(0), &aggregate_len);
	const char *discriminator = Utf8Of(PG_GETARG_TEXT_PP(1), &discriminator_len);
	char aggregate_prefix[24], discriminator_prefix[24];
	const void *parts[6] = {aggregate_prefix, aggregate, ",", discriminator_prefix, discriminator, ","};
	size_t lengths[6] = {outbox::NetstringPrefix(aggregate_len, aggregate_prefix),
	                     aggregate_len,
	                     1,
	                     outbox::NetstringPrefix(discriminator_len, discriminator_prefix),
	                     discriminator_len,
	                     1};
	uint8_t out[outbox::kUuidBytes];
	outbox::UuidV5(outbox::kEventIdNamespace, parts, lengths, 6, out);
	return ReturnUuid(out);
}
