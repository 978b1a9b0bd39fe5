// outbox.truncate_ring_member(member): the one TRUNCATE of a ring member (schema 0.4.0), the
// last step of the ring's retention (outbox.ring_retention() in the 0.3.0 -> 0.4.0 script,
// DESIGN.md "Retention"). Why it may drop the member's rows: the caller holds the member's ACCESS
// EXCLUSIVE lock, so every transaction that wrote into it has ended (a writer holds ROW EXCLUSIVE
// to its end, a prepared one too) and none writes while we look; the member is sealed; and the
// last row it holds, read with the latest snapshot (a REPEATABLE READ caller's snapshot could miss
// rows committed after it began), is at or below every relay cursor. A cursor has passed a row only
// once the row is published (its landed row goes with the member) or copied whole into
// outbox.event_state (which stays, and outbox.events shows it on its own; but a row of an event
// given up, status 'discarded', goes with the member). Cursors are read with
// the latest snapshot too: an older position only says "not yet".
#include "enqueue/generation_guard.hpp"
#include "enqueue/queue_target.hpp"
#include "shared/boundary.hpp"

extern "C" {
#include "access/xlog.h"
#if PG_VERSION_NUM >= 150000
#include "access/xlogrecovery.h"
#endif
#include "executor/spi.h"
#include "funcapi.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/pg_lsn.h"
#include "utils/snapmgr.h"
}

