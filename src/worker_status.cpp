// outbox.worker_status(): the relay workers' shared-memory slots as rows (behind outbox.workers).
#include "boundary.hpp"
#include "guc.hpp"
#include "shmem.hpp"

namespace {

constexpr int kColumns = 10;

Datum
TimestampOrNull(TimestampTz t, bool *isnull) {
	*isnull = t == 0;
	return TimestampTzGetDatum(t);
}

} // namespace

OUTBOX_SQL_FUNCTION(outbox_worker_status) {
	ReturnSetInfo *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
	if (rsinfo == nullptr || !IsA(rsinfo, ReturnSetInfo) || !(rsinfo->allowedModes & SFRM_Materialize)) {
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
		                errmsg("outbox.worker_status() must be called in a FROM clause")));
	}
	TupleDesc desc;
	if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE) {
		elog(ERROR, "outbox.worker_status: return type must be a row type");
	}
	MemoryContext old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	Tuplestorestate *store = tuplestore_begin_heap(true, false, work_mem);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = store;
	rsinfo->setDesc = CreateTupleDescCopy(desc);
	MemoryContextSwitchTo(old);

	for (int i = 0; i < outbox::settings.workers && outbox::shared != nullptr; i++) {
		outbox::WorkerSlot copy;
		outbox::WorkerSlot *slot = outbox::SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		memcpy(&copy, slot, sizeof(copy));
		SpinLockRelease(&slot->mutex);

		Datum values[kColumns];
		bool nulls[kColumns] = {false};
		values[0] = Int32GetDatum(i);
		values[1] = Int32GetDatum(copy.pid);
		nulls[1] = copy.pid == 0;
		values[2] = CStringGetTextDatum(outbox::WorkerStateName(copy.state));
		values[3] = Int64GetDatum(int64(copy.published));
		values[4] = Int64GetDatum(int64(copy.failed));
		copy.last_error[sizeof(copy.last_error) - 1] = '\0';
		values[5] = CStringGetTextDatum(copy.last_error);
		nulls[5] = copy.last_error[0] == '\0';
		values[6] = TimestampOrNull(copy.last_error_at, &nulls[6]);
		values[7] = TimestampOrNull(copy.last_publish_at, &nulls[7]);
		values[8] = CStringGetTextDatum(outbox::BrokerStateName(copy.broker));
		values[9] = TimestampOrNull(copy.started_at, &nulls[9]);
		tuplestore_putvalues(store, rsinfo->setDesc, values, nulls);
	}
	return Datum(0);
}
