// The BEFORE INSERT trigger of a generation table (DESIGN.md "The insert-only queue"): every row,
// whoever writes it (enqueue, the view's INSTEAD OF INSERT, an INSERT or COPY by hand), is held to
// the row rules (row_check.cpp: the members have no CHECK, whose expression PostgreSQL would parse
// again at every statement), then registers its transaction in the registry of open writers and
// only then gets its order_lsn (the WAL insert position) and its writer (the top-level
// transaction id). The rules need not run on UPDATE: the guard (generation_guard.cpp) lets only
// the re-stamp's raise of order_lsn through, every other column unchanged. Its SQL object comes
// with the schema that has the generation tables.
#include "enqueue/row_check.hpp"
#include "shared/open_writers.hpp"
#include "shared/boundary.hpp"

extern "C" {
#include "catalog/namespace.h" // get_namespace_oid
#include "commands/trigger.h"
#include "utils/rel.h"
#include "utils/xid8.h" // FullTransactionIdGetDatum
}

OUTBOX_SQL_FUNCTION(outbox_generation_stamp) {
	if (!CALLED_AS_TRIGGER(fcinfo)) {
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("outbox_generation_stamp() must be called as a trigger")));
	}
	auto *trigger = reinterpret_cast<TriggerData *>(fcinfo->context);
	if (!TRIGGER_FIRED_BEFORE(trigger->tg_event) || !TRIGGER_FIRED_FOR_ROW(trigger->tg_event) ||
	    !TRIGGER_FIRED_BY_INSERT(trigger->tg_event)) {
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
		                errmsg("outbox_generation_stamp() must be a BEFORE INSERT ... FOR EACH ROW trigger")));
	}
	Relation rel = trigger->tg_relation;
	// Before the registration: a refused row leaves nothing behind. The rules are the ring
	// members' (schema outbox, the extension's own); a table of another schema with the trigger
	// (the open-writer tests' generation tables) has the stamp columns only.
	if (RelationGetNamespace(rel) == get_namespace_oid("outbox", true)) {
		outbox::CheckMemberRow(rel, trigger->tg_trigtuple);
	}
	AttrNumber order_lsn, writer;
	outbox::GenerationColumns(rel, &order_lsn, &writer);
	int columns[2] = {order_lsn, writer};
	// The registration first: the stamp is read after it (open_writers.cpp).
	XLogRecPtr stamp = outbox::StampOpenWriterRow();
	Datum values[2] = {LSNGetDatum(stamp), FullTransactionIdGetDatum(GetTopFullTransactionId())};
	bool nulls[2] = {false, false};
	HeapTuple stamped =
	    heap_modify_tuple_by_cols(trigger->tg_trigtuple, RelationGetDescr(rel), 2, columns, values, nulls);
	return PointerGetDatum(stamped);
}
