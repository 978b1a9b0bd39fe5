// The registry of open writers and the claim's horizon (DESIGN.md "The insert-only queue").
//
// One entry per backend (its open top-level transaction that inserted a generation row, if any)
// and one per prepared transaction of this server run, all under one LWLock: a writer takes it at
// its first row (and reads its first stamp under it), at its end, and at PRE_PREPARE and PREPARE;
// a claim once to read every entry, so that a claim sees an entry either whole or not at all.
//
// Why a claim that read the WAL insert position W, then the registry, then took the snapshot S
// may take every row visible in S with a stamp below its horizon (the least of W and of the
// lowest stamps of the entries in progress in S), and no committed row below the horizon can turn
// up later: let T commit a row r with stamp s below the horizon after S, so T is in progress in S.
// If the claim saw T's entry, the horizon is at most T's lowest stamp, which is at most s. If not,
// T wrote its entry after the claim read the registry, so after the claim read W, and read every
// one of its stamps after writing the entry: s >= W (WAL positions only grow). T prepared: it has
// an entry in the prepared array from PRE_PREPARE on (its backend's goes at PREPARE), or (no room,
// or prepared before this server run) none, and pg_prepared_xact() names it: the claim reads its
// lowest stamp from its rows (it writes none once prepared) and keeps that as its entry.
// The same argument, put the other way: a row below W that S does not show and that will still be
// committed is a row of a writer in the view (in progress in S), at or above its lowest stamp. So a
// claim may also pass W if it keeps those writers as holes (DESIGN.md) and walks each one's rows
// from its lowest stamp up to the cursor once S no longer shows it in progress.
#include "shared/open_writers.hpp"

#include "shared/boundary.hpp"
#include "shared/shmem.hpp"

extern "C" {
#include "access/tableam.h"     // the look-up of a prepared transaction's rows
#include "executor/tuptable.h"
#include "storage/procarray.h"  // TransactionIdIsInProgress
#include "utils/rel.h"
}

