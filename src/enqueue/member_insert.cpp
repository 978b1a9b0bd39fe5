// enqueue's INSERT of an event with a generated id into the current ring member, without SPI
// (member_insert.hpp). Through SPI, a one-row INSERT pays its executor's set-up at every call (the
// plan cache's check, a ModifyTable and a Result node, a projection of the member's 14 columns,
// the trigger's tuple copies), work about as large as the heap and index inserts themselves.
// Here the steps the executor would take for this statement on this table, in its order:
//
//   permissions             INSERT on the member for the current user (enqueue is SECURITY
//                           DEFINER: its owner), as the executor checks it; nextval checks USAGE
//   the columns' defaults   id = the sequence of its default (nextval), created_at = now(),
//                           caller_event_id = false (given: the id is enqueue's; its default,
//                           true, is for rows written by hand), the other columns NULL: the
//                           member's defaults are checked to be exactly those (MemberShape), not
//                           evaluated
//   BEFORE INSERT trigger   "~outbox_stamp" (generation_stamp.cpp): the row rules
//                           (CheckMemberValues), then the registration and the stamp
//   NOT NULL                the columns that have it are the ones set here (MemberShape)
//   heap insert             table_tuple_insert with the current command id (SPI would advance
//                           the counter before its statement: the row is invisible to the rest
//                           of the calling statement either way, and visible after it)
//   index entries           index_insert into every btree ready for inserts whose predicate the
//                           row meets, a unique one checked as the executor checks it
//                           (UNIQUE_CHECK_YES: an ERROR on a duplicate, a wait for an in-progress
//                           inserter of the same id). The one predicate known is schema 0.4.1's
//                           "WHERE caller_event_id" (the event-id index: only a caller's id has an
//                           entry), which this row, with a generated id, does not meet
//   end of the statement    CommandCounterIncrement, as SPI does after its statement
//
// It is taken only where those are all the steps there are (MemberShape, OpenIndexes): the
// extension's columns, defaults and NOT NULLs, no identity or generated column, its stamp trigger
// (its own function, no WHEN, no arguments, enabled ALWAYS) as the one INSERT trigger, no rule,
// CHECK, row-level security or partition constraint, plain btree indexes (no expression, no
// deferred uniqueness, no predicate but exactly `WHERE caller_event_id`, the column itself, which
// is evaluated here as the executor would: the row's value), a read-write transaction outside
// parallel mode, and no
// ExecutorCheckPerms_hook (sepgsql, pgaudit's object audit see the statement). Every other shape
// (an administrator's trigger on a member, say) takes the SPI statement, whose executor handles it.
// Locks: RowExclusiveLock on the member and its indexes, to the end of the transaction.
#include "enqueue/member_insert.hpp"

#include "enqueue/row_check.hpp"
#include "shared/open_writers.hpp"

extern "C" {
#include "access/tableam.h"
#include "catalog/index.h"      // BuildIndexInfo, FormIndexDatum
#include "catalog/pg_am.h"      // BTREE_AM_OID
#include "catalog/pg_language.h" // ClanguageId
#include "catalog/pg_trigger.h" // TRIGGER_FOR_*
#include "commands/sequence.h"  // nextval_internal
#include "commands/trigger.h"
#include "executor/executor.h"  // ExecutorCheckPerms_hook
#include "executor/tuptable.h"
#include "nodes/execnodes.h"    // IndexInfo
#include "nodes/primnodes.h"
#include "utils/builtins.h"     // text_to_cstring
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/xid8.h"         // FullTransactionIdGetDatum
}

