// outbox.worker_metrics(): the metrics of the relay workers' shared-memory slots as one wide row
// per worker (behind the view outbox.worker_metrics; docs/metrics.md). Each histogram is four
// columns in the layout postgres_exporter's HISTOGRAM usage reads: NAME (the finite buckets'
// upper bounds), NAME_bucket (cumulative counts per bound), NAME_sum, NAME_count.
#include "shared/boundary.hpp"
#include "shared/guc.hpp"
#include "shared/metrics.hpp"
#include "shared/shmem.hpp"
#include "relay/sql_rows.hpp"

namespace {

constexpr int kFixedColumns = 15;
constexpr int kHistograms = 4;
// events_resent (0.3.0) comes after the histograms; a 0.2.0 schema's view, between a library
// update and ALTER EXTENSION UPDATE, has every column but it.
constexpr int kResentColumn = kFixedColumns + 4 * kHistograms;
// The ring's retention (0.4.0, after events_resent; outbox.worker_metrics_v2()): 0.3.0's
// outbox.worker_metrics(), which 0.4.0 keeps, has every column but these two.
constexpr int kRingSealedAgeColumn = kResentColumn + 1;
constexpr int kRingStallsColumn = kResentColumn + 2;
constexpr int kColumns = kRingStallsColumn + 1;

// Puts one histogram's four columns at values[at..at+3].
void
PutHistogram(const outbox::Histogram &h, const double *bounds, int n_bounds, Datum *values, int at) {
	Datum *le = static_cast<Datum *>(palloc(sizeof(Datum) * n_bounds));
	Datum *cumulative = static_cast<Datum *>(palloc(sizeof(Datum) * n_bounds));
	uint64 running = 0;
	for (int i = 0; i < n_bounds; i++) {
		running += h.counts[i];
		le[i] = Float8GetDatum(bounds[i]);
		cumulative[i] = Int64GetDatum(int64(running));
	}
	values[at] = PointerGetDatum(construct_array(le, n_bounds, FLOAT8OID, sizeof(float8), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[at + 1] =
	    PointerGetDatum(construct_array(cumulative, n_bounds, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[at + 2] = Float8GetDatum(h.sum);
	values[at + 3] = Int64GetDatum(int64(h.count));
}

} // namespace

OUTBOX_SQL_FUNCTION(outbox_worker_metrics) {
	Tuplestorestate *store = BeginRows(fcinfo, "outbox.worker_metrics()");
	TupleDesc desc = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo)->setDesc;
	if (desc->natts != kColumns && desc->natts != kRingSealedAgeColumn && desc->natts != kResentColumn) {
		elog(ERROR, "outbox.worker_metrics: return type must be a row type of %d columns", kColumns);
	}

	TimestampTz now = GetCurrentTimestamp();
	// Every slot the launcher handed out, whatever database it serves: one scrape covers the
	// cluster, labelled by database and worker.
	for (int s = 0; s < outbox::kMaxSlots && outbox::shared != nullptr; s++) {
		outbox::WorkerSlot copy;
		outbox::WorkerSlot *slot = outbox::SlotOf(s);
		SpinLockAcquire(&slot->mutex);
		memcpy(&copy, slot, sizeof(copy));
		SpinLockRelease(&slot->mutex);
		if (copy.database == InvalidOid) {
			continue; // free
		}
		const outbox::WorkerMetrics &m = copy.metrics;

		Datum values[kColumns];
		bool nulls[kColumns] = {false};
		// A database dropped since the worker connected has no name: NULL.
		char *database = get_database_name(copy.database);
		values[0] = database ? CStringGetTextDatum(database) : Datum(0);
		nulls[0] = database == nullptr;
		values[1] = Int32GetDatum(copy.index);
		values[2] = Int32GetDatum(copy.pid);
		nulls[2] = copy.pid == 0;
		values[3] = CStringGetTextDatum(outbox::WorkerStateName(copy.state));
		values[4] = CStringGetTextDatum(outbox::BrokerStateName(copy.broker));
		values[5] = Int32GetDatum(copy.broker == outbox::BrokerState::Up ? 1 : 0);
		nulls[5] = copy.broker == outbox::BrokerState::Unknown;
		values[6] = Int32GetDatum(copy.state == outbox::WorkerState::BackingOff ? 1 : 0);
		values[7] = Float8GetDatum(m.backoff_until > now ? double(m.backoff_until - now) / USECS_PER_SEC : 0.0);
		values[8] = TimestampTzGetDatum(copy.started_at);
		nulls[8] = copy.started_at == 0;
		values[9] = Int64GetDatum(int64(copy.published));
		values[10] = Int64GetDatum(int64(copy.failed));
		values[11] = Int64GetDatum(int64(m.retried));
		values[12] = Int64GetDatum(int64(m.requeued));
		values[13] = Int64GetDatum(int64(m.backoffs));
		values[14] = Int64GetDatum(int64(m.batch_size.count)); // batches: one size observed per batch
		PutHistogram(m.batch_size, outbox::kBatchSizeBounds, outbox::kBatchSizeBuckets, values, kFixedColumns);
		PutHistogram(m.publish_seconds, outbox::kSecondsBounds, outbox::kSecondsBuckets, values, kFixedColumns + 4);
		PutHistogram(m.claim_seconds, outbox::kSecondsBounds, outbox::kSecondsBuckets, values, kFixedColumns + 8);
		PutHistogram(m.record_seconds, outbox::kSecondsBounds, outbox::kSecondsBuckets, values, kFixedColumns + 12);
		values[kResentColumn] = Int64GetDatum(int64(m.resent)); // not read by a 0.2.0 view (natts)
		// Not read by a 0.3.0 view (natts). The age grows between rounds; 0 when nothing is sealed
		// (and on every worker but the one that keeps the retention).
		values[kRingSealedAgeColumn] = Float8GetDatum(
		    m.ring_oldest_sealed_at != 0 && m.ring_oldest_sealed_at < now
		        ? double(now - m.ring_oldest_sealed_at) / USECS_PER_SEC
		        : 0.0);
		values[kRingStallsColumn] = Int64GetDatum(int64(m.ring_retention_stalls));
		tuplestore_putvalues(store, desc, values, nulls);
	}
	return Datum(0);
}
