// outbox.events_row_check(...): the rules of an outbox.events row (docs/sql-api.md "The table"), all in one
// CHECK constraint, events_row_check. enqueue writes only rows that pass; the rules stop rows
// written by hand that the relay could not publish or would misorder.
//
// One C function rather than a CHECK per rule: PostgreSQL builds every CHECK expression of a
// table again for each INSERT and UPDATE statement (ExecRelCheck), so thirteen expression CHECKs
// cost a one-row INSERT, enqueue's, several times the row itself (bench/RESULTS.md). A broken
// rule raises check_violation with the name each rule had as a constraint of its own, checked in
// the order PostgreSQL applied those (by name), so the error a row gets is the one it got.
//
// The rules live in this library, not in the catalog: PostgreSQL does not validate existing rows
// again when the library changes. A release that makes a rule stricter must ship an update
// script that drops and adds events_row_check again (validating every row), or a pending row that
// no longer passes would fail the relay's record after Kafka has acked it.
#include "shared/boundary.hpp"
#include "shared/cloudevents.hpp"
#include "shared/kafka_names.hpp"

namespace {

constexpr int kMaxAttempts = 1000000;

[[noreturn]] void
Violates(const char *rule, const char *detail) {
	ereport(ERROR, (errcode(ERRCODE_CHECK_VIOLATION),
	                errmsg("new row for relation \"events\" violates check constraint \"%s\"", rule),
	                errdetail("%s", detail),
	                errhint("outbox.enqueue() writes only rows that pass; docs/sql-api.md \"The table\" lists the rules for rows "
	                        "written by hand."),
	                err_generic_string(PG_DIAG_SCHEMA_NAME, "outbox"),
	                err_generic_string(PG_DIAG_TABLE_NAME, "events"),
	                err_generic_string(PG_DIAG_CONSTRAINT_NAME, rule)));
	pg_unreachable();
}

bool
TextIs(text *t, const char *s) {
	size_t len = strlen(s);
	return VARSIZE_ANY_EXHDR(t) == len && memcmp(VARDATA_ANY(t), s, len) == 0;
}

bool
Empty(text *t) {
	return VARSIZE_ANY_EXHDR(t) == 0;
}

// What the rules ask of headers, from one pass over the top-level entries (nested values are not
// entered).
struct HeaderFacts {
	bool object = false;
	bool string_values = true;
	bool event_id = false;
	bool envelope_name = false; // ce_*, content-type
};

HeaderFacts
ScanHeaders(Jsonb *headers) {
	HeaderFacts facts;
	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers)) {
		return facts;
	}
	facts.object = true;
	JsonbIterator *it = JsonbIteratorInit(&headers->root);
	JsonbValue v;
	JsonbIteratorToken token;
	while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE) {
		if (token == WJB_KEY) {
			const char *name = v.val.string.val;
			size_t len = size_t(v.val.string.len);
			facts.event_id |= len == strlen(outbox::kEventIdHeader) && memcmp(name, outbox::kEventIdHeader, len) == 0;
			facts.envelope_name |= outbox::cloudevents::IsEnvelopeHeader(name, len);
		} else if (token == WJB_VALUE) {
			facts.string_values &= v.type == jbvString;
		}
	}
	return facts;
}

bool
Given(FunctionCallInfo fcinfo, int arg) {
	return !PG_ARGISNULL(arg);
}

bool
Finite(FunctionCallInfo fcinfo, int arg) {
	return PG_ARGISNULL(arg) || !TIMESTAMP_NOT_FINITE(PG_GETARG_TIMESTAMPTZ(arg));
}

// The arguments, in the order of the CHECK in the update script.
enum Arg {
	kStatus,
	kLane,
	kKey,
	kEventId,
	kTopic,
	kHeaders,
	kHasPayload,
	kAttempts,
	kCreatedAt,
	kNextAttemptAt,
	kClaimedAt,
	kPublishedAt,
	kKafkaPartition,
	kKafkaOffset,
	kTargetPartition,
	kCeContentType,
	kCeType,
	kCeSource,
	kArgCount
};

} // namespace

