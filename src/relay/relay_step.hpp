// What relay_sql.cpp's step machinery lends the ring's claim and record (ring_claim.cpp): a
// prepared statement run inside a step (statement timeout, stop check, fault injection), the
// claimed row's copy (quarantine checks included), and the claim's pause and resume. Relay code
// only; plain C-style, like relay_sql.cpp.
#pragma once

#include "relay/relay_sql.hpp"

namespace outbox {

struct Statement {
	const char *sql;
	int nargs;
	Oid types[18];
	int cursor_options; // 0: the plan cache chooses between custom and generic plans
	SPIPlanPtr plan;    // prepared at first use and kept for the worker's life
};

namespace step {

// Runs `stmt` in the open step (its plan prepared once); an ERROR unless SPI returns `expected`.
// `step` names it for the test builds' outbox.test_fail_step.
void Execute(const char *step, Statement &stmt, Datum *values, const char *nulls, int expected);
// The same, read-only, in exactly `snapshot` (InvalidSnapshot: as Execute).
void ExecuteIn(const char *step, Statement &stmt, Datum *values, const char *nulls, int expected, Snapshot snapshot);
// A one-dimensional array of `elems` in the current memory context.
Datum ArrayOf(Datum *elems, int n, Oid type);
// Copies a claimed row in the claim's column layout (relay_sql.cpp's kLockSql: 1 id, 2 event_id
// text, 3 topic, 4 key, 5 payload, 6-7 header names and values, 8 headers not an object,
// 11 created_at, 12 target_partition, 13-15 ce_content_type, ce_type, ce_source; 9 and 10 are
// not read). A row that cannot be published as it is gets a quarantine reason.
void CopyClaimedRow(HeapTuple tuple, TupleDesc desc, ClaimedEvent &e);
// Whether the step runs on the ring (schema 0.4.0): set by each BeginStep.
bool OnRing();
// Whether `role` may execute outbox's function name(argtypes), found in schema `nsp` directly.
bool CanExecute(Oid nsp, Oid role, const char *name, Oid *argtypes, int nargs);

} // namespace step

} // namespace outbox
