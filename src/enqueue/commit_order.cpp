// Commit order (DESIGN.md "Commit order"): of two committed transactions with events of one
// (topic, key), the one that committed later has all its order_lsn stamps above all of the
// earlier one's. enqueue's insert stamps the WAL insert position; at pre-commit this file locks
// the transaction's keys (held until the commit is visible) and, where a transaction of the same
// key committed a higher stamp in the meantime, moves this transaction's rows of that key above
// it. Plain data only on the stack: everything here can ereport.
#include "enqueue/commit_order.hpp"

#include "enqueue/generation_guard.hpp"
#include "enqueue/queue_target.hpp"
#include "shared/boundary.hpp"
#include "shared/guc.hpp"
#include "shared/shmem.hpp"

namespace outbox {

namespace {

// Locks of this file: LOCKTAG_ADVISORY with a field4 that pg_advisory_lock never uses (it uses 1
// and 2), so no application lock can collide with them. pg_locks shows them as advisory locks
// with objsubid 20290 (a key: objid and classid hold its hash) or 20291 (the global lock).
constexpr uint16 kKeyLockClass = 0x4F42;
constexpr uint16 kGlobalLockClass = 0x4F43;
// objsubid 20292: a prepare gate (LockGlobalExclusive), one per committer of many keys, named by
// its backend's index and local transaction id (classid, objid). It holds its own Exclusive while
// it waits for its keys, with its keys' stripes marked; a PREPARE that finds one of its keys'
// stripes marked waits (Share) at the gates of the committers that marked it, once, before it takes
// its first key, and does not keep them.
constexpr uint16 kPrepareGateClass = 0x4F44;

// A key lock's modes with max_prepared_transactions > 0 (DESIGN.md "Commit order"). A commit holds
// it ShareUpdateExclusive, a PREPARE Exclusive: both exclude each other and themselves. A committer
// of many keys tries it RowShare, which only a PREPARE's lock (held or awaited) makes busy: a commit
// that keeps the key while it waits for another is no reason to wait, it has not stamped. It waits
// for it ShareUpdateExclusive, behind every committer queued ahead of it, and lets it go at once.
constexpr LOCKMODE kCommitKeyMode = ShareUpdateExclusiveLock;
constexpr LOCKMODE kPrepareKeyMode = ExclusiveLock;
constexpr LOCKMODE kBulkTryMode = RowShareLock;
constexpr LOCKMODE kBulkWaitMode = ShareUpdateExclusiveLock;

// LSN_FORMAT_ARGS is C only (its type check does not compile as C++).
#define LSN_HIGH_LOW(lsn) uint32((lsn) >> 32), uint32(lsn)

struct NotedRow {
	uint64 key_hash;
	int64 id;
	XLogRecPtr order_lsn;    // the stamp it gets (a re-stamp replaces it)
	XLogRecPtr inserted_lsn; // the stamp it was inserted with: a ring member's row is found by (it, id)
	SubTransactionId subxact;
	int16 member; // the ring member it is in (schema 0.4.0), or kNoMember: outbox.events
	bool restamp;
};

// This transaction's keyed rows, in TopTransactionContext (gone with the transaction).
NotedRow *noted = nullptr;
Size noted_count = 0;
Size noted_capacity = 0;
bool callbacks_registered = false;
// From the moment this transaction locks its keys until it ends: a row noted then (an enqueue
// from a trigger fired by the re-stamp) would be of a key it never locked.
bool stamping = false;
// The rows whose keys' stripes this committer of many keys marked (BulkMark), until it unmarks them.
const NotedRow *marked_rows = nullptr;
Size marked_count = 0;

Oid
EventsRelation() {
	Oid nsp = get_namespace_oid("outbox", true);
	return OidIsValid(nsp) ? get_relname_relid("events", nsp) : InvalidOid;
}

// More distinct keys than this in one transaction, and it takes the global lock exclusively
// instead of one lock per key: a committer then holds at most this many of our locks besides its
// own, half of the average share of the shared lock table that max_locks_per_transaction sizes
// (64 -> 32 keys), so a transaction enqueueing for 100,000 keys cannot exhaust the table for
// everyone. The price: that commit waits for, and holds up, every other enqueuing commit while it
// stamps; and it cannot be prepared (its lock would stay until COMMIT PREPARED).
Size
KeyLockLimit() {
	return Size(Max(1, max_locks_per_xact / 2));
}

void
SetTag(LOCKTAG *tag, uint32 field2, uint32 field3, uint16 lock_class) {
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, field2, field3, lock_class);
}

void
Lock(uint32 field2, uint32 field3, uint16 lock_class, LOCKMODE mode) {
	LOCKTAG tag;
	SetTag(&tag, field2, field3, lock_class);
	// Transaction-level: released by PostgreSQL once the commit is visible (ProcArrayEndTransaction
	// runs before the locks go), for a prepared transaction at COMMIT/ROLLBACK PREPARED. A wait
	// serves cancel, lock_timeout and the deadlock check like any lock wait.
	(void)LockAcquire(&tag, mode, false, false);
}

void
Unlock(uint32 field2, uint32 field3, uint16 lock_class, LOCKMODE mode) {
	LOCKTAG tag;
	SetTag(&tag, field2, field3, lock_class);
	(void)LockRelease(&tag, mode, false);
}

void
LockKey(uint64 key_hash, LOCKMODE mode = ExclusiveLock) {
	Lock(uint32(key_hash >> 32), uint32(key_hash), kKeyLockClass, mode);
}

bool
TryLockKey(uint64 key_hash, LOCKMODE mode) {
	LOCKTAG tag;
	SetTag(&tag, uint32(key_hash >> 32), uint32(key_hash), kKeyLockClass);
	// dontWait still respects the wait queue: a key with waiters of a conflicting mode is busy, so
	// no FIFO is lost.
	return LockAcquire(&tag, mode, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

void
UnlockKey(uint64 key_hash, LOCKMODE mode) {
	Unlock(uint32(key_hash >> 32), uint32(key_hash), kKeyLockClass, mode);
}

// Waits for a key alone, holding no global lock and no key above it (DESIGN.md "Commit order",
// deadlock). A lock wait: cancel, lock_timeout and the deadlock check serve it.
void
WaitForKey(uint64 key_hash, LOCKMODE mode) {
	LockKey(key_hash, mode);
}

// A committer of many keys marks each of its keys' stripes while it waits for them: a count per
// stripe (cheap to look at), and its own bit per stripe (who to wait for). The marks go when it has
// its keys, or with its abort (Forget).
void
AddToMarks(const NotedRow *rows, Size count, int32 delta) {
	for (Size i = 0; i < count; i++) {
		if (i == 0 || rows[i].key_hash != rows[i - 1].key_hash) {
			(void)pg_atomic_fetch_add_u32(BulkMark(rows[i].key_hash), delta);
		}
	}
}

void
SetMarkerBits(BulkMarker *me, const NotedRow *rows, Size count, bool on) {
	for (Size i = 0; i < count; i++) {
		uint32 bit = BulkMarkIndex(rows[i].key_hash);
		uint64 mask = uint64(1) << (bit % 64);
		me->stripes[bit / 64] = on ? (me->stripes[bit / 64] | mask) : (me->stripes[bit / 64] & ~mask);
	}
}

// Its marker is complete before any count shows it (fetch_add is a full barrier): a PREPARE that
// sees a count it added finds it.
void
MarkStripes(const NotedRow *rows, Size count) {
	BulkMarker *me = BulkMarkerOf(OutboxBackendIndex());
	// The name before the bits, each after what came before it (the last unmark's clearing): a
	// PREPARE reads them the other way round (MarkersOf).
	pg_write_barrier();
	me->database = MyDatabaseId;
	me->lxid = OutboxLocalTransactionId();
	pg_write_barrier();
	SetMarkerBits(me, rows, count, true);
	pg_write_barrier();
	pg_atomic_write_u32(&me->marking, 1);
	AddToMarks(rows, count, 1);
	marked_rows = rows;
	marked_count = count;
}

void
UnmarkStripes() {
	if (marked_rows == nullptr) {
		return;
	}
	AddToMarks(marked_rows, marked_count, -1);
	BulkMarker *me = BulkMarkerOf(OutboxBackendIndex());
	pg_atomic_write_u32(&me->marking, 0);
	pg_memory_barrier();
	SetMarkerBits(me, marked_rows, marked_count, false);
	marked_rows = nullptr;
	marked_count = 0;
}

bool
AnyStripeMarked(const NotedRow *rows, Size count) {
	for (Size i = 0; i < count; i++) {
		if (pg_atomic_read_u32(BulkMark(rows[i].key_hash)) != 0) {
			return true;
		}
	}
	return false;
}

// A committer of many keys' gate: its backend's index and its local transaction id.
struct GateName {
	uint32 backend;
	LocalTransactionId lxid;
};

// The gates of this database's committers of many keys that marked one of these rows' stripes;
// palloc'd, `*found` of them. A marker whose owner marks or unmarks while it is read is passed
// over (the name read before its bits and after them must be the same, marked both times): only a
// look that follows that committer's next Exclusive lock has to find it (LockGlobalExclusive),
// and a name read with another transaction's bits would send the PREPARE to a gate that shares
// none of its stripes.
GateName *
MarkersOf(const NotedRow *rows, Size count, Size *found) {
	*found = 0;
	if (!AnyStripeMarked(rows, count)) {
		return nullptr;
	}
	pg_read_barrier();
	GateName *gates = static_cast<GateName *>(palloc(sizeof(GateName) * BackendCount()));
	for (uint32 b = 0; b < BackendCount(); b++) {
		volatile BulkMarker *m = BulkMarkerOf(b);
		if (pg_atomic_read_u32(&m->marking) == 0) {
			continue;
		}
		pg_read_barrier();
		LocalTransactionId lxid = m->lxid;
		Oid database = m->database;
		pg_read_barrier();
		bool hit = false;
		for (Size i = 0; i < count && !hit; i++) {
			uint32 bit = BulkMarkIndex(rows[i].key_hash);
			hit = (m->stripes[bit / 64] >> (bit % 64)) & 1;
		}
		pg_read_barrier();
		if (hit && database == MyDatabaseId && pg_atomic_read_u32(&m->marking) != 0 && m->lxid == lxid &&
		    m->database == database) {
			gates[(*found)++] = GateName{b, lxid};
		}
	}
	return gates;
}

// A prepared transaction gives its Share lock back at the end of its pre-prepare (below): held
// until COMMIT PREPARED, it would hold up every committer of many keys, and with it every
// committer queued behind that one's Exclusive request. So under the Exclusive lock a key lock
// may still be held without Share: by a PREPARE (prepared, or waiting for another key), by a commit
// that waits for another key (it has not stamped: no matter), or by one whose commit is visible.
// The committer of many keys tries each of its keys RowShare, which only a PREPARE's lock makes
// busy; at a busy one it gives the global lock back, waits for that key alone behind those queued
// for it (holding up nobody but PREPAREs of its keys), lets it go and starts again. It holds at
// most two of ours besides its prepare gate, which it takes at its first busy key (one that finds
// its keys free at once never asks for it). With its gate held its keys' stripes are marked: a
// PREPARE that finds one of its stripes marked by it before its first key waits at its gate, so of
// PREPAREs it waits only for those that looked before it marked, never for one that came later.
// Its gate is its own: nobody can name it before it marks, so it never waits for it, and behind
// no PREPARE waiting for another committer's.
void
LockGlobalExclusive(const NotedRow *rows, Size count) {
	if (max_prepared_xacts == 0) {
		Lock(0, 0, kGlobalLockClass, ExclusiveLock);
		return; // no prepared transaction: every holder of a key lock holds the Share lock too
	}
	bool gated = false;
	for (;;) {
		Lock(0, 0, kGlobalLockClass, ExclusiveLock);
		const NotedRow *busy = nullptr;
		for (Size i = 0; i < count && busy == nullptr; i++) {
			if (i > 0 && rows[i].key_hash == rows[i - 1].key_hash) {
				continue;
			}
			if (TryLockKey(rows[i].key_hash, kBulkTryMode)) {
				UnlockKey(rows[i].key_hash, kBulkTryMode);
			} else {
				busy = &rows[i];
			}
		}
		if (busy == nullptr) {
			if (gated) {
				UnmarkStripes();
				Unlock(OutboxBackendIndex(), OutboxLocalTransactionId(), kPrepareGateClass, ExclusiveLock);
			}
			return;
		}
		Unlock(0, 0, kGlobalLockClass, ExclusiveLock);
		if (!gated) {
			// Only one that must wait marks: a PREPARE need not wait for one whose keys are free.
			Lock(OutboxBackendIndex(), OutboxLocalTransactionId(), kPrepareGateClass, ExclusiveLock);
			MarkStripes(rows, count);
			gated = true;
		}
		WaitForKey(busy->key_hash, kBulkWaitMode);
		UnlockKey(busy->key_hash, kBulkWaitMode);
	}
}

// A committer of few keys: the Share lock, then its keys in hash order. With prepared
// transactions possible, a key lock may be held by one until COMMIT PREPARED, and a committer
// waiting for it while holding Share would let a committer of many keys queue its Exclusive
// request behind it, and everyone else behind that one. So it tries each key without waiting;
// at a busy one it gives back Share and its keys above the busy one (none: it takes them in
// order, except ones it waited for in an earlier round), waits for that key alone, keeps it and
// starts again. It waits only for a key above every key it holds, holding no global lock.
// A commit holds its keys ShareUpdateExclusive, a PREPARE Exclusive (kCommitKeyMode,
// kPrepareKeyMode). A PREPARE that finds, before its first key, one of its keys' stripes marked by
// committers of many keys waits at each one's gate once, holding nothing of ours, and lets it go
// (see LockGlobalExclusive).
void
LockKeys(const NotedRow *rows, Size count, bool preparing) {
	if (max_prepared_xacts == 0) {
		Lock(0, 0, kGlobalLockClass, ShareLock);
		for (Size i = 0; i < count; i++) {
			if (i == 0 || rows[i].key_hash != rows[i - 1].key_hash) {
				LockKey(rows[i].key_hash);
			}
		}
		return;
	}
	LOCKMODE mode = preparing ? kPrepareKeyMode : kCommitKeyMode;
	bool looked_at_marks = !preparing;
	// held[i]: the lock of the key starting at rows[i] is ours (rows are sorted by key hash).
	bool *held = static_cast<bool *>(palloc0(sizeof(bool) * count));
	for (;;) {
		Lock(0, 0, kGlobalLockClass, ShareLock);
		if (!looked_at_marks) {
			// Looked at under Share: the marks of a committer of many keys that took the Exclusive
			// lock before are seen. One that marks later may wait for this PREPARE's keys: it
			// looked first, and only once.
			looked_at_marks = true;
			Size found;
			GateName *gates = MarkersOf(rows, count, &found);
			if (found > 0) {
				Unlock(0, 0, kGlobalLockClass, ShareLock);
				for (Size g = 0; g < found; g++) {
					Lock(gates[g].backend, gates[g].lxid, kPrepareGateClass, ShareLock);
					Unlock(gates[g].backend, gates[g].lxid, kPrepareGateClass, ShareLock);
				}
				pfree(gates);
				continue;
			}
			if (gates != nullptr) {
				pfree(gates);
			}
		}
		Size busy = count;
		for (Size i = 0; i < count && busy == count; i++) {
			if ((i > 0 && rows[i].key_hash == rows[i - 1].key_hash) || held[i]) {
				continue;
			}
			if (TryLockKey(rows[i].key_hash, mode)) {
				held[i] = true;
			} else {
				busy = i;
			}
		}
		if (busy == count) {
			pfree(held);
			return;
		}
		Unlock(0, 0, kGlobalLockClass, ShareLock);
		for (Size i = busy + 1; i < count; i++) {
			if (held[i]) {
				UnlockKey(rows[i].key_hash, mode);
				held[i] = false;
			}
		}
		WaitForKey(rows[busy].key_hash, mode);
		held[busy] = true;
	}
}

// Writes no-op WAL until the insert position is above `stamp`. Every stamp this transaction
// keeps must lie below its commit (or PREPARE) record: after a restart or on a promoted standby
// that has the commit, the WAL position, and so every stamp given from then on, is above it. A
// re-stamp's rank counts the rows enqueue noted, also those deleted since (no UPDATE record for
// them): this pads by at most one byte for each such row. No stamp was above the insert position
// when noted (NoteKeyedRow) and stripes are raised only past padded WAL, so more than `bound`
// bytes means a bug: refuse rather than fill the disk. Interruptible: an ERROR here, at
// pre-commit, aborts the transaction like any other.
void
WriteWalPast(XLogRecPtr stamp, uint64 bound) {
	static char padding[8192];
	XLogRecPtr start = GetXLogInsertRecPtr();
	if (start <= stamp && stamp - start >= bound) {
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
		                errmsg("outbox: commit-order stamp %X/%X is %llu bytes ahead of the WAL", LSN_HIGH_LOW(stamp),
		                       static_cast<unsigned long long>(stamp - start)),
		                errdetail("At most %llu bytes of no-op WAL were expected.", static_cast<unsigned long long>(bound))));
	}
	for (XLogRecPtr at = start; at <= stamp; at = GetXLogInsertRecPtr()) {
		CHECK_FOR_INTERRUPTS();
		uint64 missing = stamp - at + 1;
		XLogBeginInsert();
		XLogRegisterData(padding, uint32(Min(missing, uint64(sizeof(padding)))));
		(void)XLogInsert(RM_XLOG_ID, XLOG_NOOP);
	}
}

int
CompareNoted(const void *a, const void *b) {
	const NotedRow *x = static_cast<const NotedRow *>(a);
	const NotedRow *y = static_cast<const NotedRow *>(b);
	if (x->key_hash != y->key_hash) {
		return x->key_hash < y->key_hash ? -1 : 1;
	}
	if (x->order_lsn != y->order_lsn) {
		return x->order_lsn < y->order_lsn ? -1 : 1;
	}
	return x->id < y->id ? -1 : (x->id > y->id ? 1 : 0);
}

void
RaiseStripe(uint64 key_hash, uint64 stamp) {
	pg_atomic_uint64 *stripe = OrderStripe(key_hash);
	uint64 current = pg_atomic_read_u64(stripe);
	while (current < stamp && !pg_atomic_compare_exchange_u64(stripe, &current, stamp)) {
	}
}

// A statement over the noted rows ($1 their ids, $2 their new stamps, $3 on a ring member their
// stamps at insert), prepared once per backend.
SPIPlanPtr
KeptRowsPlan(const char *query, int nargs, const char *what) {
	Oid types[3] = {INT8ARRAYOID, PG_LSNARRAYOID, PG_LSNARRAYOID};
	SPIPlanPtr plan = SPI_prepare(query, nargs, types);
	if (plan == nullptr) {
		elog(ERROR, "outbox: could not prepare the commit-order %s: %s", what, SPI_result_code_string(SPI_result));
	}
	SPI_keepplan(plan);
	return plan;
}

// Plans per target: 0.3.0's outbox.events, or ring member m at [1 + m].
constexpr int kTargets = 1 + kRingMembers;

int
TargetIndex(int member) {
	return member == kNoMember ? 0 : 1 + member;
}

// 0.3.0's table by id (its primary key). A ring member has no index on id: its row is found by
// (order_lsn, id), the claim's index, with the stamp it was inserted with.
SPIPlanPtr
RestampPlan(int member) {
	static SPIPlanPtr plans[kTargets] = {};
	SPIPlanPtr &plan = plans[TargetIndex(member)];
	if (plan == nullptr) {
		if (member == kNoMember) {
			plan = KeptRowsPlan("UPDATE outbox.events AS e SET order_lsn = u.order_lsn "
			                    "FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS u(id, order_lsn) "
			                    "WHERE e.id OPERATOR(pg_catalog.=) u.id",
			                    2, "statement");
		} else {
			char query[512];
			snprintf(query, sizeof(query),
			         "UPDATE outbox.%s AS e SET order_lsn = u.order_lsn "
			         "FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) "
			         "AS u(id, order_lsn, inserted_lsn) "
			         "WHERE e.order_lsn OPERATOR(pg_catalog.=) u.inserted_lsn AND e.id OPERATOR(pg_catalog.=) u.id",
			         RingMemberName(member));
			plan = KeptRowsPlan(query, 3, "statement");
		}
	}
	return plan;
}

// After the re-stamp (and the triggers it fired), 0.3.0's table: how many of the rows still
// exist, and how many of those hold another stamp than the one written. A ring member (whose
// rows are never deleted: its guard): how many rows are still at their old stamp, and how many
// at the new one.
SPIPlanPtr
ExistingRowsPlan(int member) {
	static SPIPlanPtr plans[kTargets] = {};
	SPIPlanPtr &plan = plans[TargetIndex(member)];
	if (plan == nullptr) {
		if (member == kNoMember) {
			plan = KeptRowsPlan("SELECT pg_catalog.count(*), "
			                    "pg_catalog.count(*) FILTER (WHERE e.order_lsn OPERATOR(pg_catalog.<>) u.order_lsn) "
			                    "FROM outbox.events AS e "
			                    "JOIN ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS u(id, order_lsn) "
			                    "ON e.id OPERATOR(pg_catalog.=) u.id",
			                    2, "count");
		} else {
			char query[768];
			const char *name = RingMemberName(member);
			snprintf(query, sizeof(query),
			         "SELECT (SELECT pg_catalog.count(*) FROM outbox.%s AS e "
			         "JOIN ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($3)) AS u(id, order_lsn) "
			         "ON e.order_lsn OPERATOR(pg_catalog.=) u.order_lsn AND e.id OPERATOR(pg_catalog.=) u.id), "
			         "(SELECT pg_catalog.count(*) FROM outbox.%s AS e "
			         "JOIN ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS u(id, order_lsn) "
			         "ON e.order_lsn OPERATOR(pg_catalog.=) u.order_lsn AND e.id OPERATOR(pg_catalog.=) u.id)",
			         name, name);
			plan = KeptRowsPlan(query, 3, "count");
		}
	}
	return plan;
}

// Writes the new stamps of one target's rows marked restamp (see WriteStamps), under SPI.
void
WriteTargetStamps(int member, Size count) {
	Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * count));
	Datum *stamps = static_cast<Datum *>(palloc(sizeof(Datum) * count));
	Datum *inserted = static_cast<Datum *>(palloc(sizeof(Datum) * count));
	Size n = 0;
	for (Size i = 0; i < noted_count; i++) {
		if (noted[i].restamp && noted[i].member == member) {
			ids[n] = Int64GetDatum(noted[i].id);
			stamps[n] = LSNGetDatum(noted[i].order_lsn);
			inserted[n] = LSNGetDatum(noted[i].inserted_lsn);
			n++;
		}
	}
	Datum values[3] = {PointerGetDatum(construct_array(ids, int(n), INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE)),
	                   PointerGetDatum(construct_array(stamps, int(n), PG_LSNOID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE)),
	                   PointerGetDatum(construct_array(inserted, int(n), PG_LSNOID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE))};
	const char *table = member == kNoMember ? "outbox.events" : psprintf("outbox.%s", RingMemberName(member));

	// The member's guard lets this UPDATE through (it only raises order_lsn); an ERROR ends the
	// allowance with the transaction (Forget).
	if (member != kNoMember) {
		AllowGenerationRestamp();
	}
	int rc = SPI_execute_plan(RestampPlan(member), values, nullptr, false, 0);
	EndGenerationRestamp();
	if (rc != SPI_OK_UPDATE) {
		elog(ERROR, "outbox: commit-order update failed: %s", SPI_result_code_string(rc));
	}
	uint64 updated = SPI_processed;
	// Rows deleted since their enqueue are not updated; any other row not updated (a BEFORE UPDATE
	// trigger that returned NULL) would keep a stamp out of commit order. Not read-only: a new
	// command id, so the count sees the rows as the UPDATE and the triggers it fired left them.
	rc = SPI_execute_plan(ExistingRowsPlan(member), values, nullptr, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1) {
		elog(ERROR, "outbox: commit-order count failed: %s", SPI_result_code_string(rc));
	}
	bool isnull;
	uint64 first = uint64(DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)));
	uint64 second = uint64(DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull)));
	uint64 existing, other_stamp;
	if (member == kNoMember) {
		existing = first;
		other_stamp = second;
	} else {
		// first: rows still at their old stamp (not updated); second: rows at the new one. An
		// updated row at neither got a stamp from a trigger.
		existing = updated + first;
		other_stamp = updated > second ? updated - second : 0;
	}
	if (updated < existing) { // more: an AFTER UPDATE trigger deleted a row since
		ereport(ERROR, (errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
		                errmsg("outbox: the commit-order update of %s changed %llu of %llu rows", table,
		                       static_cast<unsigned long long>(updated), static_cast<unsigned long long>(existing)),
		                errdetail("Rows the commit must move above an earlier commit of their key were not updated."),
		                errhint("A trigger on %s must not skip an UPDATE (a BEFORE UPDATE trigger returning NULL).",
		                        table)));
	}
	// A trigger that set order_lsn (NEW.order_lsn := OLD.order_lsn, say) would leave a stamp the
	// locks and the padding were not for: below an earlier commit of its key, or ahead of the WAL.
	if (other_stamp > 0) {
		ereport(ERROR, (errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
		                errmsg("outbox: the commit-order update of %s left %llu of %llu rows with another "
		                       "order_lsn than it wrote",
		                       table, static_cast<unsigned long long>(other_stamp),
		                       static_cast<unsigned long long>(existing)),
		                errdetail("Rows the commit must move above an earlier commit of their key did not get their new "
		                          "stamp."),
		                errhint("A trigger on %s must not set order_lsn (a BEFORE UPDATE trigger that changes "
		                        "NEW.order_lsn).",
		                        table)));
	}
}

