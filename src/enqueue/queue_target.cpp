// Where enqueue writes (queue_target.hpp).
#include "enqueue/queue_target.hpp"

#include "shared/boundary.hpp"

extern "C" {
#include "access/tableam.h"
#include "catalog/pg_trigger.h" // TRIGGER_TYPE_*
#include "commands/trigger.h"
#include "executor/tuptable.h"
#include "storage/lmgr.h"
#include "utils/inval.h" // CacheRegisterRelcacheCallback
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/rel.h"
}

namespace outbox {

namespace {

// The answer for the transaction cached_lxid; cached_lxid Invalid: look again.
LocalTransactionId cached_lxid = InvalidLocalTransactionId;
QueueTarget cached = {InvalidOid, false, kNoMember, InvalidOid, false};

// What outlives a transaction: the names' OIDs and, on schema 0.4.0, the ring's current member.
// Any relcache invalidation of one of these relations (a rename, a column change, a TRUNCATE of a
// member, outbox.ring's trigger at every change of its rows) or of every relation, and any change
// of a schema, forgets it all: the next transaction looks everything up again.
struct Known {
	bool valid;
	Oid events;
	char events_kind;
	bool events_commit_order;
	Oid ring;
	AttrNumber member_att, current_att;
	int member; // the current member as last read (kept only while ring_changed signals), or kNoMember
	Oid members[kRingMembers];
};
Known known = {};

void
Forget() {
	known.valid = false;
	known.member = kNoMember;
	cached_lxid = InvalidLocalTransactionId;
}

bool
IsKnown(Oid relid) {
	if (relid == known.events || relid == known.ring) {
		return true;
	}
	for (Oid m : known.members) {
		if (relid == m) {
			return true;
		}
	}
	return relid == cached.events || relid == cached.member_rel;
}

void
OnRelcacheInvalidation(Datum, Oid relid) {
	// A rename, a column added or dropped, the view replacing the table, a change of the ring's
	// rows: every one is an invalidation of one of these (InvalidOid: of every relation).
	if (!OidIsValid(relid) || IsKnown(relid)) {
		Forget();
	}
}

} // namespace

extern "C" {
static void
outbox_queue_target_invalidation(Datum arg, Oid relid) {
	// Plain assignments, nothing that can throw or ereport.
	OnRelcacheInvalidation(arg, relid);
}

static void
outbox_queue_target_namespace_invalidation(Datum, int, uint32) {
	// A schema renamed or dropped: outbox's names may mean other relations now.
	Forget();
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

namespace {

void
RingColumns(Oid ring, AttrNumber *member_att, AttrNumber *current_att) {
	*member_att = OidIsValid(ring) ? get_attnum(ring, "member") : InvalidAttrNumber;
	*current_att = OidIsValid(ring) ? get_attnum(ring, "is_current") : InvalidAttrNumber;
	if (*member_att == InvalidAttrNumber || *current_att == InvalidAttrNumber) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		                errmsg("outbox.ring is missing or lacks the columns member and is_current"),
		                errhint("outbox.ring belongs to the extension: do not change it by hand.")));
	}
}

// The scan itself: outbox.ring read with the latest snapshot (not the transaction's: under
// REPEATABLE READ that would not show a rotation committed after the transaction began). A heap
// scan of four rows, no rights asked: enqueue's rows go wherever the ring says, whoever calls it.
int
ScanRing(Oid ring, AttrNumber member_att, AttrNumber current_att, bool *signals) {
	int member = -1;
	Relation rel = table_open(ring, AccessShareLock);
	if (signals) {
		// Whether every committed change of the ring's rows invalidates its relcache entry in
		// every backend (the trigger below; a trigger left out, disabled or firing only on the
		// origin would not): then the member read now holds until such an invalidation.
		*signals = false;
		for (int i = 0; rel->trigdesc && i < rel->trigdesc->numtriggers; i++) {
			const Trigger &t = rel->trigdesc->triggers[i];
			const int16 events = TRIGGER_TYPE_INSERT | TRIGGER_TYPE_UPDATE | TRIGGER_TYPE_DELETE | TRIGGER_TYPE_TRUNCATE;
			*signals |= strcmp(t.tgname, "ring_changed") == 0 && t.tgenabled == TRIGGER_FIRES_ALWAYS &&
			            (t.tgtype & events) == events && !TRIGGER_FOR_ROW(t.tgtype) && !TRIGGER_FOR_BEFORE(t.tgtype);
		}
	}
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

} // namespace

namespace {

// The names' OIDs (once per invalidation, not per transaction). With one missing (no extension
// here, or a member dropped by hand) known.valid stays false: nothing is kept, and every
// transaction looks again, as it did before anything was kept.
void
LookUpNames() {
	Known k = {};
	k.member = kNoMember;
	Oid nsp = get_namespace_oid("outbox", true);
	k.events = OidIsValid(nsp) ? get_relname_relid("events", nsp) : InvalidOid;
	if (OidIsValid(k.events)) {
		k.events_kind = get_rel_relkind(k.events);
		k.events_commit_order = get_attnum(k.events, "order_lsn") != InvalidAttrNumber;
		if (k.events_kind == RELKIND_VIEW) {
			k.ring = get_relname_relid("ring", nsp);
			RingColumns(k.ring, &k.member_att, &k.current_att);
			for (int m = 0; m < kRingMembers; m++) {
				k.members[m] = get_relname_relid(RingMemberName(m), nsp);
			}
		}
	}
	bool complete = OidIsValid(k.events) && (k.events_kind != RELKIND_VIEW || OidIsValid(k.ring));
	for (Oid m : k.members) {
		complete = complete && (k.events_kind != RELKIND_VIEW || OidIsValid(m));
	}
	k.valid = complete;
	known = k;
}

// The ring's current member: the one kept since the last invalidation of outbox.ring when its
// trigger signals every change, else read now. Invalidations are taken in first, so a rotation
// committed before this call (after this transaction began too) is seen.
int
RingMember(bool fresh) {
	AcceptInvalidationMessages();
	if (!known.valid) {
		LookUpNames();
	}
	if (!fresh && known.member != kNoMember) {
		return known.member;
	}
	bool signals;
	int member = ScanRing(known.ring, known.member_att, known.current_att, &signals);
	// table_open may have taken in an invalidation of the ring (or of everything): then what was
	// read is still right, but the names are looked up again before it is kept.
	if (!known.valid) {
		LookUpNames();
	}
	known.member = signals ? member : kNoMember;
	return member;
}

// The current member, its table locked ROW EXCLUSIVE (held to the end of the transaction). When
// the lock has to wait, the retention holds it (ACCESS EXCLUSIVE: it is emptying that member, and
// may have moved the current pointer in the same transaction): read the ring again once it is
// ours. Correctness does not rest on this (a row in any member is claimed, and a member is only
// emptied under that lock once every cursor passed its last row, ring_retention_sql.cpp); it keeps
// a writer that raced a rotation out of the member just emptied.
int
LockCurrentRingMember(Oid *member_rel, bool fresh) {
	int member = RingMember(fresh);
	for (;;) {
		Oid rel = known.members[member];
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
		int again = RingMember(true);
		if (again == member) {
			*member_rel = rel;
			return member;
		}
		member = again; // the lock on the old member stays until the transaction ends: harmless
	}
}

// Whether this backend still holds the member's ROW EXCLUSIVE lock: a ROLLBACK TO SAVEPOINT
// gives back a lock taken inside it, and then the retention may have emptied the member and moved
// the current pointer; the member is looked up (read from the ring) and locked again.
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
	bool same_transaction = lxid == cached_lxid;
	if (!same_transaction || !StillLocked(cached)) {
		AcceptInvalidationMessages();
		if (!known.valid) {
			LookUpNames();
		}
		QueueTarget t = {InvalidOid, false, kNoMember, InvalidOid, false};
		t.events = known.events;
		if (OidIsValid(t.events)) {
			t.commit_order = known.events_commit_order;
			if (known.events_kind == RELKIND_VIEW) {
				// Read afresh after a ROLLBACK TO SAVEPOINT gave the lock back.
				t.member = LockCurrentRingMember(&t.member_rel, same_transaction);
				t.commit_order = get_attnum(t.member_rel, "order_lsn") != InvalidAttrNumber; // under its lock
				t.caller_column = get_attnum(t.member_rel, kCallerEventIdColumn) != InvalidAttrNumber;
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
	CacheRegisterSyscacheCallback(NAMESPACEOID, outbox_queue_target_namespace_invalidation, Datum(0));
}

} // namespace outbox

// The trigger ring_changed of outbox.ring (AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE, FOR EACH
// STATEMENT, ENABLE ALWAYS): every change of the ring's rows invalidates the ring's relcache entry
// in every backend once the change commits (with PREPARE, at COMMIT PREPARED), and in this one at
// once, which is what lets enqueue keep the current member between transactions.
OUTBOX_SQL_FUNCTION(outbox_ring_changed) {
	if (!CALLED_AS_TRIGGER(fcinfo)) {
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("outbox_ring_changed() must be called as a trigger")));
	}
	auto *trigger = reinterpret_cast<TriggerData *>(fcinfo->context);
	if (!TRIGGER_FIRED_AFTER(trigger->tg_event) || !TRIGGER_FIRED_FOR_STATEMENT(trigger->tg_event)) {
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("outbox_ring_changed() must be an AFTER ... FOR EACH STATEMENT trigger")));
	}
	CacheInvalidateRelcache(trigger->tg_relation);
	return PointerGetDatum(nullptr);
}
