// outbox.worker_status(): this database's relay workers' shared-memory slots as rows (behind
// outbox.workers), and outbox.launcher_status(): the launcher's databases (behind outbox.launcher).
#include "shared/boundary.hpp"
#include "shared/guc.hpp"
#include "shared/shmem.hpp"
#include "relay/sql_rows.hpp"

namespace {

// 0.3.0 added recovered_at at the end; a 0.2.0 schema (before ALTER EXTENSION UPDATE) declares
// the first ten, and gets those.
constexpr int kColumns = 11;
constexpr int kLauncherColumns = 7;

Datum
TimestampOrNull(TimestampTz t, bool *isnull) {
	*isnull = t == 0;
	return TimestampTzGetDatum(t);
}

// The launcher's row for database `db` (false: it has none).
bool
LauncherRowOf(Oid db, outbox::DatabaseRow *out) {
	bool found = false;
	SpinLockAcquire(&outbox::shared->launcher.mutex);
	for (int i = 0; i < outbox::shared->launcher.n_rows && !found; i++) {
		if (outbox::shared->launcher.rows[i].database == db) {
			*out = outbox::shared->launcher.rows[i];
			found = true;
		}
	}
	SpinLockRelease(&outbox::shared->launcher.mutex);
	out->last_error[sizeof(out->last_error) - 1] = '\0';
	return found;
}

} // namespace

// One row per worker of this database: its slot, or, for workers the budget left out, a row in
// state 'no worker slot' with the reason.
OUTBOX_SQL_FUNCTION(outbox_worker_status) {
	Tuplestorestate *store = BeginRows(fcinfo, "outbox.worker_status()");
	TupleDesc desc = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo)->setDesc;
	if (outbox::shared == nullptr) {
		return Datum(0);
	}
	if (desc->natts != kColumns && desc->natts != kColumns - 1) {
		elog(ERROR, "outbox.worker_status() declares %d columns, this library returns %d: run ALTER EXTENSION "
		            "outbox UPDATE", desc->natts, kColumns);
	}
	outbox::WorkerSlot copies[outbox::kMaxWorkers];
	bool have[outbox::kMaxWorkers] = {false};
	int n_workers = 0;
	for (int s = 0; s < outbox::kMaxSlots; s++) {
		outbox::WorkerSlot *slot = outbox::SlotOf(s);
		outbox::WorkerSlot copy;
		SpinLockAcquire(&slot->mutex);
		memcpy(&copy, slot, sizeof(copy));
		SpinLockRelease(&slot->mutex);
		if (copy.database == MyDatabaseId && copy.index >= 0 && copy.index < outbox::kMaxWorkers) {
			copies[copy.index] = copy;
			have[copy.index] = true;
			n_workers = Max(n_workers, copy.n_workers);
		}
	}
	outbox::DatabaseRow row;
	bool no_slot = n_workers == 0 && LauncherRowOf(MyDatabaseId, &row) && row.state == outbox::DatabaseState::NoWorkerSlot;
	if (no_slot) {
		n_workers = Min(row.workers, outbox::kMaxWorkers);
	}
	for (int i = 0; i < n_workers; i++) {
		Datum values[kColumns];
		bool nulls[kColumns] = {false};
		values[0] = Int32GetDatum(i);
		if (!have[i]) {
			// Left out by the budget, or reserved and not started yet.
			memset(&copies[i], 0, sizeof(copies[i]));
			copies[i].state = no_slot ? outbox::WorkerState::NoWorkerSlot : outbox::WorkerState::Starting;
			if (no_slot) {
				strlcpy(copies[i].last_error, row.last_error, sizeof(copies[i].last_error));
				copies[i].last_error_at = row.last_error_at;
			}
		}
		const outbox::WorkerSlot &copy = copies[i];
		values[1] = Int32GetDatum(copy.pid);
		nulls[1] = copy.pid == 0;
		values[2] = CStringGetTextDatum(outbox::WorkerStateName(copy.state));
		values[3] = Int64GetDatum(int64(copy.published));
		values[4] = Int64GetDatum(int64(copy.failed));
		char last_error[sizeof(copy.last_error)];
		strlcpy(last_error, copy.last_error, sizeof(last_error));
		values[5] = CStringGetTextDatum(last_error);
		nulls[5] = last_error[0] == '\0';
		values[6] = TimestampOrNull(copy.last_error_at, &nulls[6]);
		values[7] = TimestampOrNull(copy.last_publish_at, &nulls[7]);
		values[8] = CStringGetTextDatum(outbox::BrokerStateName(copy.broker));
		values[9] = TimestampOrNull(copy.started_at, &nulls[9]);
		values[10] = TimestampOrNull(copy.recovered_at, &nulls[10]);
		tuplestore_putvalues(store, desc, values, nulls);
	}
	return Datum(0);
}

// One row per database the launcher serves (the extension found, or no worker slot for it).
OUTBOX_SQL_FUNCTION(outbox_launcher_status) {
	Tuplestorestate *store = BeginRows(fcinfo, "outbox.launcher_status()");
	TupleDesc desc = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo)->setDesc;
	if (outbox::shared == nullptr) {
		return Datum(0);
	}
	outbox::DatabaseRow rows[outbox::kMaxDatabaseRows];
	SpinLockAcquire(&outbox::shared->launcher.mutex);
	int n = outbox::shared->launcher.n_rows;
	memcpy(rows, outbox::shared->launcher.rows, sizeof(rows[0]) * n);
	SpinLockRelease(&outbox::shared->launcher.mutex);
	for (int i = 0; i < n; i++) {
		const outbox::DatabaseRow &row = rows[i];
		Datum values[kLauncherColumns];
		bool nulls[kLauncherColumns] = {false};
		char name[NAMEDATALEN];
		strlcpy(name, row.name, sizeof(name));
		char last_error[sizeof(row.last_error)];
		strlcpy(last_error, row.last_error, sizeof(last_error));
		values[0] = CStringGetTextDatum(name);
		values[1] = CStringGetTextDatum(outbox::DatabaseStateName(row.state));
		values[2] = Int32GetDatum(row.workers);
		values[3] = Int32GetDatum(row.running);
		values[4] = CStringGetTextDatum(last_error);
		nulls[4] = last_error[0] == '\0';
		values[5] = TimestampOrNull(row.last_error_at, &nulls[5]);
		values[6] = Int32GetDatum(outbox::settings.max_workers);
		tuplestore_putvalues(store, desc, values, nulls);
	}
	return Datum(0);
}