// Writes the new stamps of the rows marked restamp, as the table's owner, in a restricted
// security context with a pinned search_path: no code of the committing role runs with the
// locks this file holds, except triggers someone put on outbox.events (docs/sql-api.md "The table").
// One statement per target the rows are in: 0.3.0's outbox.events, or each ring member.
//
// This runs in the pre-commit callback, after the deferred triggers fired: a trigger that an
// UPDATE here queues as deferred would not fire (none of the extension's own).
// SPI itself is fine there: the transaction is still fully open (PreCommit_Portals has closed
// the portals, an error still aborts it cleanly), which is what postgres_fdw relies on too.
void
WriteStamps(Oid events) {
	HeapTuple rel = SearchSysCache1(RELOID, ObjectIdGetDatum(events));
	if (!HeapTupleIsValid(rel)) {
		elog(ERROR, "outbox: cache lookup failed for relation %u", events);
	}
	// outbox.events (a view on 0.4.0) and the members belong to the extension's owner.
	Oid owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(rel))->relowner;
	ReleaseSysCache(rel);

	Oid saved_user;
	int saved_context;
	GetUserIdAndSecContext(&saved_user, &saved_context);
	// An ERROR below aborts the transaction, which restores both (AbortTransaction, AtEOXact_GUC).
	SetUserIdAndSecContext(owner, saved_context | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	int guc_level = NewGUCNestLevel();
	(void)set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
	                        true, 0, false);
	// A row level security policy that hid a row would skip its re-stamp silently: with
	// row_security off, a policy that applies to the owner makes the statement fail instead.
	(void)set_config_option("row_security", "off", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	for (int member = kNoMember; member < kRingMembers; member++) {
		Size rows = 0;
		for (Size i = 0; i < noted_count; i++) {
			rows += noted[i].restamp && noted[i].member == member ? 1 : 0;
		}
		if (rows > 0) {
			WriteTargetStamps(member, rows);
		}
	}
	PopActiveSnapshot();
	SPI_finish();
	AtEOXact_GUC(false, guc_level);
	SetUserIdAndSecContext(saved_user, saved_context);
}

