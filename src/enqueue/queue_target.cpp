// Where enqueue writes (queue_target.hpp).
#include "enqueue/queue_target.hpp"

#include "shared/boundary.hpp"

extern "C" {
#include "access/tableam.h"
#include "executor/tuptable.h"
#include "storage/lmgr.h"
#include "utils/inval.h" // CacheRegisterRelcacheCallback
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
}

namespace outbox {

namespace {

// The answer for the transaction cached_lxid; cached_lxid Invalid: look again.
LocalTransactionId cached_lxid = InvalidLocalTransactionId;
QueueTarget cached = {InvalidOid, false, kNoMember, InvalidOid};

void
OnRelcacheInvalidation(Datum, Oid relid) {
	// A rename, a column added or dropped, the view replacing the table: every one is an
	// invalidation of the old outbox.events (InvalidOid: of every relation).
	if (!OidIsValid(relid) || relid == cached.events || relid == cached.member_rel) {
		cached_lxid = InvalidLocalTransactionId;
	}
}

} // namespace

extern "C" {
static void
outbox_queue_target_invalidation(Datum arg, Oid relid) {
	// Plain look-ups, nothing that can throw or ereport.
	OnRelcacheInvalidation(arg, relid);
}
}

const char *
RingMemberName(int member) {
	static const char *const names[kRingMembers] = {"events_0", "events_1", "events_2", "events_3"};
	return member >= 0 && member < kRingMembers ? names[member] : "events";
}

Oid
RingMemberRelation(int member) {
	Oid nsp = get_namespace_oid("outbox", true);
	return OidIsValid(nsp) ? get_relname_relid(RingMemberName(member), nsp) : InvalidOid;
}

// outbox.ring's current member, read with the latest snapshot (not the transaction's: under
// REPEATABLE READ that would not show a rotation committed after the transaction began). A heap
// scan of four rows, no rights asked: enqueue's rows go wherever the ring says, whoever calls it.
int
CurrentRingMember() {
	Oid nsp = get_namespace_oid("outbox", true);
	Oid ring = OidIsValid(nsp) ? get_relname_relid("ring", nsp) : InvalidOid;
	AttrNumber member_att = OidIsValid(ring) ? get_attnum(ring, "member") : InvalidAttrNumber;
	AttrNumber current_att = OidIsValid(ring) ? get_attnum(ring, "is_current") : InvalidAttrNumber;
	if (member_att == InvalidAttrNumber || current_att == InvalidAttrNumber) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		                errmsg("outbox.ring is missing or lacks the columns member and is_current"),
		                errhint("outbox.ring belongs to the extension: do not change it by hand.")));
	}
	int member = -1;
	Relation rel = table_open(ring, AccessShareLock);
	Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
	TupleTableSlot *slot = table_slot_create(rel, nullptr);
	TableScanDesc scan = table_beginscan(rel, snapshot, 0, nullptr);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot)) {
		bool member_null, current_null;
		Datum m = slot_getattr(slot, member_att, &member_null);
		Datum c = slot_getattr(slot, current_att, &current_null);
		if (!current_null && DatumGetBool(c) && !member_null) {
			member = DatumGetInt16(m);
		}
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
	if (member < 0 || member >= kRingMembers) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE), errmsg("outbox.ring has no current member"),
		                errhint("outbox.ring belongs to the extension: do not change it by hand.")));
	}
	return member;
}

namespace {

// The current member, its table locked ROW EXCLUSIVE (held to the end of the transaction). When
// the lock has to wait, the retention holds it (ACCESS EXCLUSIVE: it is emptying that member, and
// may have moved the current pointer in the same transaction): read the ring again once it is
// ours. Correctness does not rest on this (a row in any member is claimed, and a member is only
// emptied under that lock once every cursor passed its last row, ring_retention_sql.cpp); it keeps
// a writer that raced a rotation out of the member just emptied.
int
LockCurrentRingMember(Oid *member_rel) {
	int member = CurrentRingMember();
	for (;;) {
		Oid rel = RingMemberRelation(member);
		if (!OidIsValid(rel)) {
			ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
			                errmsg("outbox: the ring member outbox.%s does not exist", RingMemberName(member)),
			                errhint("outbox.events is a view (schema 0.4.0) but its current member is missing: "
			                        "the extension's objects were changed by hand.")));
		}
		if (ConditionalLockRelationOid(rel, RowExclusiveLock)) {
			*member_rel = rel;
			return member;
		}
		LockRelationOid(rel, RowExclusiveLock);
		int again = CurrentRingMember();
		if (again == member) {
			*member_rel = rel;
			return member;
		}
		member = again; // the lock on the old member stays until the transaction ends: harmless
	}
}

// Whether this backend still holds the member's ROW EXCLUSIVE lock: a ROLLBACK TO SAVEPOINT
// gives back a lock taken inside it, and then the retention may have emptied the member and moved
// the current pointer; the member is looked up and locked again.
bool
StillLocked(const QueueTarget &t) {
	if (t.member == kNoMember) {
		return true;
	}
	LOCKTAG tag;
	SET_LOCKTAG_RELATION(tag, MyDatabaseId, t.member_rel);
	return OutboxLockHeldByMe(&tag, RowExclusiveLock);
}

} // namespace

QueueTarget
CurrentQueueTarget() {
	LocalTransactionId lxid = OutboxLocalTransactionId();
	if (lxid != cached_lxid || !StillLocked(cached)) {
		QueueTarget t = {InvalidOid, false, kNoMember, InvalidOid};
		Oid nsp = get_namespace_oid("outbox", true);
		t.events = OidIsValid(nsp) ? get_relname_relid("events", nsp) : InvalidOid;
		if (OidIsValid(t.events)) {
			t.commit_order = get_attnum(t.events, "order_lsn") != InvalidAttrNumber;
			if (get_rel_relkind(t.events) == RELKIND_VIEW) {
				t.member = LockCurrentRingMember(&t.member_rel);
				t.commit_order = get_attnum(t.member_rel, "order_lsn") != InvalidAttrNumber;
			}
		}
		cached = t;
		cached_lxid = lxid;
	}
	return cached;
}

void
RegisterQueueTargetInvalidation() {
	CacheRegisterRelcacheCallback(outbox_queue_target_invalidation, Datum(0));
}

} // namespace outbox
