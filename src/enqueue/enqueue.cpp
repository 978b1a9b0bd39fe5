// outbox.enqueue(): validate, insert in the caller's transaction, and wake the relay worker that
// owns the key when (and only when) that transaction commits.
#include "shared/boundary.hpp"
#include "shared/cloudevent_attributes.hpp"
#include "shared/cloudevent_source.hpp"
#include "shared/cloudevents.hpp"
#include "enqueue/commit_order.hpp"
#include "enqueue/commit_wake.hpp"
#include "enqueue/event_id.hpp"
#include "enqueue/member_insert.hpp"
#include "enqueue/queue_target.hpp"
#include "enqueue/ring_dedup.hpp"
#include "shared/guc.hpp"
#include "shared/kafka_names.hpp"
#include "shared/shmem.hpp"
#include "enqueue/trace_context.hpp"

#ifdef __linux__
#include <sys/random.h>
#endif
#include <time.h>

namespace {

enum class PayloadKind { Jsonb, Text, Bytea };

constexpr int64 kHeaderFramingBytes = 10;

void
InvalidInput(int sqlstate, const char *message, const char *detail, const char *hint) {
	ereport(ERROR, (errcode(sqlstate), errmsg("%s", message), detail ? errdetail("%s", detail) : 0,
	                hint ? errhint("%s", hint) : 0));
}

void
ValidateTopic(text *topic) {
	const char *name = VARDATA_ANY(topic);
	int len = VARSIZE_ANY_EXHDR(topic);
	if (const char *problem = outbox::TopicNameProblem(name, size_t(len))) {
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                errmsg("invalid Kafka topic name \"%s\"", text_to_cstring(topic)), errdetail("%s.", problem),
		                errhint("Use 1 to 249 characters of [a-zA-Z0-9._-], e.g. 'billing.invoice-events'.")));
	}
	if (!outbox::TopicAllowed(name, len)) {
		ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
		                errmsg("topic \"%s\" is not in outbox.allowed_topics", text_to_cstring(topic)),
		                errhint("The server's outbox.allowed_topics lists the topics events may go to.")));
	}
}

// Text as the UTF-8 bytes Kafka clients expect (the result may be `data` itself). A SQL_ASCII
// database stores any bytes in text: what is not UTF-8 is refused here rather than published.
const char *
Utf8Of(const char *what, const char *data, int len, int *out_len) {
	if (GetDatabaseEncoding() == PG_SQL_ASCII) {
		if (!pg_verify_mbstr(PG_UTF8, data, len, true)) {
			ereport(ERROR, (errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE), errmsg("%s is not valid UTF-8", what),
			                errdetail("The database encoding is SQL_ASCII, which stores any bytes; Kafka records "
			                          "carry UTF-8 text."),
			                errhint("Pass UTF-8 text, or the payload as bytea for binary data.")));
		}
		*out_len = len;
		return data;
	}
	// Raises "character has no equivalent in UTF8" for a character without a mapping.
	const char *utf8 = pg_server_to_any(data, len, PG_UTF8);
	*out_len = utf8 == data ? len : int(strlen(utf8));
	return utf8;
}

// What enqueue's envelope rules need to know about the headers it was given.
struct HeaderFacts {
	bool traceparent;     // a traceparent header (valid: checked here)
	bool tracestate;      // a tracestate header (valid: checked here)
	bool envelope_header; // a ce_* or content-type header
};

bool
NameIs(const JsonbValue &v, const char *name) {
	return v.val.string.len == int(strlen(name)) && memcmp(v.val.string.val, name, v.val.string.len) == 0;
}

// A traceparent or tracestate, from a header, an argument or the session: refused unless valid.
void
ValidateTraceValue(const char *what, const char *value, int len, bool traceparent) {
	const char *problem = traceparent ? outbox::TraceparentProblem(value, size_t(len))
	                                  : outbox::TracestateProblem(value, size_t(len));
	if (problem) {
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                errmsg("%s is not a valid W3C %s", what, traceparent ? "traceparent" : "tracestate"),
		                errdetail("%s.", problem),
		                traceparent ? errhint("Pass the traceparent of the current span, e.g. "
		                                      "'00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'.")
		                            : errhint("Pass key=value members separated by commas, e.g. 'vendor=value'.")));
	}
}

