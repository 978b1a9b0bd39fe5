// Dedup of a caller's event id across the ring (schema 0.4.0) under REPEATABLE READ and
// SERIALIZABLE: what 0.3.0's one unique index did for a snapshot that predates the row.
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

constexpr int kEventIdTables = 5;

// The tables that keep a caller's event id on schema 0.4.0: the ring members and
// outbox.event_state (an event that waits or failed keeps its row there after its member was
// emptied). The one list both probes are built from (RingKeepsEventId's and enqueue's INSERT).
// Their names (static storage) but member `except`'s (kNoMember: all); returns how many.
int EventIdTables(int except, const char *names[kEventIdTables]);

// Appends "SELECT FROM outbox.<table> o WHERE o.event_id = $1", for a member of schema 0.4.1
// (caller_column) with "AND o.caller_event_id": its unique index on event_id is partial, WHERE
// caller_event_id, and only a probe that names the predicate can use it (and finds caller ids
// only, which is what dedup covers; event_state's index has every id).
void AppendEventIdProbe(StringInfo sql, const char *table, bool caller_column);

// Whether a ring member or outbox.event_state holds an event with this id, read with the latest
// snapshot. When the transaction's snapshot does not show that row (another transaction committed
// it after this one's snapshot was taken), ERROR 40001, as an INSERT into 0.3.0's unique index
// gave: retried, the transaction sees the event. With SPI connected. caller_column: the members
// are of schema 0.4.1 (QueueTarget::caller_column), and only their caller ids count.
// members_only: not event_state (whose copies would tell a failed or waiting event from one
// pending or published to a role that probes a generated id it read).
bool RingKeepsEventId(Datum event_id, bool caller_column, bool members_only = false);

// On schema 0.4.1 an id enqueue generated has no event-id index entry (caller_event_id false) and
// is not deduplicated: given again as a caller's (to enqueue, or through the view), it would make
// a second event with that id, which a consumer deduplicating on event_id (outbox.consume_once)
// would take for the first; any role that can read one (a record header) could so shadow another
// application's event. ERROR 22023 for such an id (enqueue's mark, event_id.hpp), before anything
// is written; the callers first ask RingKeepsEventId of the members alone, so an id still
// indexed (generated before the update to 0.4.1) stays a duplicate, and whether the event waits
// or failed (event_state) makes no difference to the answer. (0.3.0's table and 0.4.0's members
// index every id: there it is deduplicated.)
void RefuseGeneratedCallerId(const pg_uuid_t *event_id);

// The generated id enqueue is writing through an INSERT statement, or nullptr once the statement
// ended (however). The statement reaches the view's INSERT trigger when this backend took 0.3.0's
// table for its target and an ALTER EXTENSION UPDATE to the ring committed since (the statement
// is planned again, on the view): that trigger's probe takes the noted id as new, once
// (TakeEnqueueWrittenId), instead of refusing it.
void EnqueueWritesGeneratedId(const pg_uuid_t *event_id);

// Whether `event_id` is the id noted by EnqueueWritesGeneratedId; the note is gone after.
bool TakeEnqueueWrittenId(const pg_uuid_t *event_id);

} // namespace outbox
