// outbox::RingKeepsEventId and outbox.ring_keeps_event_id(uuid), for enqueue and the view's INSERT
// trigger (ring_dedup.hpp). Under READ COMMITTED the statement's own snapshot is fresh and enqueue's
// INSERT probes the members itself (enqueue.cpp InsertPlan); an id committed by another
// transaction at the same moment, into another member, is the one duplicate left (DESIGN.md
// "Retention"). On schema 0.4.1 only a caller's id has an entry in its member's unique index
// (WHERE caller_event_id): a probe of a member names that predicate, so that it probes the index
// and looks for caller ids only (an id enqueue generated is not deduplicated).
#include "enqueue/ring_dedup.hpp"
#include "enqueue/queue_target.hpp"
#include "shared/boundary.hpp"

extern "C" {
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/snapmgr.h"
}

namespace outbox {

namespace {

// One plan per member shape (0.4.0's, 0.4.1's): a backend outlives an ALTER EXTENSION UPDATE.
SPIPlanPtr
ProbePlan(bool caller_column) {
	static SPIPlanPtr plans[2] = {};
	SPIPlanPtr &plan = plans[caller_column ? 1 : 0];
	if (plan == nullptr) {
		const char *tables[kEventIdTables];
		int n = EventIdTables(kNoMember, tables);
		StringInfoData sql;
		initStringInfo(&sql);
		for (int i = 0; i < n; i++) {
			appendStringInfoString(&sql, i ? " UNION ALL " : "");
			AppendEventIdProbe(&sql, tables[i], caller_column);
		}
		appendStringInfoString(&sql, " LIMIT 1");
		Oid types[1] = {UUIDOID};
		SPIPlanPtr p = SPI_prepare(sql.data, 1, types);
		pfree(sql.data);
		if (p == nullptr) {
			elog(ERROR, "outbox: could not prepare the event id probe: %s", SPI_result_code_string(SPI_result));
		}
		SPI_keepplan(p);
		plan = p;
	}
	return plan;
}

} // namespace

int
EventIdTables(int except, const char *names[kEventIdTables]) {
	int n = 0;
	for (int member = 0; member < kRingMembers; member++) {
		if (member != except) {
			names[n++] = RingMemberName(member);
		}
	}
	names[n++] = "event_state";
	return n;
}

void
AppendEventIdProbe(StringInfo sql, const char *table, bool caller_column) {
	// A member (every table of EventIdTables' but event_state) of schema 0.4.1: its partial index.
	bool member = strcmp(table, "event_state") != 0;
	appendStringInfo(sql, "SELECT FROM outbox.%s o WHERE o.event_id = $1%s", table,
	                 member && caller_column ? " AND o.caller_event_id" : "");
}

bool
RingKeepsEventId(Datum event_id, bool caller_column) {
	SPIPlanPtr plan = ProbePlan(caller_column);
	Datum values[1] = {event_id};
	Snapshot latest = RegisterSnapshot(GetLatestSnapshot());
	int rc = SPI_execute_snapshot(plan, values, nullptr, latest, InvalidSnapshot, true, false, 1);
	UnregisterSnapshot(latest);
	if (rc != SPI_OK_SELECT) {
		elog(ERROR, "outbox: the event id probe failed: %s", SPI_result_code_string(rc));
	}
	if (SPI_processed == 0) {
		return false;
	}
	if (IsolationUsesXactSnapshot()) {
		rc = SPI_execute_plan(plan, values, nullptr, true, 1); // the transaction's snapshot
		if (rc != SPI_OK_SELECT) {
			elog(ERROR, "outbox: the event id probe failed: %s", SPI_result_code_string(rc));
		}
		if (SPI_processed == 0) {
			ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			                errmsg("could not serialize access: an outbox event with this event_id was committed "
			                       "by a concurrent transaction"),
			                errhint("Retry the transaction: it will see the event (outbox.enqueue() then returns "
			                        "NULL for the duplicate).")));
		}
	}
	return true;
}

} // namespace outbox

OUTBOX_SQL_FUNCTION(outbox_ring_keeps_event_id) {
	Datum event_id = PG_GETARG_DATUM(0);
	// The members' shape as enqueue sees it (the view's INSERT trigger asked for the current
	// member already: the same target, locked).
	bool caller_column = outbox::CurrentQueueTarget().caller_column;
	if (SPI_connect() != SPI_OK_CONNECT) {
		elog(ERROR, "outbox: SPI_connect failed");
	}
	bool kept = outbox::RingKeepsEventId(event_id, caller_column);
	SPI_finish();
	PG_RETURN_BOOL(kept);
}