// Pre-commit (and pre-prepare): every subtransaction has ended, all user code has run.
void
StampInCommitOrder(bool preparing) {
	if (noted_count == 0) {
		return;
	}
	Oid events = EventsRelation();
	if (!OidIsValid(events)) {
		return; // the extension was dropped after the enqueue, and the rows with it
	}
	qsort(noted, noted_count, sizeof(NotedRow), CompareNoted);
	Size keys = 0;
	for (Size i = 0; i < noted_count; i++) {
		keys += (i == 0 || noted[i].key_hash != noted[i - 1].key_hash) ? 1 : 0;
	}

	// Locks in one order (the global one, then keys by hash), taken after all user code: no
	// deadlock between committers, none with the caller's own locks (DESIGN.md "Commit order").
	bool global_exclusive = keys > KeyLockLimit();
	if (global_exclusive && preparing) {
		// Its Exclusive lock would be held until COMMIT PREPARED, and stop every enqueuing commit
		// of the database; giving it back at PREPARE would let a key's later committer go first.
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
		                errmsg("cannot PREPARE a transaction that enqueued events for more than %zu keys", KeyLockLimit()),
		                errdetail("It enqueued events for %zu distinct (topic, key) hashes; until COMMIT PREPARED its "
		                          "commit-order lock would hold up every enqueuing commit of the database.", keys),
		                errhint("Commit it without PREPARE TRANSACTION, or split it into transactions of at most %zu "
		                        "keys (max_locks_per_transaction / 2).", KeyLockLimit())));
	}
	stamping = true; // an enqueue from now on would come after its key was locked
	if (global_exclusive) {
		LockGlobalExclusive(noted, noted_count);
	} else {
		LockKeys(noted, noted_count, preparing);
	}

	// Under the locks, every earlier committer of a key has raised its stripe to its highest
	// stamp. A key whose lowest stamp here is not above the stripe gets new stamps above both the
	// stripe and the WAL insert position (read after the stripes), in the rows' own order.
	Size restamps = 0;
	for (Size start = 0, end; start < noted_count; start = end) {
		for (end = start + 1; end < noted_count && noted[end].key_hash == noted[start].key_hash; end++) {
		}
		uint64 stripe = pg_atomic_read_u64(OrderStripe(noted[start].key_hash));
		if (stripe >= noted[start].order_lsn) {
			for (Size i = start; i < end; i++) {
				noted[i].restamp = true;
				noted[i].order_lsn = stripe + 1 + (i - start);
			}
			restamps += end - start;
		}
	}
	if (restamps > 0) {
		XLogRecPtr insert = GetXLogInsertRecPtr();
		for (Size start = 0, end; start < noted_count; start = end) {
			for (end = start + 1; end < noted_count && noted[end].key_hash == noted[start].key_hash; end++) {
			}
			if (noted[start].restamp && noted[start].order_lsn < insert) {
				for (Size i = start; i < end; i++) {
					noted[i].order_lsn = insert + (i - start);
				}
			}
		}
		WriteStamps(events);
	}
	// Sorted by stamp within a key (new stamps keep that order): the last row has the highest.
	// The WAL goes past the highest stamp before any stripe shows it (DESIGN.md "Commit order").
	XLogRecPtr highest = 0;
	for (Size i = 0; i < noted_count; i++) {
		highest = Max(highest, noted[i].order_lsn);
	}
	WriteWalPast(highest, uint64(noted_count) + 65536);
	for (Size i = 0; i < noted_count; i++) {
		if (i + 1 == noted_count || noted[i + 1].key_hash != noted[i].key_hash) {
			RaiseStripe(noted[i].key_hash, noted[i].order_lsn);
		}
	}
	if (preparing) {
		// The key locks stay until COMMIT PREPARED; the Share lock only kept a committer of many
		// keys out while this one took its keys and stamped (LockGlobalExclusive waits for the keys).
		Unlock(0, 0, kGlobalLockClass, ShareLock);
	}
}

