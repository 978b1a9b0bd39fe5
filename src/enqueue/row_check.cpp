// outbox.events_row_check(...): the rules of an outbox.events row (docs/sql-api.md "The table"), all in one
// CHECK constraint of 0.3.0's table, events_row_check; on 0.4.0 the ring members' stamp trigger
// applies the same rules (CheckMemberRow, below). enqueue writes only rows that pass; the rules
// stop rows written by hand that the relay could not publish or would misorder.
//
// One C function rather than a CHECK per rule: PostgreSQL builds every CHECK expression of a
// table again for each INSERT and UPDATE statement (ExecRelCheck), so thirteen expression CHECKs
// cost a one-row INSERT, enqueue's, several times the row itself (bench/RESULTS.md). A broken
// rule raises check_violation with the name each rule had as a constraint of its own, checked in
// the order PostgreSQL applied those (by name), so the error a row gets is the one it got. The
// members have no CHECK at all: even one expression is parsed again from the catalog at every
// statement's executor start, while the trigger runs anyway for every row (generation_stamp.cpp).
//
// The rules live in this library, not in the catalog: PostgreSQL does not validate existing rows
// again when the library changes. A release that makes a rule stricter must ship an update
// script that drops and adds events_row_check again (validating every row), or a pending row that
// no longer passes would fail the relay's record after Kafka has acked it. (The members' rows are
// never updated and leave with their member's TRUNCATE; the relay checks every row it claims.)
#include "enqueue/row_check.hpp"

#include "shared/boundary.hpp"
#include "shared/cloudevents.hpp"
#include "shared/kafka_names.hpp"
#include "enqueue/event_id.hpp"
#include "enqueue/queue_target.hpp"

