// The relay's reserve of prepared-transaction slots. See prepared_reserve.hpp.
#include "launcher/prepared_reserve.hpp"

#include "shared/guc.hpp"
#include "shared/pg_include.hpp"

namespace outbox {

void
RefusePrepareIntoRelayReserve() {
	if (settings.delivery != int(Delivery::ExactlyOnce) || settings.max_workers <= 0 || max_prepared_xacts <= 0 ||
	    IsAbortedTransactionBlockState()) {
		return; // an aborted block's PREPARE is a ROLLBACK: it takes no slot
	}
	// Every prepared transaction but the relay's own batches (its role's, under its gids).
	// Two PREPAREs checked at the same moment may both pass and take one slot of the reserve: it
	// keeps a role from filling the slots, it is not an exact count.
	if (SPI_connect() != SPI_OK_CONNECT) {
		elog(ERROR, "outbox: SPI_connect failed");
	}
	Oid types[1] = {TEXTOID};
	Datum values[1] = {CStringGetTextDatum(settings.relay_role)};
	int rc = SPI_execute_with_args("SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_xacts p "
	                               "WHERE NOT (pg_catalog.starts_with(p.gid, 'outbox:') "
	                               "           AND p.owner::pg_catalog.text OPERATOR(pg_catalog.=) $1)",
	                               1, types, values, nullptr, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1) {
		elog(ERROR, "outbox: could not count the prepared transactions: %s", SPI_result_code_string(rc));
	}
	bool isnull;
	int64 in_use = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	int others = max_prepared_xacts - settings.max_workers;
	if (in_use < others) {
		return;
	}
	ereport(ERROR, (errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
	                errmsg("prepared transaction slots are reserved for the outbox relay"),
	                errdetail("%lld of the %d slots that max_prepared_transactions = %d leaves besides the relay's "
	                          "reserve (outbox.max_workers = %d, outbox.delivery = exactly_once) are in use.",
	                          (long long)in_use, Max(others, 0), max_prepared_xacts, settings.max_workers),
	                errhint("Raise max_prepared_transactions (a restart), or COMMIT PREPARED / ROLLBACK PREPARED "
	                        "the transactions left in pg_prepared_xacts.")));
}

} // namespace outbox