namespace outbox {

namespace {

// A member's columns, as the extension makes them (sql/outbox--0.3.0--0.4.0.sql, caller_event_id
// since 0.4.1: a 0.4.0 member, before ALTER EXTENSION UPDATE, takes the statement).
enum Column {
	kId,
	kEventId,
	kTopic,
	kKey,
	kLane,
	kPayload,
	kHeaders,
	kCreatedAt,
	kOrderLsn,
	kWriter,
	kTargetPartition,
	kCeContentType,
	kCeType,
	kCeSource,
	kCallerEventId,
	kColumnCount
};

struct ColumnShape {
	const char *name;
	Oid type;
	bool not_null;
};
constexpr ColumnShape kColumns[kColumnCount] = {
    {"id", INT8OID, true},
    {"event_id", UUIDOID, true},
    {"topic", TEXTOID, true},
    {"key", TEXTOID, false},
    {"lane", INT2OID, true},
    {"payload", BYTEAOID, false},
    {"headers", JSONBOID, false},
    {"created_at", TIMESTAMPTZOID, true},
    {"order_lsn", PG_LSNOID, true},
    {"writer", XID8OID, true},
    {"target_partition", INT4OID, false},
    {"ce_content_type", TEXTOID, false},
    {"ce_type", TEXTOID, false},
    {"ce_source", TEXTOID, false},
    {"caller_event_id", BOOLOID, true},
};

constexpr const char *kStampTrigger = "~outbox_stamp";
constexpr const char *kStampFunction = "outbox_generation_stamp";
constexpr int kMaxIndexes = 8;

// What the direct way needs to know of a member, found once and kept until a relcache
// invalidation of the member (any change of its columns, defaults, constraints, triggers, rules,
// policies, indexes or rights sends one) or a change of any function (the stamp's).
struct MemberShape {
	Oid relid;             // InvalidOid: an empty slot
	bool direct;           // the direct way may write it
	int at[kColumnCount];  // the columns' attribute indexes (0-based)
	Oid sequence;          // the sequence of id's default
};
MemberShape shapes[4] = {};
// Counts the invalidations: a verdict is kept only if none came while it was found (a syscache
// miss inside ShapeOf may take one in; a change of the stamp's function needs no member lock).
uint64 invalidations = 0;

// attnum (0-based) of each Column, with the extension's types and NOT NULLs, no identity and no
// generated column; false otherwise.
bool
ColumnPositions(TupleDesc desc, int positions[kColumnCount]) {
	for (int c = 0; c < kColumnCount; c++) {
		positions[c] = -1;
	}
	for (int i = 0; i < desc->natts; i++) {
		Form_pg_attribute att = TupleDescAttr(desc, i);
		if (att->attisdropped) {
			continue; // events_0 keeps 0.3.0's dropped columns
		}
		int found = -1;
		for (int c = 0; c < kColumnCount && found < 0; c++) {
			if (strcmp(NameStr(att->attname), kColumns[c].name) == 0) {
				found = c;
			}
		}
		if (found < 0 || att->atttypid != kColumns[found].type || positions[found] >= 0 ||
		    att->attnotnull != kColumns[found].not_null || att->attidentity != '\0' || att->attgenerated != '\0') {
			return false;
		}
		positions[found] = i;
	}
	for (int c = 0; c < kColumnCount; c++) {
		if (positions[c] < 0) {
			return false;
		}
	}
	return true;
}

// The member's defaults are the extension's: id's nextval of a sequence (returned), created_at's
// now() and caller_event_id's true, no other.
bool
ExtensionDefaults(TupleDesc desc, const int at[kColumnCount], Oid *sequence) {
	TupleConstr *constr = desc->constr;
	if (constr == nullptr || constr->num_defval != 3) {
		return false;
	}
	bool id = false, created_at = false, caller_event_id = false;
	for (int i = 0; i < constr->num_defval; i++) {
		Node *expr = static_cast<Node *>(stringToNode(constr->defval[i].adbin));
		auto *call = IsA(expr, FuncExpr) ? reinterpret_cast<FuncExpr *>(expr) : nullptr;
		AttrNumber attnum = constr->defval[i].adnum;
		if (call != nullptr && attnum == at[kId] + 1 && call->funcid == F_NEXTVAL && list_length(call->args) == 1 &&
		    IsA(linitial(call->args), Const)) {
			auto *arg = static_cast<Const *>(linitial(call->args));
			if (arg->consttype == REGCLASSOID && !arg->constisnull) {
				*sequence = DatumGetObjectId(arg->constvalue);
				id = true;
			}
		} else if (call != nullptr && attnum == at[kCreatedAt] + 1 && call->funcid == F_NOW && call->args == NIL) {
			created_at = true;
		} else if (IsA(expr, Const) && attnum == at[kCallerEventId] + 1) {
			auto *value = reinterpret_cast<Const *>(expr);
			caller_event_id = value->consttype == BOOLOID && !value->constisnull && DatumGetBool(value->constvalue);
		}
	}
	return id && created_at && caller_event_id;
}

// The stamp, the extension's C function, with no WHEN and no arguments.
bool
IsTheStamp(const Trigger &t) {
	if (strcmp(t.tgname, kStampTrigger) != 0 || !TRIGGER_FOR_ROW(t.tgtype) || !TRIGGER_FOR_BEFORE(t.tgtype) ||
	    t.tgenabled != TRIGGER_FIRES_ALWAYS || t.tgqual != nullptr || t.tgnargs != 0) {
		return false;
	}
	HeapTuple proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(t.tgfoid));
	if (!HeapTupleIsValid(proc)) {
		return false;
	}
	bool ours = false;
	if (reinterpret_cast<Form_pg_proc>(GETSTRUCT(proc))->prolang == ClanguageId) {
		bool null;
		Datum src = SysCacheGetAttr(PROCOID, proc, Anum_pg_proc_prosrc, &null);
		ours = !null && strcmp(TextDatumGetCString(src), kStampFunction) == 0;
	}
	ReleaseSysCache(proc);
	return ours;
}

// The member's INSERT has no trigger step beyond the stamp.
bool
OnlyTheStampTrigger(Relation rel) {
	TriggerDesc *triggers = rel->trigdesc;
	int stamps = 0;
	for (int i = 0; triggers != nullptr && i < triggers->numtriggers; i++) {
		const Trigger &t = triggers->triggers[i];
		if (!TRIGGER_FOR_INSERT(t.tgtype)) {
			continue; // the guard (UPDATE, DELETE, TRUNCATE)
		}
		if (!IsTheStamp(t)) {
			return false;
		}
		stamps++;
	}
	return stamps == 1;
}

bool
PlainTable(Relation rel) {
	TupleConstr *constr = RelationGetDescr(rel)->constr;
	return rel->rd_rel->relkind == RELKIND_RELATION && !rel->rd_rel->relispartition && rel->rd_rules == nullptr &&
	       !rel->rd_rel->relrowsecurity && (constr == nullptr || constr->num_check == 0);
}

const MemberShape &
ShapeOf(Relation rel) {
	Oid relid = RelationGetRelid(rel);
	MemberShape *slot = nullptr;
	for (MemberShape &shape : shapes) {
		if (shape.relid == relid) {
			return shape;
		}
		if (slot == nullptr && !OidIsValid(shape.relid)) {
			slot = &shape;
		}
	}
	if (slot == nullptr) {
		slot = &shapes[0]; // more members than slots: a rotation renamed them; take one over
	}
	uint64 before = invalidations;
	MemberShape shape = {};
	shape.relid = relid;
	shape.direct = PlainTable(rel) && OnlyTheStampTrigger(rel) && ColumnPositions(RelationGetDescr(rel), shape.at) &&
	               ExtensionDefaults(RelationGetDescr(rel), shape.at, &shape.sequence);
	if (invalidations != before) {
		shape.relid = InvalidOid; // used for this call, found again at the next
		static MemberShape unkept;
		unkept = shape;
		return unkept;
	}
	*slot = shape; // only now: an ERROR above leaves the slot empty
	return *slot;
}

// Whether an index's predicate (BuildIndexInfo's: constant-folded, implicitly ANDed) is exactly
// schema 0.4.1's `WHERE caller_event_id`: the member's column `caller_att` (0-based) itself.
bool
IsCallerIdPredicate(const List *predicate, int caller_att) {
	if (list_length(predicate) != 1 || !IsA(linitial(predicate), Var)) {
		return false;
	}
	const Var *var = static_cast<const Var *>(linitial(predicate));
	return var->varno == 1 && var->varattno == caller_att + 1 && var->varlevelsup == 0 && var->vartype == BOOLOID;
}

// Opens the member's indexes as ExecOpenIndices does; false: one this path does not insert into
// as the executor would (they stay locked, as the SPI statement would lock them). An index with
// a predicate is one only when the predicate is `WHERE caller_event_id` (IsCallerIdPredicate):
// the caller then inserts into it only a row whose caller_event_id is true.
bool
OpenIndexes(Relation rel, int caller_att, Relation *indexes, IndexInfo **infos, int *count) {
	List *oids = RelationGetIndexList(rel);
	*count = 0;
	bool plain = list_length(oids) <= kMaxIndexes;
	ListCell *lc;
	foreach (lc, oids) {
		if (!plain) {
			break;
		}
		Relation index = index_open(lfirst_oid(lc), RowExclusiveLock);
		IndexInfo *info = BuildIndexInfo(index);
		indexes[*count] = index;
		infos[*count] = info;
		(*count)++;
		plain = index->rd_rel->relam == BTREE_AM_OID && info->ii_Expressions == NIL &&
		        (info->ii_Predicate == NIL || IsCallerIdPredicate(info->ii_Predicate, caller_att)) &&
		        info->ii_ExclusionOps == nullptr && (!info->ii_Unique || index->rd_index->indimmediate);
	}
	list_free(oids);
	return plain;
}

void
CloseIndexes(Relation *indexes, int count) {
	for (int i = 0; i < count; i++) {
		index_close(indexes[i], NoLock); // locked to the end of the transaction
	}
}

void
ForgetShapes() {
	invalidations++;
	for (MemberShape &shape : shapes) {
		shape.relid = InvalidOid;
	}
}

} // namespace