namespace {

constexpr int kMaxAttempts = 1000000;

// Where a row is checked: 0.3.0's table (its CHECK; the error as PostgreSQL's own for a
// constraint named after the rule) or a ring member (its stamp trigger; the error names the member
// and the column).
struct Site {
	const char *member; // nullptr: 0.3.0's CHECK
};

[[noreturn]] void
Violates(const Site &site, const char *rule, const char *column, const char *detail) {
	const char *table = site.member ? site.member : "events";
	ereport(ERROR,
	        (errcode(ERRCODE_CHECK_VIOLATION),
	         site.member ? errmsg("new row for relation \"%s\" violates the outbox row rule \"%s\" on column \"%s\"",
	                              table, rule, column)
	                     : errmsg("new row for relation \"events\" violates check constraint \"%s\"", rule),
	         errdetail("%s", detail),
	         site.member ? errhint("outbox.enqueue() writes only rows that pass; docs/sql-api.md \"The table\" lists the "
	                               "rules for rows written by hand (on 0.4.0 the ring member's trigger \"~outbox_stamp\" "
	                               "applies them).")
	                     : errhint("outbox.enqueue() writes only rows that pass; docs/sql-api.md \"The table\" lists the "
	                               "rules for rows written by hand."),
	         err_generic_string(PG_DIAG_SCHEMA_NAME, "outbox"), err_generic_string(PG_DIAG_TABLE_NAME, table),
	         err_generic_string(PG_DIAG_COLUMN_NAME, column), err_generic_string(PG_DIAG_CONSTRAINT_NAME, rule)));
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

// The arguments, in the order of 0.3.0's CHECK.
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

// A row's values by Arg, as the CHECK passes them (detoasted when read).
struct Row {
	Datum values[kArgCount];
	bool nulls[kArgCount];

	bool Given(int arg) const { return !nulls[arg]; }
	text *Text(int arg) const { return nulls[arg] ? nullptr : DatumGetTextPP(values[arg]); }
	bool Finite(int arg) const { return nulls[arg] || !TIMESTAMP_NOT_FINITE(DatumGetTimestampTz(values[arg])); }
};

// The rules, in the order of their names. (On a member, the rules of status, attempts and the
// outcome columns cannot fire: CheckMemberRow passes what a member row always is.)
void
CheckRow(const Row &row, const Site &site) {
	text *status = row.Text(kStatus);
	text *key = row.Text(kKey);
	Jsonb *headers = row.Given(kHeaders) ? DatumGetJsonbP(row.values[kHeaders]) : nullptr;
	HeaderFacts facts = headers ? ScanHeaders(headers) : HeaderFacts{};

	if (row.Given(kAttempts) &&
	    (DatumGetInt32(row.values[kAttempts]) < 0 || DatumGetInt32(row.values[kAttempts]) > kMaxAttempts)) {
		Violates(site, "events_attempts_check", "attempts", "attempts must be between 0 and 1000000.");
	}
	if (!row.Given(kCeContentType)) {
		if (row.Given(kCeType) || row.Given(kCeSource)) {
			Violates(site, "events_cloudevent_check", row.Given(kCeType) ? "ce_type" : "ce_source",
			         "ce_type and ce_source are set on CloudEvents only, with ce_content_type.");
		}
	} else {
		const char *empty = Empty(row.Text(kCeContentType))                     ? "ce_content_type"
		                    : row.Given(kCeType) && Empty(row.Text(kCeType))     ? "ce_type"
		                    : row.Given(kCeSource) && Empty(row.Text(kCeSource)) ? "ce_source"
		                                                                         : nullptr;
		if (empty) {
			Violates(site, "events_cloudevent_check", empty,
			         "A CloudEvent's ce_content_type, ce_type and ce_source must not be empty.");
		}
		if (facts.envelope_name) {
			Violates(site, "events_cloudevent_check", "headers",
			         "A CloudEvent's headers must not name ce_* or content-type: the relay writes those itself.");
		}
	}
	if (headers) {
		if (!facts.object || !facts.string_values || facts.event_id) {
			Violates(site, "events_headers_check", "headers",
			         "headers must be NULL or a JSON object of string values without an \"event_id\" key.");
		}
	}
	bool bad_partition = row.Given(kKafkaPartition) && DatumGetInt32(row.values[kKafkaPartition]) < 0;
	if (bad_partition || (row.Given(kKafkaOffset) && DatumGetInt64(row.values[kKafkaOffset]) < 0)) {
		Violates(site, "events_kafka_position_check", bad_partition ? "kafka_partition" : "kafka_offset",
		         "kafka_partition and kafka_offset must not be negative.");
	}
	if (key && VARSIZE_ANY_EXHDR(key) > size_t(outbox::kMaxKeyBytes)) {
		Violates(site, "events_key_length_check", "key", "A key is at most 2048 bytes.");
	}
	int lane = row.Given(kLane) ? DatumGetInt16(row.values[kLane]) : 0;
	if (row.Given(kLane) && (lane < 0 || lane >= outbox::kLaneCount)) {
		Violates(site, "events_lane_check", "lane", "lane must be between 0 and 1023.");
	}
	if (row.Given(kLane) && (key || row.Given(kEventId))) {
		int expected = outbox::LaneOfEvent(key ? VARDATA_ANY(key) : nullptr, key ? VARSIZE_ANY_EXHDR(key) : 0,
		                                   key ? nullptr : DatumGetUUIDP(row.values[kEventId])->data);
		if (lane != expected) {
			Violates(site, "events_lane_of_key_check", "lane", "lane must be outbox.lane_of(key, event_id).");
		}
	}
	if (status && TextIs(status, "published") != row.Given(kPublishedAt)) {
		Violates(site, "events_published_check", "published_at",
		         "published_at is set when, and only when, status is 'published'.");
	}
	if (status && !TextIs(status, "pending") && !TextIs(status, "in_flight") && !TextIs(status, "published") &&
	    !TextIs(status, "failed")) {
		Violates(site, "events_status_check", "status", "status must be 'pending', 'in_flight', 'published' or 'failed'.");
	}
	if (row.Given(kTargetPartition) && DatumGetInt32(row.values[kTargetPartition]) < 0) {
		Violates(site, "events_target_partition_check", "target_partition", "target_partition must not be negative.");
	}
	const char *infinite = !row.Finite(kCreatedAt)       ? "created_at"
	                       : !row.Finite(kNextAttemptAt) ? "next_attempt_at"
	                       : !row.Finite(kClaimedAt)     ? "claimed_at"
	                       : !row.Finite(kPublishedAt)   ? "published_at"
	                                                     : nullptr;
	if (infinite) {
		Violates(site, "events_times_check", infinite,
		         "created_at, next_attempt_at, claimed_at and published_at must be finite.");
	}
	if (!DatumGetBool(row.values[kHasPayload]) && !key) {
		Violates(site, "events_tombstone_check", "payload", "An event without a payload (a tombstone) needs a key.");
	}
	if (!row.Given(kTopic)) {
		return; // NOT NULL says so
	}
	text *topic = row.Text(kTopic);
	if (const char *problem = outbox::TopicNameProblem(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic))) {
		Violates(site, "events_topic_check", "topic", psprintf("Kafka refuses the topic name: %s.", problem));
	}
}

// A member's columns that the rules read, by Arg (the others are what a member row always is).
struct MemberColumn {
	Arg arg;
	const char *name;
	Oid type;
};
constexpr MemberColumn kMemberColumns[] = {
    {kLane, "lane", INT2OID},
    {kKey, "key", TEXTOID},
    {kEventId, "event_id", UUIDOID},
    {kTopic, "topic", TEXTOID},
    {kHeaders, "headers", JSONBOID},
    {kHasPayload, "payload", BYTEAOID},
    {kCreatedAt, "created_at", TIMESTAMPTZOID},
    {kTargetPartition, "target_partition", INT4OID},
    {kCeContentType, "ce_content_type", TEXTOID},
    {kCeType, "ce_type", TEXTOID},
    {kCeSource, "ce_source", TEXTOID},
};

} // namespace