namespace {

// The lowest cursor of the slots the relay ran with last: the worker count whose cursor moved
// last, and only when every slot 0 .. n-1 of it has a row (a slot without one starts lower, at
// ring_start or at an older count's lowest cursor, and has passed nothing). Its rows start at the
// lowest cursor of the count before, so they cover what that count passed. A cursor above the
// WAL position ($1) was not written by a relay (a restored dump, or by hand): nothing is passed.
// No row: nothing is passed. A slot's hole (an open writer its cursor passed, whose rows from its
// lowest stamp up to the cursor are still to be walked) counts as a cursor of that slot just below
// that stamp: the hole's writer may have committed and let go of its member lock already.
constexpr const char *kLowestCursorSql =
    "SELECT p.order_lsn, p.id, c.n_workers, c.worker FROM outbox.cursors c, "
    "       (SELECT o.n_workers FROM outbox.cursors o ORDER BY o.updated_at DESC, o.n_workers DESC LIMIT 1) n, "
    "       LATERAL (SELECT c.order_lsn, c.id "
    "                UNION ALL SELECT h.f, (-9223372036854775807)::bigint - 1 FROM pg_catalog.unnest(c.hole_froms) h(f)) p "
    "WHERE c.n_workers = n.n_workers "
    "  AND (SELECT count(DISTINCT k.worker) FROM outbox.cursors k "
    "       WHERE k.n_workers = n.n_workers AND k.worker >= 0 AND k.worker < n.n_workers) = n.n_workers "
    "  AND NOT EXISTS (SELECT FROM outbox.cursors f WHERE f.order_lsn > $1) "
    "ORDER BY p.order_lsn, p.id, c.worker LIMIT 1";

// When kLowestCursorSql finds nothing, why: the count that moved last, its first slot without a
// row, and whether a cursor lies above the WAL position.
constexpr const char *kFloorProblemSql =
    "SELECT n.n_workers, "
    "       (SELECT min(w.worker) FROM (SELECT 0 AS worker UNION ALL "
    "                                   SELECT k.worker + 1 FROM outbox.cursors k WHERE k.n_workers = n.n_workers) w "
    "        WHERE w.worker < n.n_workers AND NOT EXISTS (SELECT FROM outbox.cursors k "
    "                                                     WHERE k.n_workers = n.n_workers AND k.worker = w.worker)), "
    "       EXISTS (SELECT FROM outbox.cursors f WHERE f.order_lsn > $1) "
    "FROM (SELECT o.n_workers FROM outbox.cursors o ORDER BY o.updated_at DESC, o.n_workers DESC LIMIT 1) n";

// Runs sql with the latest snapshot; returns SPI_processed.
uint64
RunLatest(const char *sql, int nargs, Oid *types, Datum *values, int expected) {
	SPIPlanPtr plan = SPI_prepare(sql, nargs, types);
	if (plan == nullptr) {
		elog(ERROR, "outbox: could not prepare \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	}
	Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
	int rc = SPI_execute_snapshot(plan, values, nullptr, snapshot, InvalidSnapshot, false, true, 0);
	UnregisterSnapshot(snapshot);
	if (rc != expected) {
		elog(ERROR, "outbox: \"%s\" failed: %s", sql, SPI_result_code_string(rc));
	}
	SPI_freeplan(plan);
	return SPI_processed;
}

bool
ColumnIsNull(int row, int column) {
	bool isnull;
	SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, column, &isnull);
	return isnull;
}

Datum
Column(int row, int column) {
	bool isnull;
	return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, column, &isnull);
}

// Where every relay cursor has passed (the floor above), read with the latest snapshot; with
// SPI connected. When nothing is passed, problem says why (palloc'd). The one reading of the
// floor: the TRUNCATE below and outbox.ring_status (through outbox.ring_cursor_floor()).
struct CursorFloor {
	bool passed;
	XLogRecPtr lsn;
	int64 id;
	int32 n_workers;
	int32 worker;
	const char *problem;
};

CursorFloor
ReadCursorFloor() {
	// On a hot standby (ring_status is read there) the position replayed: no insert position.
	Oid lsn_type[1] = {PG_LSNOID};
	Datum wal[1] = {LSNGetDatum(RecoveryInProgress() ? GetXLogReplayRecPtr(nullptr) : GetXLogInsertRecPtr())};
	CursorFloor floor = {false, InvalidXLogRecPtr, 0, 0, 0, nullptr};
	if (RunLatest(kLowestCursorSql, 1, lsn_type, wal, SPI_OK_SELECT) == 1) {
		floor.passed = true;
		floor.lsn = DatumGetLSN(Column(0, 1));
		floor.id = DatumGetInt64(Column(0, 2));
		floor.n_workers = DatumGetInt32(Column(0, 3));
		floor.worker = DatumGetInt32(Column(0, 4));
		return floor;
	}
	if (RunLatest(kFloorProblemSql, 1, lsn_type, wal, SPI_OK_SELECT) == 0) {
		floor.problem = "no relay cursor yet (no relay has published from the ring)";
	} else if (!ColumnIsNull(0, 2)) {
		floor.problem = psprintf("no cursor of worker slot %d (n_workers %d) yet", DatumGetInt32(Column(0, 2)),
		                         DatumGetInt32(Column(0, 1)));
	} else if (DatumGetBool(Column(0, 3))) {
		floor.problem = "a cursor lies above the WAL insert position (not a relay's: set by hand or restored)";
	} else {
		floor.problem = "no complete set of relay cursors";
	}
	return floor;
}

} // namespace