// Headers: NULL, or a JSON object whose values are all strings.
void
ValidateHeaders(Jsonb *headers, int64 *bytes, HeaderFacts *facts) {
	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers)) {
		InvalidInput(ERRCODE_INVALID_PARAMETER_VALUE, "headers must be a JSON object of string values", nullptr,
		             "Pass e.g. '{\"trace_id\": \"abc\"}'::jsonb, or NULL for no headers.");
	}
	JsonbIterator *it = JsonbIteratorInit(&headers->root);
	JsonbValue v;
	JsonbIteratorToken token;
	bool expect_value = false;
	int trace_field = 0; // 1: the value is a traceparent, 2: a tracestate
	while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE) {
		if (token == WJB_KEY) {
			if (NameIs(v, outbox::kEventIdHeader)) {
				InvalidInput(ERRCODE_INVALID_PARAMETER_VALUE, "header \"event_id\" is reserved",
				             "The relay sets the event_id header on every record itself.",
				             "Pass the id as the event_id argument instead.");
			}
			trace_field = NameIs(v, outbox::kTraceparentHeader) ? 1 : NameIs(v, outbox::kTracestateHeader) ? 2 : 0;
			facts->traceparent |= trace_field == 1;
			facts->tracestate |= trace_field == 2;
			facts->envelope_header |=
			    outbox::cloudevents::NamesEnvelopeAttribute(v.val.string.val, size_t(v.val.string.len));
			int ignored;
			Utf8Of("a header name", v.val.string.val, v.val.string.len, &ignored);
			// A Kafka record header is framed by two varints (up to 5 bytes each): counted, so
			// that many small headers cannot make a record larger than the limit says.
			*bytes += v.val.string.len + kHeaderFramingBytes;
			expect_value = true;
		} else if (token == WJB_VALUE && expect_value) {
			if (v.type != jbvString) {
				InvalidInput(ERRCODE_INVALID_PARAMETER_VALUE, "headers must be a JSON object of string values",
				             "A header value is not a JSON string.",
				             "Kafka headers are byte strings: convert numbers and objects to text first.");
			}
			if (trace_field != 0) {
				ValidateTraceValue(trace_field == 1 ? "header \"traceparent\"" : "header \"tracestate\"",
				                   v.val.string.val, v.val.string.len, trace_field == 1);
			}
			int ignored;
			Utf8Of("a header value", v.val.string.val, v.val.string.len, &ignored);
			*bytes += v.val.string.len;
			expect_value = false;
		}
	}
}

// The payload as the bytes the relay will publish: jsonb and text as UTF-8, bytea as is.
bytea *
PayloadBytes(Datum payload, PayloadKind kind) {
	const char *data;
	int len;
	switch (kind) {
	case PayloadKind::Bytea:
		return DatumGetByteaPP(payload);
	case PayloadKind::Jsonb: {
		Jsonb *jb = DatumGetJsonbP(payload);
		data = JsonbToCString(nullptr, &jb->root, VARSIZE(jb));
		len = int(strlen(data));
		break;
	}
	case PayloadKind::Text: {
		text *t = DatumGetTextPP(payload);
		data = VARDATA_ANY(t);
		len = VARSIZE_ANY_EXHDR(t);
		break;
	}
	}
	const char *utf8 = Utf8Of("the payload", data, len, &len);
	bytea *out = static_cast<bytea *>(palloc(VARHDRSZ + len));
	SET_VARSIZE(out, VARHDRSZ + len);
	memcpy(VARDATA(out), utf8, len);
	return out;
}

// The kernel's CSPRNG straight (getrandom(2), one system call), where PostgreSQL's
// pg_strong_random asks OpenSSL for its status and then its bytes at every call, several times
// the cost for the 16 bytes of an id; elsewhere pg_strong_random.
bool
RandomBytes(uint8 *buf, size_t len) {
#ifdef __linux__
	if (getrandom(buf, len, 0) == ssize_t(len)) {
		return true;
	}
#endif
	return pg_strong_random(buf, len);
}

