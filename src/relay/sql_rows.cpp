#include "relay/sql_rows.hpp"

Tuplestorestate *
BeginRows(FunctionCallInfo fcinfo, const char *name) {
	ReturnSetInfo *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
	if (rsinfo == nullptr || !IsA(rsinfo, ReturnSetInfo) || !(rsinfo->allowedModes & SFRM_Materialize)) {
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED), errmsg("%s must be called in a FROM clause", name)));
	}
	TupleDesc desc;
	if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE) {
		elog(ERROR, "%s: return type must be a row type", name);
	}
	MemoryContext old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	Tuplestorestate *store = tuplestore_begin_heap(true, false, work_mem);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = store;
	rsinfo->setDesc = CreateTupleDescCopy(desc);
	MemoryContextSwitchTo(old);
	return store;
}