void
Forget() {
	EndGenerationRestamp();
	UnmarkStripes(); // a committer of many keys that failed while it waited for its keys
	stamping = false;
	noted = nullptr; // TopTransactionContext's memory, freed with it
	noted_count = 0;
	noted_capacity = 0;
}

void
OnTransactionEvent(XactEvent event, void *) {
	switch (event) {
	case XACT_EVENT_PRE_COMMIT:
		StampInCommitOrder(false);
		break;
	case XACT_EVENT_PRE_PREPARE:
		StampInCommitOrder(true);
		break;
	case XACT_EVENT_COMMIT:
	case XACT_EVENT_PARALLEL_COMMIT:
	case XACT_EVENT_ABORT:
	case XACT_EVENT_PARALLEL_ABORT:
	case XACT_EVENT_PREPARE:
		Forget();
		break;
	default:
		break;
	}
}

// The rows of the ending subtransaction (and of its ended children) are a suffix of the list:
// subtransaction ids grow, and every row noted since it began is its own or a child's.
void
OnSubtransactionEvent(SubXactEvent event, SubTransactionId mine, SubTransactionId parent, void *) {
	if (event == SUBXACT_EVENT_ABORT_SUB) {
		while (noted_count > 0 && noted[noted_count - 1].subxact >= mine) {
			noted_count--;
		}
	} else if (event == SUBXACT_EVENT_COMMIT_SUB) {
		for (Size i = noted_count; i > 0 && noted[i - 1].subxact >= mine; i--) {
			noted[i - 1].subxact = parent;
		}
	}
}

} // namespace