// The id of an event the caller named none (event_id.hpp GeneratedUuid): time-ordered, so where
// it is indexed (0.3.0's table, a 0.4.0 member) the index grows at its right edge like an
// identity's; marked as enqueue's, so it cannot come back as a caller's id (RefuseGeneratedCallerId);
// 62 random bits tell apart the ids of one millisecond.
void
GeneratedEventId(uint8 out[UUID_LEN]) {
	struct timespec now;
	if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("could not read the clock for an event id: %m")));
	}
	uint8 random[8];
	if (!RandomBytes(random, sizeof(random))) {
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("could not generate a random event id")));
	}
	uint64 unix_ms = uint64(now.tv_sec) * 1000 + uint64(now.tv_nsec) / 1000000;
	outbox::GeneratedUuid(unix_ms, random, out);
}

// The INSERT statement of a generated id. While a schema update is under way it may reach the
// view, whose INSERT trigger must take this id (ring_dedup.hpp EnqueueWritesGeneratedId): noted
// for the statement only, an error included.
int
ExecuteWritingGeneratedId(SPIPlanPtr plan, Datum *values, const char *nulls, const pg_uuid_t *event_id) {
	volatile int rc = 0;
	outbox::EnqueueWritesGeneratedId(event_id);
	PG_TRY();
	{
		rc = SPI_execute_plan(plan, values, nulls, false, 0);
	}
	PG_FINALLY();
	{
		outbox::EnqueueWritesGeneratedId(nullptr);
	}
	PG_END_TRY();
	return rc;
}

// Two statements: ON CONFLICT DO NOTHING only where a duplicate can happen, i.e. for an id the
// caller passed. A generated id (GeneratedEventId) cannot collide in practice, and a plain
// INSERT skips the speculative insertion (its conflict pre-check and extra WAL record). On schema
// 0.4.1 (caller_column) a generated id's row says so (caller_event_id false) and gets no entry in
// the member's unique index on event_id, which is partial (WHERE caller_event_id): the caller's
// statement names that predicate, for ON CONFLICT to infer the index and for the probes of the
// other members to use theirs. On 0.4.0's member (a library newer than the schema) and 0.3.0's
// table every id is in the unique index, which would refuse a generated id that collided. On
// 0.4.1 both statements write caller_event_id rather than leave it to the column's default, so a
// changed default cannot take a caller's id out of dedup. Each in two shapes: with the id and commit-order stamp back (0.2.0), or without (a 0.1.0
// table, which has no order_lsn, while an upgrade is under way). And with the envelope columns
// only for an event that uses them (a partition, a CloudEvent), so the others insert as before.
// Into 0.3.0's outbox.events, or on schema 0.4.0 (outbox.events a view) into the current ring
// member, whose stamp trigger sets order_lsn and writer; one set of plans per target, so an ALTER
// EXTENSION UPDATE in this backend switches to the member's (queue_target.hpp notices it).
SPIPlanPtr
InsertPlan(const outbox::QueueTarget &target, bool caller_event_id, bool commit_order, bool envelope) {
	static SPIPlanPtr plans[1 + outbox::kRingMembers][2][2][2][2] = {};
	int member = target.member;
	bool caller_column = member != outbox::kNoMember && target.caller_column;
	int slot = member == outbox::kNoMember ? 0 : 1 + member;
	SPIPlanPtr &plan =
	    plans[slot][caller_column ? 1 : 0][caller_event_id ? 1 : 0][commit_order ? 1 : 0][envelope ? 1 : 0];
	if (plan == nullptr) {
		Oid types[10] = {UUIDOID, TEXTOID, TEXTOID, INT2OID, BYTEAOID, JSONBOID, INT4OID, TEXTOID, TEXTOID, TEXTOID};
		// Dedup of a caller's id across the ring (0.4.0): the other members are probed too (their
		// event_id indexes), and event_state (an event that waits or failed keeps its row there
		// after its member was emptied), in the statement's snapshot, so an id is deduplicated
		// while outbox.events shows its event. Left open: two enqueues of one id at once around a
		// rotation, each into another member, both commit (DESIGN.md "Retention").
		StringInfoData probe;
		initStringInfo(&probe);
		if (caller_event_id && member != outbox::kNoMember) {
			const char *tables[outbox::kEventIdTables];
			int n = outbox::EventIdTables(member, tables);
			for (int i = 0; i < n; i++) {
				appendStringInfoString(&probe, i == 0 ? "WHERE NOT EXISTS (" : "AND NOT EXISTS (");
				outbox::AppendEventIdProbe(&probe, tables[i], caller_column);
				appendStringInfoString(&probe, ") ");
			}
		}
		const char *conflict = !caller_event_id ? ""
		                       : caller_column  ? "ON CONFLICT (event_id) WHERE caller_event_id DO NOTHING "
		                                        : "ON CONFLICT (event_id) DO NOTHING ";
		StringInfoData query;
		initStringInfo(&query);
		appendStringInfo(&query, "INSERT INTO outbox.%s (event_id, topic, key, lane, payload, headers%s%s) ",
		                 outbox::RingMemberName(member),
		                 envelope ? ", target_partition, ce_content_type, ce_type, ce_source" : "",
		                 caller_column ? ", caller_event_id" : "");
		appendStringInfo(&query, "%s$1, $2, $3, $4, $5, $6%s%s%s %s%s%s", probe.len > 0 ? "SELECT " : "VALUES (",
		                 envelope ? ", $7, $8, $9, $10" : "",
		                 !caller_column ? "" : caller_event_id ? ", true" : ", false",
		                 probe.len > 0 ? "" : ")", probe.data, conflict, commit_order ? "RETURNING id, order_lsn" : "");
		SPIPlanPtr p = SPI_prepare(query.data, envelope ? 10 : 6, types);
		if (p == nullptr) {
			elog(ERROR, "outbox: could not prepare the enqueue statement: %s", SPI_result_code_string(SPI_result));
		}
		pfree(probe.data);
		pfree(query.data);
		SPI_keepplan(p);
		plan = p;
	}
	return plan;
}

