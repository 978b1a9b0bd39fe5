// Where enqueue writes: 0.3.0's table outbox.events, or on schema 0.4.0 (a preview: outbox.events
// is a view) the current member of the ring of generation tables (DESIGN.md "The insert-only
// queue"). Decided once per transaction and again after a change of outbox.events (ALTER
// EXTENSION UPDATE in this backend, in this very transaction too); the names' OIDs and the ring's
// current member are kept between transactions until an invalidation (queue_target.cpp).
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

constexpr int kRingMembers = 4;
// NotedRow::member etc. for 0.3.0's table.
constexpr int kNoMember = -1;

struct QueueTarget {
	Oid events;        // outbox.events (InvalidOid: no extension in this database)
	bool commit_order; // the rows have order_lsn (0.2.0 on)
	int member;        // 0.4.0: the current ring member (0 .. kRingMembers - 1); 0.3.0: kNoMember
	Oid member_rel;    // 0.4.0: its table
};

// This transaction's target (a copy: a later look-up may replace the cached one).
QueueTarget CurrentQueueTarget();

// "events_<member>" (kNoMember: "events", 0.3.0's table), static storage.
const char *RingMemberName(int member);

// The member's table, or InvalidOid.
Oid RingMemberRelation(int member);

// From _PG_init: forgets the cached target when outbox.events changes.
void RegisterQueueTargetInvalidation();

} // namespace outbox