OUTBOX_SQL_FUNCTION(outbox_events_row_check) {
	if (PG_NARGS() != kArgCount) {
		elog(ERROR, "outbox.events_row_check: %d arguments, expected %d", PG_NARGS(), int(kArgCount));
	}
	text *status = Given(fcinfo, kStatus) ? PG_GETARG_TEXT_PP(kStatus) : nullptr;
	text *key = Given(fcinfo, kKey) ? PG_GETARG_TEXT_PP(kKey) : nullptr;
	Jsonb *headers = Given(fcinfo, kHeaders) ? PG_GETARG_JSONB_P(kHeaders) : nullptr;
	HeaderFacts facts = headers ? ScanHeaders(headers) : HeaderFacts{};

	if (Given(fcinfo, kAttempts) && (PG_GETARG_INT32(kAttempts) < 0 || PG_GETARG_INT32(kAttempts) > kMaxAttempts)) {
		Violates("events_attempts_check", "attempts must be between 0 and 1000000.");
	}
	if (!Given(fcinfo, kCeContentType)) {
		if (Given(fcinfo, kCeType) || Given(fcinfo, kCeSource)) {
			Violates("events_cloudevent_check",
			         "ce_type and ce_source are set on CloudEvents only, with ce_content_type.");
		}
	} else {
		bool empty = Empty(PG_GETARG_TEXT_PP(kCeContentType)) ||
		             (Given(fcinfo, kCeType) && Empty(PG_GETARG_TEXT_PP(kCeType))) ||
		             (Given(fcinfo, kCeSource) && Empty(PG_GETARG_TEXT_PP(kCeSource)));
		if (empty) {
			Violates("events_cloudevent_check",
			         "A CloudEvent's ce_content_type, ce_type and ce_source must not be empty.");
		}
		if (facts.envelope_name) {
			Violates("events_cloudevent_check",
			         "A CloudEvent's headers must not name ce_* or content-type: the relay writes those itself.");
		}
	}
	if (headers) {
		if (!facts.object || !facts.string_values || facts.event_id) {
			Violates("events_headers_check",
			         "headers must be NULL or a JSON object of string values without an \"event_id\" key.");
		}
	}
	if ((Given(fcinfo, kKafkaPartition) && PG_GETARG_INT32(kKafkaPartition) < 0) ||
	    (Given(fcinfo, kKafkaOffset) && PG_GETARG_INT64(kKafkaOffset) < 0)) {
		Violates("events_kafka_position_check", "kafka_partition and kafka_offset must not be negative.");
	}
	if (key && VARSIZE_ANY_EXHDR(key) > size_t(outbox::kMaxKeyBytes)) {
		Violates("events_key_length_check", "A key is at most 2048 bytes.");
	}
	int lane = Given(fcinfo, kLane) ? PG_GETARG_INT16(kLane) : 0;
	if (Given(fcinfo, kLane) && (lane < 0 || lane >= outbox::kLaneCount)) {
		Violates("events_lane_check", "lane must be between 0 and 1023.");
	}
	if (Given(fcinfo, kLane) && (key || Given(fcinfo, kEventId))) {
		int expected = outbox::LaneOfEvent(key ? VARDATA_ANY(key) : nullptr, key ? VARSIZE_ANY_EXHDR(key) : 0,
		                                   key ? nullptr : PG_GETARG_UUID_P(kEventId)->data);
		if (lane != expected) {
			Violates("events_lane_of_key_check", "lane must be outbox.lane_of(key, event_id).");
		}
	}
	if (status && TextIs(status, "published") != Given(fcinfo, kPublishedAt)) {
		Violates("events_published_check", "published_at is set when, and only when, status is 'published'.");
	}
	if (status && !TextIs(status, "pending") && !TextIs(status, "in_flight") && !TextIs(status, "published") &&
	    !TextIs(status, "failed")) {
		Violates("events_status_check", "status must be 'pending', 'in_flight', 'published' or 'failed'.");
	}
	if (Given(fcinfo, kTargetPartition) && PG_GETARG_INT32(kTargetPartition) < 0) {
		Violates("events_target_partition_check", "target_partition must not be negative.");
	}
	if (!Finite(fcinfo, kCreatedAt) || !Finite(fcinfo, kNextAttemptAt) || !Finite(fcinfo, kClaimedAt) ||
	    !Finite(fcinfo, kPublishedAt)) {
		Violates("events_times_check", "created_at, next_attempt_at, claimed_at and published_at must be finite.");
	}
	if (!PG_GETARG_BOOL(kHasPayload) && !key) {
		Violates("events_tombstone_check", "An event without a payload (a tombstone) needs a key.");
	}
	if (!Given(fcinfo, kTopic)) {
		PG_RETURN_BOOL(true); // NOT NULL says so
	}
	text *topic = PG_GETARG_TEXT_PP(kTopic);
	if (const char *problem = outbox::TopicNameProblem(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic))) {
		Violates("events_topic_check", psprintf("Kafka refuses the topic name: %s.", problem));
	}
	PG_RETURN_BOOL(true);
}