// enqueue's optional arguments since 0.2.0, after event_id (0.1.0's functions have five).
enum EnvelopeArg { kPartitionArg = 5, kTraceparentArg, kTracestateArg, kCloudEventsArg, kEventTypeArg, kEventSourceArg };

bool
ArgGiven(FunctionCallInfo fcinfo, int arg) {
	return PG_NARGS() > arg && !PG_ARGISNULL(arg);
}

text *
OptionalText(FunctionCallInfo fcinfo, int arg) {
	return ArgGiven(fcinfo, arg) ? PG_GETARG_TEXT_PP(arg) : nullptr;
}

// What the row carries besides topic, key, payload and headers (docs/envelopes.md).
struct Envelope {
	bool columns; // the row needs the envelope columns
	bool partition_null;
	int32 partition;
	const char *ce_content_type; // nullptr: not a CloudEvent
	text *ce_type;               // nullptr: the topic, at publish time
	text *ce_source;             // event_source, else the default source now (fixed for the event's life)
	Jsonb *trace_headers;        // traceparent (and tracestate) to add to the headers, or nullptr
};

Jsonb *
TraceHeaders(const char *traceparent, const char *tracestate, int64 *bytes) {
	StringInfoData json;
	initStringInfo(&json);
	appendStringInfoString(&json, "{\"traceparent\": ");
	escape_json(&json, traceparent);
	*bytes += strlen(outbox::kTraceparentHeader) + strlen(traceparent) + kHeaderFramingBytes;
	if (tracestate && tracestate[0]) {
		appendStringInfoString(&json, ", \"tracestate\": ");
		escape_json(&json, tracestate);
		*bytes += strlen(outbox::kTracestateHeader) + strlen(tracestate) + kHeaderFramingBytes;
	}
	appendStringInfoChar(&json, '}');
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data)));
}

