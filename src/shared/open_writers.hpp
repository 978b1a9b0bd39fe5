// The registry of open writers (DESIGN.md "The insert-only queue", "Registry of open writers"):
// in shared memory, per top-level transaction that inserted into a generation table, its
// FullTransactionId, its database and the lowest order_lsn stamp it gave a row. A claim reads it
// to know how far it may go without passing a row that a transaction still in progress will
// commit below it.
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

struct OpenWriter {
	FullTransactionId fxid;
	XLogRecPtr lowest; // every stamp of the transaction is at or above it
};

// The registry's memory and lock, asked for and attached by shmem.cpp's hooks (the second under
// AddinShmemInitLock).
void RequestOpenWritersMemory();
void AttachOpenWriters();
// Called from _PG_init: the transaction callback that clears an entry at commit, abort and PREPARE.
void RegisterOpenWritersCallbacks();

// The stamp for the next row this transaction inserts into a generation table: the WAL insert
// position, read after the transaction's entry is in the registry (so a claim that did not see
// the entry read its own WAL position before this one). The first call of a top-level
// transaction writes the entry; later calls only read the position.
XLogRecPtr StampOpenWriterRow();

// What a claim of database `db` sees: the WAL insert position, then (read after it) the open
// writers of the database that are in progress in `snapshot`, then the snapshot. No transaction
// in progress in `snapshot` but those can commit a row below `wal_insert`, and none of those a row
// below its `lowest` (the argument is in the .cpp and in DESIGN.md). The caller is connected to
// SPI (the prepared transactions are read from pg_prepared_xact()) and unregisters the snapshot.
// `tables` are every generation table of the database (the entry kept stands for all of them):
// a prepared transaction without an entry
// (prepared before this server run: a restart, a crash recovery, a promotion) is looked up in them
// once, its lowest stamp or "no row" kept as its entry from then on.
struct ClaimView {
	XLogRecPtr wal_insert;
	Snapshot snapshot; // registered
	OpenWriter *open;  // palloc'd
	int n_open;
};

ClaimView TakeClaimView(Oid db, const Oid *tables, int n_tables);

// Whether the transaction is in progress in `snapshot`, by its full id (an id left for 2^31
// transactions would pass the 32-bit test as newer than every snapshot).
bool InProgressIn(FullTransactionId fxid, Snapshot snapshot);

// The safe horizon: rows visible in the view's snapshot below it are final (no row below it can
// still be committed). The least of wal_insert and the open writers' lowest stamps. (The test-build
// claim's 'horizon' way; the relay's claim goes to wal_insert and keeps holes: ring_claim.cpp.)
XLogRecPtr SafeHorizon(const ClaimView &view);

// The generation table's stamped columns, order_lsn (pg_lsn) and writer (xid8); an ERROR if it
// has not both.
void GenerationColumns(Relation rel, AttrNumber *order_lsn, AttrNumber *writer);

} // namespace outbox
