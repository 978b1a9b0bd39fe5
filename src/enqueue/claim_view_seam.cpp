// Test builds only: a claim over a table stamped by outbox_generation_stamp, without the relay
// (DESIGN.md "The insert-only queue", build order step 1). Tests create the SQL function by hand:
//   CREATE FUNCTION test_claim(regclass, pg_lsn, text, xid8[], pg_lsn[], OUT cursor pg_lsn,
//     OUT ids bigint[], OUT hole_xids xid8[], OUT hole_froms pg_lsn[], OUT open_xids xid8[])
//     LANGUAGE C AS '$libdir/outbox', 'outbox_test_claim';
// Given a slot's cursor (the rows below it were taken) and its holes (open writers it passed: the
// transaction and its lowest stamp), it returns the ids it takes, in the order taken, and the new
// cursor and holes, and the open writers the claim saw. Modes:
//   'horizon'  up to the safe horizon, no holes;
//   'holes'    up to the WAL insert position: the open writers below it become holes, and a hole
//              no longer in progress has its rows from its lowest stamp up to the cursor taken first;
//   'wal'      up to the WAL insert position, ignoring the registry: what the tests show loses rows.
#ifdef OUTBOX_TEST_SEAMS

#include "shared/open_writers.hpp"
#include "shared/boundary.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/lsyscache.h"
#include "utils/xid8.h"
}

namespace {

// The ids `query` returns appended to ids[0 .. *n) (plain integers: they outlive SPI_finish).
void
AppendIds(const char *query, int nargs, Oid *types, Datum *args, int64 **ids, int *n, int *capacity) {
	if (SPI_execute_with_args(query, nargs, types, args, nullptr, true, 0) != SPI_OK_SELECT) {
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("outbox_test_claim: the claim query failed")));
	}
	for (uint64 i = 0; i < SPI_processed; i++) {
		bool isnull;
		int64 id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
		if (*n == *capacity) {
			*capacity *= 2;
			*ids = static_cast<int64 *>(repalloc(*ids, sizeof(int64) * *capacity)); // stays in its context
		}
		(*ids)[(*n)++] = id;
	}
}

uint64 *
Elements(ArrayType *array, Oid type, int *n) {
	Datum *values;
	bool *nulls;
	deconstruct_array(array, type, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &values, &nulls, n);
	auto *out = static_cast<uint64 *>(palloc(sizeof(uint64) * (*n + 1)));
	for (int i = 0; i < *n; i++) {
		out[i] = DatumGetUInt64(values[i]);
	}
	return out;
}