extern "C" {
static void
outbox_commit_order_xact_callback(XactEvent event, void *arg) {
	CallFromPostgres("outbox_commit_order_xact_callback", OnTransactionEvent, event, arg);
}
static void
outbox_commit_order_subxact_callback(SubXactEvent event, SubTransactionId mine, SubTransactionId parent, void *arg) {
	CallFromPostgres("outbox_commit_order_subxact_callback", OnSubtransactionEvent, event, mine, parent, arg);
}
}

// In _PG_init, so in the postmaster (every backend inherits them; with EXEC_BACKEND each backend
// runs _PG_init again, still before anything else loads): PostgreSQL calls the newest-registered
// callback first, so the pre-commit one runs after that of every library loaded later, lazily
// registering or not (DESIGN.md "Commit order", "Callbacks"). Called for every
// transaction of every backend: with nothing noted it returns at once.
void
RegisterCommitOrderCallbacks() {
	RegisterXactCallback(outbox_commit_order_xact_callback, nullptr);
	RegisterSubXactCallback(outbox_commit_order_subxact_callback, nullptr);
	callbacks_registered = true;
}

bool
CommitOrderTracked() {
	return CurrentQueueTarget().commit_order;
}

void
NoteKeyedRow(const text *topic, const text *key, int64 id, XLogRecPtr order_lsn, XLogRecPtr insert_before,
             int member) {
	if (stamping) {
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
		                errmsg("cannot enqueue an event while the transaction's events are put in commit order"),
		                errdetail("The commit of this transaction locked its keys already; a key enqueued now "
		                          "would not be in commit order."),
		                errhint("Do not call outbox.enqueue from a trigger on outbox.events.")));
	}
	// _PG_init registers the callbacks, or refuses to load, except in binary upgrade mode (it
	// registers nothing for pg_upgrade's LOAD): a row noted without them would never be stamped.
	if (!callbacks_registered) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		                errmsg("cannot enqueue a keyed event in binary upgrade mode"),
		                errdetail("outbox's commit-order callbacks are registered at server start, not in binary "
		                          "upgrade mode."),
		                errhint("Enqueue after pg_upgrade has finished and the server runs normally.")));
	}
	// The padding at commit (WriteWalPast) trusts the stamps: one above the WAL would make it
	// write WAL up to there.
	if (order_lsn > GetXLogInsertRecPtr()) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		                errmsg("outbox.events.order_lsn %X/%X of the new event is ahead of the WAL insert position",
		                       LSN_HIGH_LOW(order_lsn)),
		                errhint("order_lsn must keep its default, pg_current_wal_insert_lsn(): no trigger or default on "
		                        "outbox.events may set it.")));
	}
	// Across a restart the stripes are zero, and only the stamps' being at least the insert position
	// at their insert puts a row above its key's rows committed in the previous run.
	if (order_lsn < insert_before) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		                errmsg("outbox.events.order_lsn %X/%X of the new event is below the WAL insert position",
		                       LSN_HIGH_LOW(order_lsn)),
		                errdetail("The WAL insert position was %X/%X before the insert.", LSN_HIGH_LOW(insert_before)),
		                errhint("order_lsn must keep its default, pg_current_wal_insert_lsn(): no trigger or default on "
		                        "outbox.events may set it.")));
	}
	if (noted_count == noted_capacity) {
		Size capacity = noted_capacity == 0 ? 64 : noted_capacity * 2;
		noted = static_cast<NotedRow *>(noted == nullptr
		                                    ? MemoryContextAllocHuge(TopTransactionContext, capacity * sizeof(NotedRow))
		                                    : repalloc_huge(noted, capacity * sizeof(NotedRow)));
		noted_capacity = capacity;
	}
	// A 64-bit hash of (topic, key): equal keys lock and stripe together; unequal keys that
	// collide only share a lock and a re-stamp, never lose order.
	uint64 topic_hash = hash_bytes_extended(reinterpret_cast<const unsigned char *>(VARDATA_ANY(topic)),
	                                        int(VARSIZE_ANY_EXHDR(topic)), 0);
	uint64 key_hash = hash_bytes_extended(reinterpret_cast<const unsigned char *>(VARDATA_ANY(key)),
	                                      int(VARSIZE_ANY_EXHDR(key)), topic_hash);
	noted[noted_count++] = NotedRow{key_hash, id, order_lsn, order_lsn, GetCurrentSubTransactionId(), int16(member), false};
}

