// CloudEvents headers of a claimed event (cloudevent_headers.hpp).
#include "relay/cloudevent_headers.hpp"

#include "shared/cloudevent_attributes.hpp"
#include "shared/cloudevent_source.hpp"
#include "shared/cloudevents.hpp"
#include "shared/guc.hpp"

namespace outbox {

namespace {

constexpr int64 kUnixEpochOffsetUs = int64(POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * USECS_PER_SEC;

kafka::Header
TextHeader(const char *name, const char *value) {
	return kafka::Header{name, value, strlen(value)};
}

} // namespace

int64
UnixMillis(TimestampTz t) {
	if (TIMESTAMP_NOT_FINITE(t)) {
		return 0; // written by hand past the table's checks: infinity + the offset would overflow
	}
	int64 ms = (t + kUnixEpochOffsetUs) / 1000;
	return ms > 0 ? ms : 0;
}

const char *
CloudEventProblem(const ClaimedEvent &e, const char *content_type, const char *type, const char *source,
                  TimestampTz created_at) {
	if (content_type[0] == '\0' || (type && type[0] == '\0') || (source && source[0] == '\0')) {
		return "quarantined: a CloudEvents attribute (ce_content_type, ce_type, ce_source) is empty";
	}
	if (const char *problem = source ? cloudevents::UriReferenceProblem(source, strlen(source)) : nullptr) {
		return psprintf("quarantined: ce_source \"%s\" is not a URI-reference: %s", source, problem);
	}
	if (const char *problem = type ? cloudevents::StringAttributeProblem(type, strlen(type)) : nullptr) {
		return psprintf("quarantined: ce_type is not a CloudEvents String: %s", problem);
	}
	if (const char *problem = cloudevents::MediaTypeProblem(content_type, strlen(content_type))) {
		return psprintf("quarantined: ce_content_type \"%s\" is not a media type (RFC 2046): %s", content_type,
		                problem);
	}
	// The Java SDK reads a record whose content-type starts so as structured mode: it refuses
	// it, or (with a JSON event format on its class path) reads an event forged in the payload.
	if (pg_strncasecmp(content_type, cloudevents::kStructuredContentTypePrefix,
	                   strlen(cloudevents::kStructuredContentTypePrefix)) == 0) {
		return psprintf("quarantined: ce_content_type \"%s\" names structured content mode, and the record is in "
		                "binary mode",
		                content_type);
	}
	for (int h = 0; h < e.n_headers; h++) {
		if (cloudevents::NamesEnvelopeAttribute(e.headers[h].name, strlen(e.headers[h].name))) {
			return psprintf("quarantined: a CloudEvent's own header is named \"%s\", which the envelope writes",
			                e.headers[h].name);
		}
	}
	if (TIMESTAMP_NOT_FINITE(created_at) || !cloudevents::TimeRepresentable(created_at + kUnixEpochOffsetUs)) {
		return "quarantined: created_at is outside the years 0001 to 9999 that ce_time (RFC 3339) can state";
	}
	return nullptr;
}

void
AddCloudEventHeaders(ClaimedEvent &e, const char *content_type, const char *type, const char *source,
                     TimestampTz created_at) {
	auto *headers = static_cast<kafka::Header *>(palloc(sizeof(kafka::Header) * (e.n_headers + cloudevents::kHeaderCount)));
	memcpy(headers, e.headers, sizeof(kafka::Header) * e.n_headers);
	int n = e.n_headers;
	char *time = static_cast<char *>(palloc(cloudevents::kTimeLength + 1));
	cloudevents::FormatTime(created_at + kUnixEpochOffsetUs, time);
	headers[n++] = TextHeader(cloudevents::kSpecVersionHeader, cloudevents::kSpecVersion);
	headers[n++] = TextHeader(cloudevents::kIdHeader, e.event_id);
	headers[n++] = TextHeader(cloudevents::kSourceHeader, source ? source : DefaultSource());
	headers[n++] = TextHeader(cloudevents::kTypeHeader, type ? type : e.topic);
	headers[n++] = TextHeader(cloudevents::kTimeHeader, time);
	if (e.payload != nullptr) {
		headers[n++] = TextHeader(cloudevents::kContentTypeHeader, content_type);
	}
	e.headers = headers;
	e.n_headers = n;
}

} // namespace outbox
