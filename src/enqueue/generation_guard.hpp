// The guard of the generation tables (DESIGN.md "The insert-only queue", L3): their rows are only
// ever inserted. UPDATE, DELETE and TRUNCATE of a member are refused by the C trigger
// outbox.generation_guard(), except the commit-order re-stamp's UPDATE (commit_order.cpp), and
// that only while it runs and only when it raises order_lsn and changes nothing else, and the
// retention's TRUNCATE (ring_retention_sql.cpp) of the member it checked.
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

// Between these two, in the current transaction, the guard lets an UPDATE of a member row through
// that only raises its order_lsn. The commit-order re-stamp calls them around its statement; the
// end of the transaction ends the allowance too (a stale flag of an aborted transaction never
// applies: it names its transaction).
void AllowGenerationRestamp() noexcept;
void EndGenerationRestamp() noexcept;

// Between these two, in the current transaction, the guard lets a TRUNCATE of the member table
// `member` through: outbox.truncate_ring_member() calls them around its own TRUNCATE, after its
// checks.
void AllowMemberTruncate(Oid member) noexcept;
void EndMemberTruncate() noexcept;

} // namespace outbox
