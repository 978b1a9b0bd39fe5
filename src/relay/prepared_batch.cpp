// Prepared batches of outbox.delivery = exactly_once. See prepared_batch.hpp.
#include "relay/prepared_batch.hpp"

#include <cerrno>
#include <cstdlib>

namespace outbox {

constexpr int kNonceBytes = 8;
constexpr int kTagDigits = 8;

uint32
TopicTag(const char *progress_topic) {
	return hash_bytes(reinterpret_cast<const unsigned char *>(progress_topic), int(strlen(progress_topic)));
}

char *
PreparedBatchGid(const char *transactional_id, int64 sequence, const char *progress_topic) {
	uint8 nonce[kNonceBytes];
	if (!pg_strong_random(nonce, sizeof(nonce))) {
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("outbox relay: could not generate random bytes")));
	}
	char hex[2 * kNonceBytes + 1];
	for (int i = 0; i < kNonceBytes; i++) {
		snprintf(hex + 2 * i, 3, "%02x", nonce[i]);
	}
	return psprintf("outbox:%s:%lld:%08x%s", transactional_id, (long long)sequence, TopicTag(progress_topic), hex);
}

int64
PreparedBatchSequence(const char *gid, const char *transactional_id, const char *progress_topic, bool *same_topic) {
	*same_topic = false;
	size_t id_len = strlen(transactional_id);
	if (strncmp(gid, "outbox:", 7) != 0 || strncmp(gid + 7, transactional_id, id_len) != 0 || gid[7 + id_len] != ':') {
		return -1;
	}
	const char *digits = gid + 7 + id_len + 1;
	char *end = nullptr;
	errno = 0;
	long long sequence = strtoll(digits, &end, 10);
	if (errno != 0 || end == digits || *end != ':' || strlen(end + 1) != kTagDigits + 2 * kNonceBytes ||
	    sequence < 1) {
		return -1;
	}
	char tag[kTagDigits + 1];
	snprintf(tag, sizeof(tag), "%08x", TopicTag(progress_topic));
	*same_topic = strncmp(end + 1, tag, kTagDigits) == 0;
	return int64(sequence);
}

const char *
PreparedBatchMark(const char *gid) {
	const char *colon = strrchr(gid, ':');
	return colon ? colon + 1 : gid;
}

List *
PreparedBatchGids(const char *prefix, const char *owner) {
	MemoryContext caller = CurrentMemoryContext;
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT) {
		elog(ERROR, "outbox relay: SPI_connect failed");
	}
	Oid types[2] = {TEXTOID, TEXTOID};
	Datum values[2] = {CStringGetTextDatum(prefix), CStringGetTextDatum(owner)};
	int rc = SPI_execute_with_args("SELECT p.gid FROM pg_catalog.pg_prepared_xacts p "
	                               "WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database() "
	                               "AND pg_catalog.starts_with(p.gid, $1) "
	                               "AND p.owner::pg_catalog.text OPERATOR(pg_catalog.=) $2 ORDER BY p.gid",
	                               2, types, values, nullptr, true, 0);
	if (rc != SPI_OK_SELECT) {
		elog(ERROR, "outbox relay: could not read pg_prepared_xacts: %s", SPI_result_code_string(rc));
	}
	List *gids = NIL;
	for (uint64 i = 0; i < SPI_processed; i++) {
		char *gid = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		MemoryContext old = MemoryContextSwitchTo(caller);
		gids = lappend(gids, pstrdup(gid));
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(caller);
	return gids;
}

void
FinishPreparedBatch(const char *gid, bool commit) {
	MemoryContext caller = CurrentMemoryContext;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	pgstat_report_activity(STATE_RUNNING, commit ? "outbox relay: commit prepared" : "outbox relay: rollback prepared");
	// As the logical replication apply worker decides a prepared transaction: inside a transaction
	// of its own, not as a statement (COMMIT PREPARED is refused inside a function).
	FinishPreparedTransaction(gid, commit);
	CommitTransactionCommand();
	MemoryContextSwitchTo(caller);
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, nullptr);
}

} // namespace outbox
