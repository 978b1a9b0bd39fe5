// The relay's claim and record on schema 0.4.0's ring of generation tables (the insert-only
// queue's preview, DESIGN.md "The insert-only queue", build step 3). relay_sql.cpp's steps call
// these when the step runs on the ring: the step's transaction, role and SPI connection are
// theirs; the publish between claim and record is the worker's, unchanged.
#pragma once

#include "relay/relay_sql.hpp"

namespace outbox {

// The schema versions whose outbox.events is a view over the ring: 0.4.0, and 0.4.1, whose
// members only add caller_event_id and make their event-id index partial (nothing the relay
// reads or writes: it publishes from either, so a package upgrade to 0.4.1 stops no relay before
// ALTER EXTENSION UPDATE).
constexpr const char *kRingSchemaVersions[] = {"0.4.0", "0.4.1"};

// Whether `version` is one of kRingSchemaVersions.
bool IsRingSchemaVersion(const char *version);
// The last schema whose outbox.events is a table: the relay keeps publishing from it whatever
// the default version is, so that a package upgrade does not stop a relay until the operator
// runs ALTER EXTENSION UPDATE (older schemas are refused: their statements are not kept).
constexpr const char *kTableSchemaVersion = "0.3.0";

// nullptr when the ring's tables are there, plain tables and the extension's own; else why not.
const char *RingTablesProblem(Oid ext, Oid nsp);
// nullptr when `role` has the rights the ring's claim and record use; else what it lacks.
const char *RingRightsProblem(Oid nsp, Oid role);

// The claim of slot lanes.worker of lanes.n_workers, in the open step: the slot's cursor row
// locked (none: someone else holds it, the batch is empty), the registry's view read (W, the
// open writers, the snapshot S), then the due event_state rows of the slot's lanes, the rows of
// its committed holes below the cursor, and (once those are walked) the member rows after the
// cursor below W, the last two in S.
// Rows held behind an earlier event of their key are copied into event_state here. An empty
// batch has its cursor written already; a non-empty one is recorded by RingRecordOutcomes.
void RingClaim(const LaneSet &lanes, MemoryContext into, Batch *batch, int batch_size);

// In the claim's resumed step: landed rows for the published events given, and their
// event_state rows deleted.
void RingRecordPublished(const Batch &batch, const int *events, int n, const kafka::Delivery *deliveries);

// In the claim's resumed step, before its commit: every outcome (published ones not recorded
// yet, retries, failed, quarantined, deferred, passed unpublished) and the cursor. Returns how
// many events moved to failed (logged once here).
int RingRecordOutcomes(const Batch &batch, const Outcome *outcomes, const kafka::Delivery *deliveries,
                       const char *const *errors, long defer_ms, const bool *recorded);

// In an open step: milliseconds until the slot's next retry is due, or -1.
int64 RingMillisUntilNextRetry(const LaneSet &lanes);

} // namespace outbox
