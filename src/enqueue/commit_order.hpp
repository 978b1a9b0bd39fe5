// Commit order: a (topic, key)'s events carry order_lsn stamps that follow the order in which
// their transactions committed (DESIGN.md "Commit order"). enqueue notes each keyed row it
// inserts; the transaction's pre-commit callback locks the keys and re-stamps where needed.
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

// Whether outbox.events has order_lsn (0.2.0 on; on 0.4.0 the ring members have it); a 0.1.0
// table, between a library upgrade and ALTER EXTENSION UPDATE, has none and gets no commit-order
// work. Looked up once per transaction (queue_target.hpp).
bool CommitOrderTracked();

// Registers the (sub)transaction callbacks, once, from _PG_init: older than any other library's
// loaded later, so the pre-commit one runs after theirs.
void RegisterCommitOrderCallbacks();

// Notes a keyed row enqueue just inserted in the current (sub)transaction: order_lsn is the stamp
// it read back, insert_before the WAL insert position read before the INSERT. A stamp outside
// [insert_before, insert position now] is refused. member: the ring member the row is in (schema
// 0.4.0), or kNoMember (queue_target.hpp) for 0.3.0's outbox.events.
void NoteKeyedRow(const text *topic, const text *key, int64 id, XLogRecPtr order_lsn, XLogRecPtr insert_before,
                  int member);

#ifdef OUTBOX_TEST_SEAMS
// Test builds only: outbox.test_enqueue_at_pre_commit's assign hook registers a pre-commit callback
// that enqueues, the first time it is set in a backend: like a library loaded after outbox.
void RegisterPreCommitEnqueueForTest();
#endif

} // namespace outbox