namespace outbox {

void
CheckMemberRow(Relation rel, HeapTuple tuple) {
	TupleDesc desc = RelationGetDescr(rel);
	auto *values = static_cast<Datum *>(palloc(sizeof(Datum) * desc->natts));
	auto *nulls = static_cast<bool *>(palloc(sizeof(bool) * desc->natts));
	heap_deform_tuple(tuple, desc, values, nulls);
	CheckMemberValues(rel, values, nulls);
}

void
CheckMemberValues(Relation rel, const Datum *values, const bool *nulls) {
	Row row;
	for (int i = 0; i < kArgCount; i++) {
		row.values[i] = Datum(0);
		row.nulls[i] = true;
	}
	// A member row is pending, never attempted, without outcome (DESIGN.md "The insert-only queue").
	row.values[kStatus] = CStringGetTextDatum("pending");
	row.nulls[kStatus] = false;
	row.values[kAttempts] = Int32GetDatum(0);
	row.nulls[kAttempts] = false;
	TupleDesc desc = RelationGetDescr(rel);
	for (const MemberColumn &column : kMemberColumns) {
		int attnum = SPI_fnumber(desc, column.name);
		if (attnum <= 0 || TupleDescAttr(desc, attnum - 1)->atttypid != column.type) {
			ereport(ERROR, (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
			                errmsg("outbox: table \"%s\" has no column %s of type %s", RelationGetRelationName(rel),
			                       column.name, format_type_be(column.type)),
			                errhint("The trigger outbox_generation_stamp is for the extension's generation tables only.")));
		}
		bool null = nulls[attnum - 1];
		Datum value = values[attnum - 1];
		if (column.arg == kHasPayload) { // the CHECK's `payload IS NOT NULL`
			row.values[kHasPayload] = BoolGetDatum(!null);
			row.nulls[kHasPayload] = false;
			continue;
		}
		row.values[column.arg] = value;
		row.nulls[column.arg] = null;
	}
	CheckRow(row, Site{RelationGetRelationName(rel)});
	// Schema 0.4.1's caller_event_id (a 0.4.0 member has none): false says enqueue generated the
	// id, and takes the row out of the member's unique index on event_id (WHERE caller_event_id),
	// so out of dedup. Only an id with enqueue's mark (event_id.hpp) may say so, whoever writes
	// the row: no caller's id carries the mark (enqueue and the view refuse one), so a row written
	// by hand cannot take a caller's id out of dedup. A marked id with true is one enqueue made
	// before the update to 0.4.1 (its row kept its entry), or a restored 0.4.0 dump's: indexed.
	int caller_att = SPI_fnumber(desc, outbox::kCallerEventIdColumn);
	if (caller_att > 0 && TupleDescAttr(desc, caller_att - 1)->atttypid == BOOLOID && !nulls[caller_att - 1] &&
	    !DatumGetBool(values[caller_att - 1]) && row.Given(kEventId) &&
	    !outbox::IsGeneratedUuid(DatumGetUUIDP(row.values[kEventId])->data)) {
		Violates(Site{RelationGetRelationName(rel)}, "events_generated_event_id_check", outbox::kCallerEventIdColumn,
		         "caller_event_id is false only for an event_id outbox.enqueue() generated (version 8, "
		         "...-80b0-...); leave it out (true: the id is deduplicated) for a row written by hand.");
	}
}

} // namespace outbox

OUTBOX_SQL_FUNCTION(outbox_events_row_check) {
	if (PG_NARGS() != kArgCount) {
		elog(ERROR, "outbox.events_row_check: %d arguments, expected %d", PG_NARGS(), int(kArgCount));
	}
	Row row;
	for (int i = 0; i < kArgCount; i++) {
		row.values[i] = PG_GETARG_DATUM(i);
		row.nulls[i] = PG_ARGISNULL(i);
	}
	if (row.nulls[kHasPayload]) { // `payload IS NOT NULL` never is
		row.values[kHasPayload] = BoolGetDatum(false);
	}
	CheckRow(row, Site{nullptr});
	PG_RETURN_BOOL(true);
}