extern "C" {
static void
outbox_member_shape_relcache(Datum, Oid relid) {
	// Plain assignments: nothing that can throw or ereport.
	outbox::invalidations++;
	for (outbox::MemberShape &shape : outbox::shapes) {
		if (!OidIsValid(relid) || shape.relid == relid) {
			shape.relid = InvalidOid;
		}
	}
}

static void
outbox_member_shape_proc(Datum, int, uint32) {
	outbox::ForgetShapes();
}
}

void
RegisterMemberShapeInvalidation() {
	CacheRegisterRelcacheCallback(outbox_member_shape_relcache, Datum(0));
	CacheRegisterSyscacheCallback(PROCOID, outbox_member_shape_proc, Datum(0));
}

bool
InsertIntoMember(Oid member_rel, const MemberRowValues &row, int64 *id, XLogRecPtr *order_lsn) {
	if (XactReadOnly || IsInParallelMode() || ExecutorCheckPerms_hook != nullptr) {
		return false; // the statement: its error, or the hook's view of it
	}
	Relation rel = table_open(member_rel, RowExclusiveLock);
	const MemberShape &shape = ShapeOf(rel);
	Relation indexes[kMaxIndexes];
	IndexInfo *infos[kMaxIndexes];
	int n_indexes = 0;
	if (!shape.direct || pg_class_aclcheck(member_rel, GetUserId(), ACL_INSERT) != ACLCHECK_OK ||
	    !OpenIndexes(rel, shape.at[kCallerEventId], indexes, infos, &n_indexes)) {
		CloseIndexes(indexes, n_indexes);
		table_close(rel, NoLock);
		return false;
	}
	TupleDesc desc = RelationGetDescr(rel);
	int at[kColumnCount];
	memcpy(at, shape.at, sizeof(at)); // the shape may be forgotten by an invalidation below
	Oid sequence = shape.sequence;

	Datum *values = static_cast<Datum *>(palloc0(sizeof(Datum) * desc->natts));
	bool *nulls = static_cast<bool *>(palloc(sizeof(bool) * desc->natts));
	memset(nulls, true, sizeof(bool) * desc->natts);
	auto set = [&](Column c, Datum value, bool null = false) {
		values[at[c]] = value;
		nulls[at[c]] = null;
	};
	// The defaults, in the order the executor evaluates the target list (by column).
	*id = nextval_internal(sequence, true);
	set(kId, Int64GetDatum(*id));
	set(kEventId, row.event_id);
	set(kTopic, row.topic);
	set(kKey, row.key, row.key_null);
	set(kLane, Int16GetDatum(row.lane));
	set(kPayload, row.payload, row.payload_null);
	set(kHeaders, row.headers, row.headers_null);
	set(kCreatedAt, TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()));
	set(kTargetPartition, Int32GetDatum(row.target_partition), row.partition_null);
	set(kCeContentType, row.ce_content_type, row.ce_content_type == Datum(0));
	set(kCeType, row.ce_type, row.ce_type == Datum(0));
	set(kCeSource, row.ce_source, row.ce_source == Datum(0));
	set(kCallerEventId, BoolGetDatum(false)); // the id is enqueue's (this path takes no caller's)

	// The stamp trigger's work, in its order: the rules on the row as given (they read no stamp
	// column), then the registration, and only then the stamp (generation_stamp.cpp).
	CheckMemberValues(rel, values, nulls);
	*order_lsn = StampOpenWriterRow();
	set(kOrderLsn, LSNGetDatum(*order_lsn));
	set(kWriter, FullTransactionIdGetDatum(GetTopFullTransactionId()));

	TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, table_slot_callbacks(rel));
	ExecClearTuple(slot);
	memcpy(slot->tts_values, values, sizeof(Datum) * desc->natts);
	memcpy(slot->tts_isnull, nulls, sizeof(bool) * desc->natts);
	ExecStoreVirtualTuple(slot);
	table_tuple_insert(rel, slot, GetCurrentCommandId(true), 0, nullptr);

	for (int i = 0; i < n_indexes; i++) {
		if (!infos[i]->ii_ReadyForInserts) {
			continue; // being built concurrently: it takes the row in its own pass
		}
		// The predicate, evaluated: it is the row's caller_event_id (OpenIndexes let no other in).
		if (infos[i]->ii_Predicate != NIL && !DatumGetBool(values[at[kCallerEventId]])) {
			continue;
		}
		Datum key_values[INDEX_MAX_KEYS];
		bool key_nulls[INDEX_MAX_KEYS];
		FormIndexDatum(infos[i], slot, nullptr, key_values, key_nulls); // no expressions to evaluate
		(void)index_insert(indexes[i], key_values, key_nulls, &slot->tts_tid, rel,
		                   infos[i]->ii_Unique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, false, infos[i]);
	}
	ExecDropSingleTupleTableSlot(slot);
	CloseIndexes(indexes, n_indexes);
	table_close(rel, NoLock);
	CommandCounterIncrement();
	return true;
}

} // namespace outbox