namespace outbox {

namespace {

struct WriterEntry {
	FullTransactionId fxid; // invalid: no entry
	Oid database;
	XLogRecPtr lowest;
};

struct OpenWritersShared {
	LWLock *lock;
	int n_backend_entries;
	int n_prepared_entries;
	// One per backend (OutboxBackendIndex()), then the prepared transactions'. An entry a backend
	// left behind names a transaction no longer in progress, which no claim counts.
	WriterEntry entries[FLEXIBLE_ARRAY_MEMBER];
};

// The lowest stamp of a prepared transaction that wrote no generation row.
constexpr XLogRecPtr kNoStamp = PG_UINT64_MAX;

constexpr const char *kTrancheName = "outbox_open_writers";

OpenWritersShared *registry = nullptr;

// This backend's entry while it holds its open transaction (nullptr: none), found when it is set
// (where an ERROR may be raised), so that the callbacks after commit and PREPARE raise none.
WriterEntry *my_entry = nullptr;
FullTransactionId my_fxid;
// The prepared-array entry reserved at PRE_PREPARE for the transaction being prepared.
WriterEntry *reserved = nullptr;

Size
RegistrySize() {
	Size n = add_size(BackendCount(), max_prepared_xacts);
	return add_size(offsetof(OpenWritersShared, entries), mul_size(n, sizeof(WriterEntry)));
}

WriterEntry *
PreparedEntries() {
	return registry->entries + registry->n_backend_entries;
}

WriterEntry *
MyEntry() {
	uint32 index = OutboxBackendIndex();
	if (index >= uint32(registry->n_backend_entries)) {
		elog(ERROR, "outbox: backend index %u is beyond the %d entries of the registry of open writers", index,
		     registry->n_backend_entries);
	}
	return &registry->entries[index];
}

bool MayBeRunning(FullTransactionId fxid, FullTransactionId oldest);

// Under the lock, exclusive: a free prepared entry, or nullptr. An entry of a prepared transaction
// that ended since (COMMIT/ROLLBACK PREPARED, run by any backend: no callback tells this one) is
// free again; that is looked up (it may raise an ERROR) only when no entry is free.
WriterEntry *
FreePreparedEntry() {
	WriterEntry *prepared = PreparedEntries();
	for (int i = 0; i < registry->n_prepared_entries; i++) {
		if (!FullTransactionIdIsValid(prepared[i].fxid)) {
			return &prepared[i];
		}
	}
	// 2^31 transactions older than the next one: ended (nothing older can still run).
	FullTransactionId oldest = FullTransactionIdFromU64(
	    Max(U64FromFullTransactionId(ReadNextFullTransactionId()), uint64(1) << 31) - (uint64(1) << 31));
	for (int i = 0; i < registry->n_prepared_entries; i++) {
		if (!MayBeRunning(prepared[i].fxid, oldest) ||
		    !TransactionIdIsInProgress(XidFromFullTransactionId(prepared[i].fxid))) {
			prepared[i].fxid = InvalidFullTransactionId;
			return &prepared[i];
		}
	}
	return nullptr;
}

// At commit and abort (after ProcArrayEndTransaction: a committed transaction's rows are
// visible), and at backend exit through the abort of its open transaction.
void
ClearMyTransaction() {
	if (my_entry == nullptr && reserved == nullptr) {
		return;
	}
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	if (my_entry != nullptr) {
		my_entry->fxid = InvalidFullTransactionId;
	}
	if (reserved != nullptr && FullTransactionIdEquals(reserved->fxid, my_fxid)) {
		reserved->fxid = InvalidFullTransactionId; // a PREPARE that failed after PRE_PREPARE
	}
	LWLockRelease(registry->lock);
	my_entry = nullptr;
	reserved = nullptr;
}

// At PRE_PREPARE, where an ERROR still aborts the PREPARE: a prepared entry for the transaction,
// also one that wrote no generation row (with no stamp), so that a claim can tell it from one
// prepared before this server run. Filled now, so a claim sees the transaction in it from here on
// (and in the backend's entry until PREPARE moves it). With no room (the other entries are of
// prepared transactions, and of PREPAREs that reserved theirs and may still fail) there is none,
// and the claim looks the transaction up like one prepared before this server run: safe.
void
ReservePreparedEntry() {
	FullTransactionId fxid = GetTopFullTransactionIdIfAny();
	if (!FullTransactionIdIsValid(fxid)) {
		return; // PrepareTransaction assigns one before PRE_PREPARE: not expected
	}
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	reserved = FreePreparedEntry();
	if (reserved != nullptr) {
		*reserved = WriterEntry{fxid, MyDatabaseId, my_entry != nullptr ? my_entry->lowest : kNoStamp};
	}
	LWLockRelease(registry->lock);
	my_fxid = fxid;
}

// After PREPARE (its record is written, the transaction is in progress as a prepared one): the
// backend's entry goes, its stamp kept in the reserved one (a PRE_PREPARE callback that ran after
// ours may have written the first row). Raises no ERROR.
void
MoveMyTransactionToPrepared() {
	if (my_entry == nullptr && reserved == nullptr) {
		return;
	}
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	if (reserved != nullptr && my_entry != nullptr) {
		reserved->lowest = Min(reserved->lowest, my_entry->lowest);
	}
	if (my_entry != nullptr) {
		my_entry->fxid = InvalidFullTransactionId;
	}
	LWLockRelease(registry->lock);
	my_entry = nullptr;
	reserved = nullptr;
}

void
OnTransactionEvent(XactEvent event, void *) {
	switch (event) {
	case XACT_EVENT_COMMIT:
	case XACT_EVENT_PARALLEL_COMMIT:
	case XACT_EVENT_ABORT:
	case XACT_EVENT_PARALLEL_ABORT:
		ClearMyTransaction();
		break;
	case XACT_EVENT_PRE_PREPARE:
		ReservePreparedEntry();
		break;
	case XACT_EVENT_PREPARE:
		MoveMyTransactionToPrepared();
		break;
	default:
		break;
	}
}

// A transaction id of the current epoch or the one before (a prepared transaction's: it holds
// back the xid horizon, so it is within 2^31 of the next id).
FullTransactionId
WidenRecentXid(TransactionId xid) {
	FullTransactionId next = ReadNextFullTransactionId();
	uint32 epoch = EpochFromFullTransactionId(next);
	if (xid > XidFromFullTransactionId(next) && epoch > 0) {
		epoch--;
	}
	return FullTransactionIdFromEpochAndXid(epoch, xid);
}

// Whether `fxid` is recent enough for the 32-bit tests (XidInMVCCSnapshot, TransactionIdIsInProgress)
// to mean it: an entry left for 2^31 transactions (a prepared one that ended while no PREPARE came
// to free its entry) would look newer than every snapshot, and in progress for ever.
bool
MayBeRunning(FullTransactionId fxid, FullTransactionId oldest) {
	return !FullTransactionIdPrecedes(fxid, oldest);
}

// The lowest stamp among the rows of prepared transaction `xid` in `tables` (kNoStamp: none).
// Every row version, whatever its visibility (SnapshotAny): the transaction is prepared, so it
// writes no more rows, and a row of it that a snapshot would not show (deleted by itself, of an
// aborted subtransaction) only makes the answer lower: safe. A whole scan of each table, once per
// such transaction and server run.
XLogRecPtr
LowestStampOf(TransactionId xid, const Oid *tables, int n_tables) {
	XLogRecPtr lowest = kNoStamp;
	uint64 writer_wanted = U64FromFullTransactionId(WidenRecentXid(xid));
	ereport(DEBUG1, (errmsg_internal("outbox: looking up the rows of prepared transaction %u", xid)));
	for (int t = 0; t < n_tables; t++) {
		Relation rel = table_open(tables[t], AccessShareLock);
		AttrNumber lsn_att, writer_att;
		GenerationColumns(rel, &lsn_att, &writer_att);
		TupleTableSlot *slot = table_slot_create(rel, nullptr);
		TableScanDesc scan = table_beginscan(rel, SnapshotAny, 0, nullptr);
		while (table_scan_getnextslot(scan, ForwardScanDirection, slot)) {
			CHECK_FOR_INTERRUPTS(); // a whole table: cancel and shutdown must stop it
			bool writer_null, lsn_null;
			Datum writer = slot_getattr(slot, writer_att, &writer_null);
			Datum stamp = slot_getattr(slot, lsn_att, &lsn_null);
			if (!writer_null && !lsn_null && DatumGetUInt64(writer) == writer_wanted) {
				lowest = Min(lowest, DatumGetLSN(stamp));
			}
		}
		table_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		table_close(rel, AccessShareLock);
	}
	return lowest;
}

// Keeps what LowestStampOf found as the transaction's entry. False: no room (then the claim
// treats it as unknown again, and looks again next time).
bool
AdoptPrepared(Oid db, TransactionId xid, XLogRecPtr lowest) {
	FullTransactionId fxid = WidenRecentXid(xid);
	bool kept = false;
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	WriterEntry *prepared = PreparedEntries();
	for (int i = 0; i < registry->n_prepared_entries && !kept; i++) {
		// Another claim adopted it meanwhile: the same answer.
		kept = FullTransactionIdEquals(prepared[i].fxid, fxid);
	}
	WriterEntry *free_entry = kept ? nullptr : FreePreparedEntry();
	if (free_entry != nullptr) {
		*free_entry = WriterEntry{fxid, db, lowest};
		kept = true;
	}
	LWLockRelease(registry->lock);
	return kept;
}

} // namespace

extern "C" {
static void
outbox_open_writers_xact_callback(XactEvent event, void *arg) {
	CallFromPostgres("outbox_open_writers_xact_callback", OnTransactionEvent, event, arg);
}
}

void
RequestOpenWritersMemory() {
	RequestAddinShmemSpace(RegistrySize());
	RequestNamedLWLockTranche(kTrancheName, 1);
}

void
AttachOpenWriters() {
	bool found;
	registry = static_cast<OpenWritersShared *>(ShmemInitStruct("outbox open writers", RegistrySize(), &found));
	if (!found) {
		memset(registry, 0, RegistrySize());
		registry->lock = &GetNamedLWLockTranche(kTrancheName)->lock;
		registry->n_backend_entries = int(BackendCount());
		registry->n_prepared_entries = max_prepared_xacts;
	}
}

void
RegisterOpenWritersCallbacks() {
	RegisterXactCallback(outbox_open_writers_xact_callback, nullptr);
}

void
GenerationColumns(Relation rel, AttrNumber *order_lsn, AttrNumber *writer) {
	struct {
		const char *name;
		Oid type;
		AttrNumber *out;
	} wanted[2] = {{"order_lsn", PG_LSNOID, order_lsn}, {"writer", XID8OID, writer}};
	TupleDesc desc = RelationGetDescr(rel);
	for (const auto &column : wanted) {
		int attnum = SPI_fnumber(desc, column.name);
		if (attnum <= 0 || TupleDescAttr(desc, attnum - 1)->atttypid != column.type) {
			ereport(ERROR, (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
			                errmsg("outbox: table \"%s\" has no column %s of type %s", RelationGetRelationName(rel),
			                       column.name, format_type_be(column.type)),
			                errhint("The trigger outbox_generation_stamp is for the extension's generation tables only.")));
		}
		*column.out = AttrNumber(attnum);
	}
}

XLogRecPtr
StampOpenWriterRow() {
	FullTransactionId top = GetTopFullTransactionId();
	if (my_entry != nullptr && FullTransactionIdEquals(my_fxid, top)) {
		return GetXLogInsertRecPtr();
	}
	WriterEntry *e = MyEntry();
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	e->fxid = top;
	e->database = MyDatabaseId;
	// Read with the entry in place (under the lock a claim reads it with).
	XLogRecPtr stamp = GetXLogInsertRecPtr();
	e->lowest = stamp;
	LWLockRelease(registry->lock);
	my_fxid = top;
	my_entry = e;
	return stamp;
}

namespace {

// The entries of database `db` (backends' and prepared transactions'), palloc'd in the current
// memory context; *count gets their number.
OpenWriter *
ReadOpenWriters(Oid db, int *count) {
	int total = registry->n_backend_entries + registry->n_prepared_entries;
	auto *out = static_cast<OpenWriter *>(palloc(sizeof(OpenWriter) * Max(total, 1)));
	int n = 0;
	LWLockAcquire(registry->lock, LW_SHARED);
	for (int i = 0; i < total; i++) {
		const WriterEntry &e = registry->entries[i];
		if (FullTransactionIdIsValid(e.fxid) && e.database == db) {
			out[n++] = OpenWriter{e.fxid, e.lowest};
		}
	}
	LWLockRelease(registry->lock);
	*count = n;
	return out;
}

} // namespace

ClaimView
TakeClaimView(Oid db, const Oid *tables, int n_tables) {
	// The order of these reads is the argument at the top of the file.
	XLogRecPtr wal_insert = GetXLogInsertRecPtr();
	int n_writers;
	OpenWriter *writers = ReadOpenWriters(db, &n_writers);
	Oid types[1] = {OIDOID};
	Datum values[1] = {ObjectIdGetDatum(db)};
	if (SPI_execute_with_args("SELECT p.transaction FROM pg_catalog.pg_prepared_xact() AS p "
	                          "WHERE p.dbid OPERATOR(pg_catalog.=) $1",
	                          1, types, values, nullptr, true, 0) != SPI_OK_SELECT) {
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("outbox: reading pg_prepared_xact() failed")));
	}
	uint64 n_prepared = SPI_processed;
	auto *prepared = static_cast<TransactionId *>(palloc(sizeof(TransactionId) * Max(n_prepared, uint64(1))));
	for (uint64 i = 0; i < n_prepared; i++) {
		bool isnull;
		prepared[i] = DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
	}
	Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());

	auto *open = static_cast<OpenWriter *>(palloc(sizeof(OpenWriter) * Max(uint64(n_writers) + n_prepared, uint64(1))));
	int n_open = 0;
	for (int i = 0; i < n_writers; i++) {
		if (InProgressIn(writers[i].fxid, snapshot) && writers[i].lowest != kNoStamp) {
			open[n_open++] = writers[i];
		}
	}
	for (uint64 i = 0; i < n_prepared; i++) {
		bool has_entry = false;
		for (int j = 0; j < n_writers && !has_entry; j++) {
			has_entry = TransactionIdEquals(XidFromFullTransactionId(writers[j].fxid), prepared[i]);
		}
		if (!has_entry && XidInMVCCSnapshot(prepared[i], snapshot)) {
			// Exact (it writes no more rows); without room it is only not kept, and looked up again.
			XLogRecPtr lowest = LowestStampOf(prepared[i], tables, n_tables);
			(void)AdoptPrepared(db, prepared[i], lowest);
			if (lowest != kNoStamp) {
				open[n_open++] = OpenWriter{WidenRecentXid(prepared[i]), lowest};
			}
		}
	}
	pfree(writers);
	pfree(prepared);
	return ClaimView{wal_insert, snapshot, open, n_open};
}

bool
InProgressIn(FullTransactionId fxid, Snapshot snapshot) {
	return MayBeRunning(fxid, WidenRecentXid(snapshot->xmin)) &&
	       XidInMVCCSnapshot(XidFromFullTransactionId(fxid), snapshot);
}

XLogRecPtr
SafeHorizon(const ClaimView &view) {
	XLogRecPtr horizon = view.wal_insert;
	for (int i = 0; i < view.n_open; i++) {
		horizon = Min(horizon, view.open[i].lowest);
	}
	return horizon;
}

} // namespace outbox