// The event's trace context: enqueue's traceparent/tracestate arguments, else its headers' own,
// else the session's outbox.traceparent/outbox.tracestate (valid: their check hooks saw to it).
// A tracestate only ever travels with the traceparent it came with.
Jsonb *
TraceContext(FunctionCallInfo fcinfo, const HeaderFacts &facts, int64 *bytes) {
	text *traceparent = OptionalText(fcinfo, kTraceparentArg);
	text *tracestate = OptionalText(fcinfo, kTracestateArg);
	if (tracestate && !traceparent) {
		InvalidInput(ERRCODE_INVALID_PARAMETER_VALUE, "tracestate needs a traceparent", nullptr,
		             "Pass the traceparent argument too: a tracestate belongs to the trace its traceparent names.");
	}
	if (traceparent) {
		if (facts.traceparent || facts.tracestate) {
			InvalidInput(ERRCODE_INVALID_PARAMETER_VALUE, "the trace context is given twice",
			             "The traceparent argument is given, and the headers have a traceparent or tracestate too.",
			             "Pass it one way: the traceparent and tracestate arguments, or the headers.");
		}
		ValidateTraceValue("traceparent", VARDATA_ANY(traceparent), VARSIZE_ANY_EXHDR(traceparent), true);
		if (tracestate) {
			ValidateTraceValue("tracestate", VARDATA_ANY(tracestate), VARSIZE_ANY_EXHDR(tracestate), false);
		}
		return TraceHeaders(text_to_cstring(traceparent), tracestate ? text_to_cstring(tracestate) : nullptr, bytes);
	}
	if (facts.tracestate && !facts.traceparent) {
		InvalidInput(ERRCODE_INVALID_PARAMETER_VALUE, "header \"tracestate\" needs a traceparent header", nullptr,
		             "Add the traceparent header: a tracestate belongs to the trace its traceparent names.");
	}
	if (facts.traceparent) {
		return nullptr; // the headers carry it
	}
	const char *session_parent = outbox::settings.traceparent, *session_state = outbox::settings.tracestate;
	if (session_parent == nullptr || session_parent[0] == '\0') {
		if (session_state && session_state[0]) {
			InvalidInput(ERRCODE_INVALID_PARAMETER_VALUE, "outbox.tracestate is set but outbox.traceparent is not",
			             nullptr, "SET outbox.traceparent as well, or RESET outbox.tracestate.");
		}
		return nullptr;
	}
	return TraceHeaders(session_parent, session_state, bytes);
}

const char *
ContentTypeOf(PayloadKind kind) {
	switch (kind) {
	case PayloadKind::Jsonb:
		return outbox::cloudevents::kJsonContentType;
	case PayloadKind::Text:
		return outbox::cloudevents::kTextContentType;
	case PayloadKind::Bytea:
		break;
	}
	return outbox::cloudevents::kBinaryContentType;
}

// A CloudEvents attribute given to enqueue: not empty, with a UTF-8 form, and valid as the
// attribute (a source a URI-reference, a type a CloudEvents String). Returns its UTF-8 length.
int
ValidateAttribute(const char *name, text *value, bool source) {
	if (VARSIZE_ANY_EXHDR(value) == 0) {
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s must not be empty", name),
		                errhint("Pass a non-empty value, or NULL for the default.")));
	}
	int len;
	const char *utf8 = Utf8Of(name, VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value), &len);
	const char *problem = source ? outbox::cloudevents::UriReferenceProblem(utf8, size_t(len))
	                             : outbox::cloudevents::StringAttributeProblem(utf8, size_t(len));
	if (problem) {
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                errmsg(source ? "event_source is not a URI-reference" : "event_type is not a CloudEvents String"),
		                errdetail("%s: %s.", source ? "CloudEvents 1.0 requires a URI-reference (RFC 3986)"
		                                            : "CloudEvents 1.0 Strings exclude it",
		                          problem),
		                source ? errhint("Pass e.g. 'https://billing.example.com/invoices', 'urn:billing:invoices' or "
		                                 "'/billing/invoices'; percent-encode other characters (a space is %%20).")
		                       : errhint("Pass a type such as 'com.example.invoice.paid'.")));
	}
	return len;
}

