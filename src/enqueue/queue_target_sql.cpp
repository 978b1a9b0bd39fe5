// outbox.current_ring_member(): the member this transaction's events go into (schema 0.4.0), for
// the view's INSERT trigger. The same look-up enqueue makes (queue_target.cpp: the latest
// snapshot, the member locked, read again when the retention held it), so rows written by hand
// follow a rotation as enqueue's do, under REPEATABLE READ too, and one transaction's rows of
// both kinds go into one member.
#include "enqueue/queue_target.hpp"
#include "shared/boundary.hpp"

OUTBOX_SQL_FUNCTION(outbox_current_ring_member) {
	(void)fcinfo; // no arguments
	outbox::QueueTarget target = outbox::CurrentQueueTarget();
	if (target.member == outbox::kNoMember) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		                errmsg("outbox.events is not the view of schema 0.4.0 in this database"),
		                errhint("outbox.current_ring_member() is for the view's INSERT trigger.")));
	}
	PG_RETURN_INT16(int16(target.member));
}