#ifdef OUTBOX_TEST_SEAMS
// Test builds only: outbox.test_enqueue_at_pre_commit = 'topic:key' plays a library loaded after
// outbox whose pre-commit callback enqueues (payload 'pre-commit'). Registered the first time the
// setting is given a value in a backend, so it is newer than outbox's own callbacks.
namespace {

void
EnqueueAtPreCommit(XactEvent event, void *) {
	const char *spec = settings.test_enqueue_at_pre_commit;
	if (event != XACT_EVENT_PRE_COMMIT || spec == nullptr || spec[0] == '\0') {
		return;
	}
	const char *colon = strchr(spec, ':');
	if (colon == nullptr) {
		elog(ERROR, "outbox test: outbox.test_enqueue_at_pre_commit must be 'topic:key'");
	}
	Oid types[2] = {TEXTOID, TEXTOID};
	Datum args[2] = {PointerGetDatum(cstring_to_text_with_len(spec, int(colon - spec))),
	                 PointerGetDatum(cstring_to_text(colon + 1))};
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	int rc = SPI_execute_with_args("SELECT outbox.enqueue($1, $2, 'pre-commit'::text)", 2, types, args, nullptr,
	                               false, 1);
	if (rc != SPI_OK_SELECT) {
		elog(ERROR, "outbox test: the enqueue at pre-commit failed: %s", SPI_result_code_string(rc));
	}
	PopActiveSnapshot();
	SPI_finish();
}

} // namespace

extern "C" {
static void
outbox_test_pre_commit_enqueue(XactEvent event, void *arg) {
	CallFromPostgres("outbox_test_pre_commit_enqueue", EnqueueAtPreCommit, event, arg);
}
}

void
RegisterPreCommitEnqueueForTest() {
	static bool registered = false;
	if (!registered) {
		RegisterXactCallback(outbox_test_pre_commit_enqueue, nullptr);
		registered = true;
	}
}
#endif

} // namespace outbox