// Whether the event is a CloudEvent (the cloudevents argument, else outbox.cloudevents_topics),
// and its attributes. The relay writes the ce_* headers when it publishes it.
void
CloudEvent(FunctionCallInfo fcinfo, text *topic, PayloadKind kind, const HeaderFacts &facts, Envelope *env,
           int64 *bytes) {
	bool explicit_choice = ArgGiven(fcinfo, kCloudEventsArg);
	bool cloudevent = explicit_choice ? PG_GETARG_BOOL(kCloudEventsArg)
	                                  : outbox::TopicListed(outbox::settings.cloudevents_topics, VARDATA_ANY(topic),
	                                                        VARSIZE_ANY_EXHDR(topic));
	text *type = OptionalText(fcinfo, kEventTypeArg);
	text *source = OptionalText(fcinfo, kEventSourceArg);
	if (!cloudevent) {
		if (type || source) {
			ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			                errmsg("event_type and event_source are for CloudEvents, and this event is not one"),
			                errdetail(explicit_choice ? "The cloudevents argument is false."
			                                          : "Its topic is not in outbox.cloudevents_topics."),
			                errhint("Pass cloudevents => true, or list the topic in outbox.cloudevents_topics.")));
		}
		return;
	}
	if (facts.envelope_header) {
		InvalidInput(ERRCODE_INVALID_PARAMETER_VALUE,
		             "a CloudEvent's headers must not be named ce_* or content-type",
		             "The relay writes the CloudEvents attributes and the content type as those headers itself.",
		             "Pass the type and source as event_type and event_source, or rename the header.");
	}
	int type_len = type ? ValidateAttribute("event_type", type, false) : VARSIZE_ANY_EXHDR(topic);
	// The default source is resolved and stored now, not at publish: a change of the setting in
	// between would give an enqueued event another (source, id), which consumers deduplicate on,
	// and an envelope larger than the one sized here.
	int source_len;
	if (source) {
		source_len = ValidateAttribute("event_source", source, true);
	} else {
		const char *default_source = outbox::DefaultSource(); // checked by the setting's hook, or encoded: ASCII
		source = cstring_to_text(default_source);
		source_len = int(strlen(default_source));
	}
	env->ce_content_type = ContentTypeOf(kind);
	env->ce_type = type;
	env->ce_source = source;
	env->columns = true;
	*bytes += outbox::cloudevents::HeaderBytes(UUID_LEN * 2 + 4, size_t(source_len), size_t(type_len),
	                                           strlen(env->ce_content_type));
}

// The optional arguments of 0.2.0's enqueue, checked: nothing is inserted when one is bad.
Envelope
EnvelopeOf(FunctionCallInfo fcinfo, text *topic, PayloadKind kind, const HeaderFacts &facts, int64 *bytes) {
	Envelope env = {};
	env.partition_null = true;
	if (ArgGiven(fcinfo, kPartitionArg)) {
		env.partition = PG_GETARG_INT32(kPartitionArg);
		if (env.partition < 0) {
			ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			                errmsg("partition must not be negative, got %d", env.partition),
			                errhint("Pass a partition of the topic (0 to its partition count - 1), or NULL to let "
			                        "the key choose.")));
		}
		env.partition_null = false;
		env.columns = true;
	}
	env.trace_headers = TraceContext(fcinfo, facts, bytes);
	CloudEvent(fcinfo, topic, kind, facts, &env, bytes);
	return env;
}

