// The Postgres side of outbox.delivery = exactly_once (DESIGN.md "Exactly once"): a batch's
// record prepared as a two-phase transaction before its Kafka transaction commits, then
// committed, or rolled back, by what Kafka says. Plain C-style code, like relay_sql.cpp.
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

// The gid of batch `sequence` of the relay identity `transactional_id`, whose offset goes to
// `progress_topic`: "outbox:<id>:<sequence>:<topic tag><nonce>", the tag 8 hex digits of a hash of
// the topic's name (recovery decides a batch only by the offsets of the topic it was committed
// with), the random nonce 16 hex digits (no other role can take the gid first: a role that may
// PREPARE could otherwise make the relay's PREPARE fail, batch after batch).
char *PreparedBatchGid(const char *transactional_id, int64 sequence, const char *progress_topic);
// The batch sequence in a gid of `transactional_id`, or -1 when the gid is not one of its;
// *same_topic: its tag is `progress_topic`'s.
int64 PreparedBatchSequence(const char *gid, const char *transactional_id, const char *progress_topic,
                            bool *same_topic);

// What a gid of PreparedBatchGid ends with (its topic tag and nonce): the batch's own mark, which
// the Kafka commit writes as the offset's metadata.
const char *PreparedBatchMark(const char *gid);

// The gids of this database's prepared transactions that start with `prefix` and that `owner`
// prepared (the relay's role: no other role may make the relay decide its transactions), in gid
// order (palloc'd in the current context). Its own short transaction.
List *PreparedBatchGids(const char *prefix, const char *owner);
// COMMIT PREPARED / ROLLBACK PREPARED of a batch, as the session's own superuser, in a transaction
// of its own.
void FinishPreparedBatch(const char *gid, bool commit);

} // namespace outbox
