// Test builds only: a claim over a table stamped by outbox_generation_stamp, without the relay
// (DESIGN.md "The insert-only queue", build order step 1). Tests create the SQL function by hand:
//   CREATE FUNCTION test_claim(regclass, pg_lsn, boolean, OUT horizon pg_lsn, OUT ids bigint[])
//     LANGUAGE C AS '$libdir/outbox', 'outbox_test_claim';
// It returns the horizon and the ids of the rows from `from` (inclusive: the last claim's horizon) and below the horizon that the
// claim's snapshot sees, in (order_lsn, id) order. `use_registry = false` claims up to the WAL
// insert position, ignoring the registry: what the tests show would lose rows.
#ifdef OUTBOX_TEST_SEAMS

#include "shared/open_writers.hpp"
#include "shared/boundary.hpp"

extern "C" {
#include "utils/lsyscache.h"
}

OUTBOX_SQL_FUNCTION(outbox_test_claim) {
	Oid table = PG_GETARG_OID(0);
	XLogRecPtr from = PG_GETARG_LSN(1);
	bool use_registry = PG_GETARG_BOOL(2);
	TupleDesc result_desc;
	if (get_call_result_type(fcinfo, nullptr, &result_desc) != TYPEFUNC_COMPOSITE) {
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED), errmsg("outbox_test_claim must return a record")));
	}
	char *name = quote_qualified_identifier(get_namespace_name(get_rel_namespace(table)), get_rel_name(table));
	if (SPI_connect() != SPI_OK_CONNECT) {
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("SPI_connect failed")));
	}
	outbox::ClaimView view;
	if (use_registry) {
		view = outbox::TakeClaimView(MyDatabaseId, &table, 1);
	} else {
		XLogRecPtr wal_insert = GetXLogInsertRecPtr();
		view = outbox::ClaimView{wal_insert, RegisterSnapshot(GetLatestSnapshot())};
	}
	Oid types[2] = {PG_LSNOID, PG_LSNOID};
	Datum args[2] = {LSNGetDatum(from), LSNGetDatum(view.horizon)};
	PushActiveSnapshot(view.snapshot);
	int rc = SPI_execute_with_args(psprintf("SELECT pg_catalog.array_agg(id ORDER BY order_lsn, id) FROM %s "
	                                        "WHERE order_lsn OPERATOR(pg_catalog.>=) $1 "
	                                        "AND order_lsn OPERATOR(pg_catalog.<) $2", name),
	                               2, types, args, nullptr, true, 0);
	PopActiveSnapshot();
	UnregisterSnapshot(view.snapshot);
	if (rc != SPI_OK_SELECT || SPI_processed != 1) {
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("outbox_test_claim: the claim query failed")));
	}
	bool ids_null;
	Datum ids = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &ids_null);
	if (!ids_null) {
		ids = SPI_datumTransfer(ids, false, -1);
	}
	SPI_finish();
	Datum values[2] = {LSNGetDatum(view.horizon), ids};
	bool nulls[2] = {false, ids_null};
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(result_desc), values, nulls));
}

#endif
