// outbox.truncate_ring_member(member): the one TRUNCATE of a ring member (schema 0.4.0), the
// last step of the ring's retention (outbox.ring_retention() in the 0.3.0 -> 0.4.0 script,
// DESIGN.md "Retention"). Why it may drop the member's rows: the caller holds the member's ACCESS
// EXCLUSIVE lock, so every transaction that wrote into it has ended (a writer holds ROW EXCLUSIVE
// to its end, a prepared one too) and none writes while we look; the member is sealed; and the
// last row it holds, read with the latest snapshot (a REPEATABLE READ caller's snapshot could miss
// rows committed after it began), is at or below every relay cursor. A cursor has passed a row only
// once the row is published (its landed row goes with the member) or copied whole into
// outbox.event_state (which stays, and outbox.events shows it on its own). Cursors are read with
// the latest snapshot too: an older position only says "not yet".
#include "enqueue/generation_guard.hpp"
#include "enqueue/queue_target.hpp"
#include "shared/boundary.hpp"

extern "C" {
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/pg_lsn.h"
#include "utils/snapmgr.h"
}

namespace {

// The lowest cursor of the slots the relay ran with last: the worker count whose cursor moved
// last, and only when every slot 0 .. n-1 of it has a row (a slot without one starts lower, at
// ring_start or at an older count's lowest cursor, and has passed nothing). Its rows start at the
// lowest cursor of the count before, so they cover what that count passed. A cursor above the
// WAL insert position was not written by a relay (a restored dump, or by hand): nothing is
// passed. No row: nothing is passed.
constexpr const char *kLowestCursorSql =
    "SELECT c.order_lsn, c.id FROM outbox.cursors c, "
    "       (SELECT o.n_workers FROM outbox.cursors o ORDER BY o.updated_at DESC, o.n_workers DESC LIMIT 1) n "
    "WHERE c.n_workers = n.n_workers "
    "  AND (SELECT count(DISTINCT k.worker) FROM outbox.cursors k "
    "       WHERE k.n_workers = n.n_workers AND k.worker >= 0 AND k.worker < n.n_workers) = n.n_workers "
    "  AND NOT EXISTS (SELECT FROM outbox.cursors f WHERE f.order_lsn > pg_catalog.pg_current_wal_insert_lsn()) "
    "ORDER BY c.order_lsn, c.id LIMIT 1";

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

} // namespace

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
#if PG_VERSION_NUM >= 170000
	bool locked = LockHeldByMe(&tag, AccessExclusiveLock, false);
#else
	bool locked = LockHeldByMe(&tag, AccessExclusiveLock);
#endif
	if (!locked) {
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
		RunLatest(kLowestCursorSql, 0, nullptr, nullptr, SPI_OK_SELECT);
		if (SPI_processed == 0) {
			SPI_finish();
			PG_RETURN_INT64(-1); // no relay slot has run yet
		}
		XLogRecPtr cursor_lsn = DatumGetLSN(Column(0, 1));
		int64 cursor_id = DatumGetInt64(Column(0, 2));
		if (last_lsn > cursor_lsn || (last_lsn == cursor_lsn && last_id > cursor_id)) {
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
