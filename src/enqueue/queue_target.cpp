// Where enqueue writes (queue_target.hpp).
#include "enqueue/queue_target.hpp"

#include "shared/boundary.hpp"

extern "C" {
#include "utils/inval.h" // CacheRegisterRelcacheCallback
#include "utils/lsyscache.h"
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

int
CurrentRingMember() {
	// Step 4 (rotation) moves the current pointer along outbox.ring; until then the script makes
	// member 0 current and nothing changes it.
	return 0;
}

QueueTarget
CurrentQueueTarget() {
	LocalTransactionId lxid = OutboxLocalTransactionId();
	if (lxid != cached_lxid) {
		QueueTarget t = {InvalidOid, false, kNoMember, InvalidOid};
		Oid nsp = get_namespace_oid("outbox", true);
		t.events = OidIsValid(nsp) ? get_relname_relid("events", nsp) : InvalidOid;
		if (OidIsValid(t.events)) {
			t.commit_order = get_attnum(t.events, "order_lsn") != InvalidAttrNumber;
			if (get_rel_relkind(t.events) == RELKIND_VIEW) {
				t.member = CurrentRingMember();
				t.member_rel = RingMemberRelation(t.member);
				if (!OidIsValid(t.member_rel)) {
					ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
					                errmsg("outbox: the ring member outbox.%s does not exist", RingMemberName(t.member)),
					                errhint("outbox.events is a view (schema 0.4.0) but its current member is missing: "
					                        "the extension's objects were changed by hand.")));
				}
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