// outbox.ring_cursor_floor(): ReadCursorFloor() as one row (order_lsn, id, n_workers, worker,
// problem), for outbox.ring_status.
OUTBOX_SQL_FUNCTION(outbox_ring_cursor_floor) {
	TupleDesc tupdesc;
	if (get_call_result_type(fcinfo, nullptr, &tupdesc) != TYPEFUNC_COMPOSITE) {
		elog(ERROR, "outbox: ring_cursor_floor() must return a row");
	}
	tupdesc = BlessTupleDesc(tupdesc);
	MemoryContext caller = CurrentMemoryContext;
	if (SPI_connect() != SPI_OK_CONNECT) {
		elog(ERROR, "outbox: SPI_connect failed");
	}
	CursorFloor floor = ReadCursorFloor();
	Datum values[5] = {};
	bool nulls[5] = {true, true, true, true, true};
	if (floor.passed) {
		values[0] = LSNGetDatum(floor.lsn);
		values[1] = Int64GetDatum(floor.id);
		values[2] = Int32GetDatum(floor.n_workers);
		values[3] = Int32GetDatum(floor.worker);
		nulls[0] = nulls[1] = nulls[2] = nulls[3] = false;
	} else {
		MemoryContext spi = MemoryContextSwitchTo(caller); // the text outlives SPI_finish
		values[4] = CStringGetTextDatum(floor.problem);
		nulls[4] = false;
		MemoryContextSwitchTo(spi);
	}
	SPI_finish();
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

OUTBOX_SQL_FUNCTION(outbox_truncate_ring_member) {
	int member = PG_GETARG_INT16(0);
	if (member < 0 || member >= outbox::kRingMembers) {
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("no ring member %d", member),
		                errhint("The ring's members are 0 to %d.", outbox::kRingMembers - 1)));
	}
	const char *name = outbox::RingMemberName(member);
	Oid rel = outbox::RingMemberRelation(member);
	if (!OidIsValid(rel) || get_rel_relkind(rel) != RELKIND_RELATION) {
		ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE), errmsg("outbox.%s is not a table of the ring", name),
		                errhint("The extension's objects were changed by hand.")));
	}
	LOCKTAG tag;
	SET_LOCKTAG_RELATION(tag, MyDatabaseId, rel);
	if (!OutboxLockHeldByMe(&tag, AccessExclusiveLock)) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		                errmsg("outbox.truncate_ring_member() needs the ACCESS EXCLUSIVE lock of outbox.%s", name),
		                errhint("Call outbox.purge(): it takes the lock and checks the member first.")));
	}
	if (SPI_connect() != SPI_OK_CONNECT) {
		elog(ERROR, "outbox: SPI_connect failed");
	}
	Oid int2_type[1] = {INT2OID};
	Datum member_value[1] = {Int16GetDatum(int16(member))};
	RunLatest("SELECT g.is_current, g.sealed_at FROM outbox.ring g WHERE g.member = $1", 1, int2_type, member_value,
	          SPI_OK_SELECT);
	if (SPI_processed != 1 || DatumGetBool(Column(0, 1)) || ColumnIsNull(0, 2)) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		                errmsg("outbox.%s is not a sealed member of the ring", name),
		                errhint("Only a member outbox.ring shows sealed (not current, sealed_at set) is emptied.")));
	}

	char *last_sql = psprintf("SELECT e.order_lsn, e.id FROM outbox.%s e ORDER BY e.order_lsn DESC, e.id DESC LIMIT 1", name);
	RunLatest(last_sql, 0, nullptr, nullptr, SPI_OK_SELECT);
	bool empty = SPI_processed == 0;
	XLogRecPtr last_lsn = empty ? InvalidXLogRecPtr : DatumGetLSN(Column(0, 1));
	int64 last_id = empty ? 0 : DatumGetInt64(Column(0, 2));
	if (!empty) {
		CursorFloor floor = ReadCursorFloor();
		if (!floor.passed || last_lsn > floor.lsn || (last_lsn == floor.lsn && last_id > floor.id)) {
			SPI_finish();
			PG_RETURN_INT64(-1);
		}
	}

	RunLatest("DELETE FROM outbox.landed l WHERE l.member = $1 RETURNING pg_catalog.cardinality(l.ids)::bigint", 1,
	          int2_type, member_value, SPI_OK_DELETE_RETURNING);
	int64 removed = 0;
	for (uint64 i = 0; i < SPI_processed; i++) {
		removed += DatumGetInt64(Column(int(i), 1));
	}
	// Events given up (a DELETE from outbox.events): their rows only hid the member's rows.
	RunLatest("DELETE FROM outbox.event_state s WHERE s.member = $1 AND s.status = 'discarded'", 1, int2_type,
	          member_value, SPI_OK_DELETE);

	char *truncate_sql = psprintf("TRUNCATE outbox.%s", name);
	outbox::AllowMemberTruncate(rel);
	PG_TRY();
	{
		int rc = SPI_execute(truncate_sql, false, 0);
		if (rc != SPI_OK_UTILITY) {
			elog(ERROR, "outbox: %s failed: %s", truncate_sql, SPI_result_code_string(rc));
		}
	}
	PG_FINALLY();
	{
		outbox::EndMemberTruncate();
	}
	PG_END_TRY();
	SPI_finish();
	PG_RETURN_INT64(removed);
}
