// enqueue's INSERT of an event with a generated id into the current ring member (schema 0.4.0),
// written straight to the heap and the member's indexes instead of through SPI and the executor
// (member_insert.cpp says when it may, and what it does in place of the executor's steps).
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

// The row's columns enqueue fills; NULL pointers/flags as enqueue's SPI statement passes them.
struct MemberRowValues {
	Datum event_id;
	Datum topic;
	Datum key; // key_null: none
	bool key_null;
	int16 lane;
	Datum payload; // payload_null: a tombstone
	bool payload_null;
	Datum headers; // headers_null: none
	bool headers_null;
	int32 target_partition; // partition_null: the key chooses
	bool partition_null;
	Datum ce_content_type, ce_type, ce_source; // (Datum) 0: NULL
};

// Inserts the row into member `member_rel` (the current member) and returns true with its id and
// stamp, or returns false having done nothing: the member is not of the shape this path knows
// (another trigger, rule, check, policy or column than the extension made), and the caller takes
// the SPI statement, which handles every shape.
bool InsertIntoMember(Oid member_rel, const MemberRowValues &row, int64 *id, XLogRecPtr *order_lsn);

// From _PG_init: forgets what InsertIntoMember learnt of a member when it changes.
void RegisterMemberShapeInvalidation();

} // namespace outbox