// In the current memory context (the caller's, after SPI_finish).
Datum
ArrayOf(const uint64 *values, int n, Oid type) {
	auto *datums = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
	for (int i = 0; i < n; i++) {
		datums[i] = type == INT8OID ? Int64GetDatum(int64(values[i])) : UInt64GetDatum(values[i]);
	}
	return PointerGetDatum(construct_array(datums, n, type, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

} // namespace

OUTBOX_SQL_FUNCTION(outbox_test_claim) {
	Oid table = PG_GETARG_OID(0);
	XLogRecPtr cursor = PG_GETARG_LSN(1);
	char *mode = text_to_cstring(PG_GETARG_TEXT_PP(2));
	int n_holes, n_froms;
	uint64 *hole_xids = Elements(PG_GETARG_ARRAYTYPE_P(3), XID8OID, &n_holes);
	uint64 *hole_froms = Elements(PG_GETARG_ARRAYTYPE_P(4), PG_LSNOID, &n_froms);
	bool holes = strcmp(mode, "holes") == 0;
	if ((!holes && strcmp(mode, "horizon") != 0 && strcmp(mode, "wal") != 0) || n_froms != n_holes) {
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("outbox_test_claim: bad arguments")));
	}
	TupleDesc result_desc;
	if (get_call_result_type(fcinfo, nullptr, &result_desc) != TYPEFUNC_COMPOSITE) {
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED), errmsg("outbox_test_claim must return a record")));
	}
	char *name = quote_qualified_identifier(get_namespace_name(get_rel_namespace(table)), get_rel_name(table));
	MemoryContext outer = CurrentMemoryContext; // what is returned outlives SPI_finish
	if (SPI_connect() != SPI_OK_CONNECT) {
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("SPI_connect failed")));
	}
	outbox::ClaimView view;
	XLogRecPtr target;
	if (strcmp(mode, "wal") == 0) {
		view = outbox::ClaimView{GetXLogInsertRecPtr(), RegisterSnapshot(GetLatestSnapshot()), nullptr, 0};
		target = view.wal_insert;
	} else {
		view = outbox::TakeClaimView(MyDatabaseId, &table, 1);
		target = holes ? view.wal_insert : outbox::SafeHorizon(view);
	}
	target = Max(target, cursor);
	int n_ids = 0, capacity = 64;
	auto *ids = static_cast<int64 *>(MemoryContextAlloc(outer, sizeof(int64) * capacity));
	int n_room = n_holes + view.n_open + 1;
	auto *kept_xids = static_cast<uint64 *>(MemoryContextAlloc(outer, sizeof(uint64) * n_room));
	auto *kept_froms = static_cast<uint64 *>(MemoryContextAlloc(outer, sizeof(uint64) * n_room));
	auto *open_xids = static_cast<uint64 *>(MemoryContextAlloc(outer, sizeof(uint64) * n_room));
	int n_kept = 0;
	PushActiveSnapshot(view.snapshot);
	// Holes first: a committed one's rows lie below the cursor.
	for (int i = 0; i < n_holes; i++) {
		if (outbox::InProgressIn(FullTransactionIdFromU64(hole_xids[i]), view.snapshot)) {
			kept_xids[n_kept] = hole_xids[i];
			kept_froms[n_kept++] = hole_froms[i];
			continue;
		}
		Oid types[3] = {PG_LSNOID, PG_LSNOID, XID8OID};
		Datum args[3] = {LSNGetDatum(hole_froms[i]), LSNGetDatum(cursor),
		                 FullTransactionIdGetDatum(FullTransactionIdFromU64(hole_xids[i]))};
		AppendIds(psprintf("SELECT id FROM %s WHERE order_lsn OPERATOR(pg_catalog.>=) $1 "
		                   "AND order_lsn OPERATOR(pg_catalog.<) $2 AND writer OPERATOR(pg_catalog.=) $3 "
		                   "ORDER BY order_lsn, id", name),
		          3, types, args, &ids, &n_ids, &capacity);
	}
	Oid types[2] = {PG_LSNOID, PG_LSNOID};
	Datum args[2] = {LSNGetDatum(cursor), LSNGetDatum(target)};
	AppendIds(psprintf("SELECT id FROM %s WHERE order_lsn OPERATOR(pg_catalog.>=) $1 "
	                   "AND order_lsn OPERATOR(pg_catalog.<) $2 ORDER BY order_lsn, id", name),
	          2, types, args, &ids, &n_ids, &capacity);
	PopActiveSnapshot();
	// The open writers the cursor passes become holes (those already holes stay as they were).
	for (int i = 0; i < view.n_open; i++) {
		uint64 fxid = U64FromFullTransactionId(view.open[i].fxid);
		open_xids[i] = fxid;
		bool known = false;
		for (int j = 0; j < n_kept && !known; j++) {
			known = kept_xids[j] == fxid;
		}
		if (holes && !known && view.open[i].lowest < target) {
			kept_xids[n_kept] = fxid;
			kept_froms[n_kept++] = view.open[i].lowest;
		}
	}
	int n_open = view.n_open;
	UnregisterSnapshot(view.snapshot);
	SPI_finish();
	Datum values[5] = {LSNGetDatum(target), ArrayOf(reinterpret_cast<uint64 *>(ids), n_ids, INT8OID),
	                   ArrayOf(kept_xids, n_kept, XID8OID), ArrayOf(kept_froms, n_kept, PG_LSNOID),
	                   ArrayOf(open_xids, n_open, XID8OID)};
	bool nulls[5] = {false, false, false, false, false};
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(result_desc), values, nulls));
}

#endif
