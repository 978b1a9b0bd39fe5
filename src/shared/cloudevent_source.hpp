// The default CloudEvents source, which enqueue stores in an event's row and the relay uses for a
// row written by hand without one. Palloc'd data, Postgres frames only.
#pragma once

namespace outbox {

// The source of events that name none: outbox.cloudevents_source, else /outbox/<this database's
// name, percent-encoded> (a source with the event's id identifies the event, CloudEvents 1.0
// "id"). Enqueue stores it in the row, so (source, id) stays the event's for its life.
const char *DefaultSource();

} // namespace outbox
