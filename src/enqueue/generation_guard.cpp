// The BEFORE UPDATE OR DELETE (per row) and BEFORE TRUNCATE (per statement) trigger of every
// generation table: a claim's cursor passes each row once, by its order_lsn, so a row whose
// stamp an UPDATE lowered, or that a DELETE took back after the cursor passed it, would break the
// claim's proof (DESIGN.md "The insert-only queue", L3). It also fires for an INSERT ... ON
// CONFLICT DO UPDATE and a MERGE that would update a row. The one UPDATE allowed is the
// commit-order re-stamp (enqueue/commit_order.cpp), while it runs (AllowGenerationRestamp), and
// only one that raises order_lsn and leaves every other column as it was. TRUNCATE is the
// retention of a sealed member: allowed only inside outbox.truncate_ring_member()
// (ring_retention_sql.cpp), for the member it checked, while its statement runs.
#include "enqueue/generation_guard.hpp"

#include "shared/boundary.hpp"

extern "C" {
#include "commands/trigger.h"
#include "utils/datum.h" // datum_image_eq
#include "utils/pg_lsn.h"
}

namespace {

// The transaction whose re-stamp runs, or InvalidLocalTransactionId.
LocalTransactionId restamp_lxid = InvalidLocalTransactionId;
// The transaction and member whose retention TRUNCATE runs.
LocalTransactionId truncate_lxid = InvalidLocalTransactionId;
Oid truncate_rel = InvalidOid;

[[noreturn]] void
Refuse(Relation rel, const char *what) {
	ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
	                errmsg("cannot %s outbox.%s: the outbox queue is insert-only", what, RelationGetRelationName(rel)),
	                errdetail("Its rows are read by the relay's cursors in order_lsn order; a row changed or removed "
	                          "after a cursor passed it would be lost or sent out of order."),
	                errhint("outbox.retry() and outbox.retry_failed() put failed events back; outbox.purge() is the "
	                        "retention."),
	                err_generic_string(PG_DIAG_SCHEMA_NAME, "outbox"),
	                err_generic_string(PG_DIAG_TABLE_NAME, RelationGetRelationName(rel))));
	pg_unreachable();
}

// The re-stamp's UPDATE: only order_lsn changes, and only upwards.
bool
OnlyRaisesOrderLsn(Relation rel, HeapTuple old_tuple, HeapTuple new_tuple) {
	TupleDesc desc = RelationGetDescr(rel);
	AttrNumber order_lsn = InvalidAttrNumber;
	for (int i = 0; i < desc->natts; i++) {
		Form_pg_attribute att = TupleDescAttr(desc, i);
		if (att->attisdropped) {
			continue;
		}
		bool old_null, new_null;
		Datum old_value = heap_getattr(old_tuple, i + 1, desc, &old_null);
		Datum new_value = heap_getattr(new_tuple, i + 1, desc, &new_null);
		if (strcmp(NameStr(att->attname), "order_lsn") == 0 && att->atttypid == PG_LSNOID) {
			order_lsn = AttrNumber(i + 1);
			if (old_null || new_null || DatumGetLSN(new_value) <= DatumGetLSN(old_value)) {
				return false;
			}
			continue;
		}
		if (old_null != new_null ||
		    (!old_null && !datum_image_eq(old_value, new_value, att->attbyval, att->attlen))) {
			return false;
		}
	}
	return order_lsn != InvalidAttrNumber;
}

} // namespace

namespace outbox {

void
AllowGenerationRestamp() noexcept {
	restamp_lxid = OutboxLocalTransactionId();
}

void
EndGenerationRestamp() noexcept {
	restamp_lxid = InvalidLocalTransactionId;
}

void
AllowMemberTruncate(Oid member) noexcept {
	truncate_lxid = OutboxLocalTransactionId();
	truncate_rel = member;
}

void
EndMemberTruncate() noexcept {
	truncate_lxid = InvalidLocalTransactionId;
	truncate_rel = InvalidOid;
}

} // namespace outbox

OUTBOX_SQL_FUNCTION(outbox_generation_guard) {
	if (!CALLED_AS_TRIGGER(fcinfo)) {
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("outbox_generation_guard() must be called as a trigger")));
	}
	auto *trigger = reinterpret_cast<TriggerData *>(fcinfo->context);
	Relation rel = trigger->tg_relation;
	if (!TRIGGER_FIRED_BEFORE(trigger->tg_event)) {
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("outbox_generation_guard() must be a BEFORE trigger")));
	}
	if (TRIGGER_FIRED_BY_TRUNCATE(trigger->tg_event)) {
		if (truncate_lxid == InvalidLocalTransactionId || truncate_lxid != OutboxLocalTransactionId() ||
		    truncate_rel != RelationGetRelid(rel)) {
			Refuse(rel, "truncate");
		}
		return PointerGetDatum(nullptr);
	}
	if (!TRIGGER_FIRED_FOR_ROW(trigger->tg_event)) {
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("outbox_generation_guard() must be FOR EACH ROW for UPDATE and DELETE")));
	}
	if (TRIGGER_FIRED_BY_DELETE(trigger->tg_event)) {
		Refuse(rel, "delete from");
	}
	if (!TRIGGER_FIRED_BY_UPDATE(trigger->tg_event)) {
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("outbox_generation_guard() is for UPDATE, DELETE and TRUNCATE")));
	}
	bool allowed = restamp_lxid != InvalidLocalTransactionId && restamp_lxid == OutboxLocalTransactionId() &&
	               OnlyRaisesOrderLsn(rel, trigger->tg_trigtuple, trigger->tg_newtuple);
	if (!allowed) {
		Refuse(rel, "update");
	}
	return PointerGetDatum(trigger->tg_newtuple);
}
