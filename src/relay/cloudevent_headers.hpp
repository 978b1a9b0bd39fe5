// The relay's half of CloudEvents (cloudevents.hpp): the ce_* and content-type headers of a
// claimed CloudEvent, from its row, written when it is published. Plain palloc'd data.
#pragma once

#include "relay/relay_sql.hpp"

namespace outbox {

// Milliseconds since the Unix epoch (a Kafka record's timestamp); 0 (the producer's clock) for
// a time before it or not finite.
int64 UnixMillis(TimestampTz t);

// Appends the envelope to e.headers: ce_specversion 1.0, ce_id = event_id, ce_source (`source`,
// else outbox.cloudevents_source, else /outbox/<the database's name, percent-encoded>), ce_type (`type`, else the
// topic), ce_time = created_at, and content-type unless the event is a tombstone (no data).
// Why a claimed row cannot be published as the CloudEvent its columns make (only a row written by
// hand, past the table's checks, or by enqueue before 0.2.0's attribute rules, can be like
// that), or nullptr: an empty attribute, a ce_source that is not a URI-reference, a ce_type with
// control characters, a ce_content_type that is not a media type, a header of its own named ce_*
// or content-type in any case (a second, conflicting attribute), a created_at that ce_time cannot
// state. The SDKs refuse such a record, and a Java consumer would stop at its offset.
const char *CloudEventProblem(const ClaimedEvent &e, const char *content_type, const char *type,
                              const char *source, TimestampTz created_at);

void AddCloudEventHeaders(ClaimedEvent &e, const char *content_type, const char *type, const char *source,
                          TimestampTz created_at);

} // namespace outbox