Datum
Enqueue(FunctionCallInfo fcinfo, PayloadKind kind) {
	if (PG_ARGISNULL(0)) {
		InvalidInput(ERRCODE_NULL_VALUE_NOT_ALLOWED, "topic must not be NULL", nullptr,
		             "Pass the Kafka topic the event goes to, e.g. 'billing.invoices'.");
	}
	text *topic = PG_GETARG_TEXT_PP(0);
	ValidateTopic(topic);

	bool key_null = PG_ARGISNULL(1);
	bool payload_null = PG_ARGISNULL(2);
	text *key = key_null ? nullptr : PG_GETARG_TEXT_PP(1);
	int64 bytes = 0;
	if (key) {
		// Stored as given (its lane is a hash of these bytes); the relay publishes it as UTF-8.
		int utf8_len;
		Utf8Of("the key", VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), &utf8_len);
		if (VARSIZE_ANY_EXHDR(key) > outbox::kMaxKeyBytes) {
			ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			                errmsg("key of %d bytes exceeds the limit of %d bytes", int(VARSIZE_ANY_EXHDR(key)),
			                       outbox::kMaxKeyBytes),
			                errdetail("Keys are indexed for per-key order, and an index entry has a size limit."),
			                errhint("Use an identifier as the key (an aggregate id), or a hash of a long one.")));
		}
		bytes += utf8_len;
	}

	// A NULL payload is a Kafka tombstone (deletes the key in a compacted topic); without a key
	// it would mean nothing, so that is an error.
	if (payload_null && key_null) {
		InvalidInput(ERRCODE_NULL_VALUE_NOT_ALLOWED, "payload must not be NULL for an event without a key",
		             "A NULL payload is published as a tombstone, which only means something for a key.",
		             "Pass a payload, or a key if you meant to delete that key from a compacted topic.");
	}
	bytea *payload = payload_null ? nullptr : PayloadBytes(PG_GETARG_DATUM(2), kind);
	if (payload) {
		bytes += VARSIZE_ANY_EXHDR(payload);
	}

	bool headers_null = PG_ARGISNULL(3);
	HeaderFacts facts = {};
	if (!headers_null) {
		ValidateHeaders(PG_GETARG_JSONB_P(3), &bytes, &facts);
	}
	// 0.1.0's functions (five arguments, while an upgrade is under way) know no envelope.
	Envelope env = {};
	env.partition_null = true;
	if (PG_NARGS() > kPartitionArg) {
		env = EnvelopeOf(fcinfo, topic, kind, facts, &bytes);
	}
	if (bytes > outbox::settings.max_payload_bytes) {
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
		                errmsg("event of %lld bytes exceeds outbox.max_payload_bytes (%d)", (long long)bytes,
		                       outbox::settings.max_payload_bytes),
		                errdetail("The size counts the key, the payload and the headers (each with 10 bytes of framing)."),
		                errhint("Store large documents elsewhere and enqueue a reference, or raise the setting "
		                        "together with the broker's message.max.bytes.")));
	}

	pg_uuid_t *event_id;
	bool caller_event_id = !PG_ARGISNULL(4);
	if (!caller_event_id) {
		event_id = static_cast<pg_uuid_t *>(palloc(sizeof(pg_uuid_t)));
		GeneratedEventId(event_id->data);
	} else {
		event_id = PG_GETARG_UUID_P(4);
	}

	int lane = outbox::LaneOfEvent(key ? VARDATA_ANY(key) : nullptr, key ? VARSIZE_ANY_EXHDR(key) : 0, event_id->data);

	Datum headers = headers_null ? Datum(0) : PG_GETARG_DATUM(3);
	if (env.trace_headers) {
		headers = headers_null ? JsonbPGetDatum(env.trace_headers)
		                       : DirectFunctionCall2(jsonb_concat, headers, JsonbPGetDatum(env.trace_headers));
		headers_null = false;
	}
	Datum values[10] = {UUIDPGetDatum(event_id),
	                    PointerGetDatum(topic),
	                    key_null ? Datum(0) : PG_GETARG_DATUM(1),
	                    Int16GetDatum(int16(lane)),
	                    PointerGetDatum(payload),
	                    headers,
	                    Int32GetDatum(env.partition),
	                    env.ce_content_type ? CStringGetTextDatum(env.ce_content_type) : Datum(0),
	                    PointerGetDatum(env.ce_type),
	                    PointerGetDatum(env.ce_source)};
	char nulls[10] = {' ', ' ', key_null ? 'n' : ' ', ' ', payload_null ? 'n' : ' ', headers_null ? 'n' : ' ',
	                  env.partition_null ? 'n' : ' ', env.ce_content_type ? ' ' : 'n', env.ce_type ? ' ' : 'n',
	                  env.ce_source ? ' ' : 'n'};

	// Unkeyed events promise no order: nothing to stamp in commit order.
	outbox::QueueTarget target = outbox::CurrentQueueTarget();
	// A generated id given back (ring_dedup.hpp RefuseGeneratedCallerId): a duplicate when it is
	// still indexed (made before the update to 0.4.1), refused otherwise.
	if (caller_event_id && target.caller_column && outbox::IsGeneratedUuid(event_id->data)) {
		SPI_connect();
		bool kept = outbox::RingKeepsEventId(values[0], true, true);
		SPI_finish();
		if (kept) {
			PG_RETURN_NULL();
		}
		outbox::RefuseGeneratedCallerId(event_id);
	}
	bool commit_order = key != nullptr && target.commit_order;
	// The column default reads the insert position during the INSERT: never below this.
	XLogRecPtr insert_before = commit_order ? GetXLogInsertRecPtr() : InvalidXLogRecPtr;
	int64 id = 0;
	XLogRecPtr order_lsn = InvalidXLogRecPtr;
	// A generated id into a ring member: straight into the member (member_insert.cpp). A caller's
	// id needs the statement's dedup (ON CONFLICT, the other members' probes); 0.3.0's table and
	// a member of another shape take the statement too.
	if (!caller_event_id && target.member != outbox::kNoMember) {
		outbox::MemberRowValues row = {values[0], values[1], values[2], key_null, int16(lane), values[4], payload_null,
		                               values[5], headers_null, env.partition, env.partition_null, values[7],
		                               values[8], values[9]};
		if (outbox::InsertIntoMember(target.member_rel, row, &id, &order_lsn)) {
			if (commit_order) {
				outbox::NoteKeyedRow(topic, key, id, order_lsn, insert_before, target.member);
			}
			outbox::WakeLaneAtCommit(lane);
			PG_RETURN_UUID_P(event_id);
		}
	}
	SPI_connect();
	// A snapshot older than the statement (REPEATABLE READ, SERIALIZABLE) would not show an id
	// another transaction committed since into another member: read it with the latest one.
	if (caller_event_id && target.member != outbox::kNoMember && IsolationUsesXactSnapshot() &&
	    outbox::RingKeepsEventId(values[0], target.caller_column)) {
		SPI_finish();
		PG_RETURN_NULL(); // a duplicate this transaction sees
	}
	SPIPlanPtr plan = InsertPlan(target, caller_event_id, commit_order, env.columns);
	// Only a statement for 0.3.0's table can reach the view (ExecuteWritingGeneratedId); a member
	// of another shape takes its own statement, which no view is in.
	int rc = caller_event_id || target.member != outbox::kNoMember
	             ? SPI_execute_plan(plan, values, nulls, false, 0)
	             : ExecuteWritingGeneratedId(plan, values, nulls, event_id);
	// RETURNING only where the commit order needs the row's id and stamp: elsewhere SPI_processed
	// says whether it was inserted, without a projection and a result tuple per call.
	if (rc != (commit_order ? SPI_OK_INSERT_RETURNING : SPI_OK_INSERT)) {
		elog(ERROR, "outbox: enqueue insert failed: %s", SPI_result_code_string(rc));
	}
	bool inserted = SPI_processed == 1;
	if (inserted && commit_order) {
		bool isnull;
		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		order_lsn = DatumGetLSN(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	}
	SPI_finish();

	if (!inserted) {
		PG_RETURN_NULL(); // duplicate event_id: ON CONFLICT DO NOTHING
	}
	if (commit_order) {
		outbox::NoteKeyedRow(topic, key, id, order_lsn, insert_before, target.member);
	}
	outbox::WakeLaneAtCommit(lane);
	PG_RETURN_UUID_P(event_id);
}

} // namespace

OUTBOX_SQL_FUNCTION(outbox_enqueue_jsonb) {
	return Enqueue(fcinfo, PayloadKind::Jsonb);
}

OUTBOX_SQL_FUNCTION(outbox_enqueue_text) {
	return Enqueue(fcinfo, PayloadKind::Text);
}

OUTBOX_SQL_FUNCTION(outbox_enqueue_bytea) {
	return Enqueue(fcinfo, PayloadKind::Bytea);
}
