// enqueue's INSERT of an event with a generated id into the current ring member, without SPI
// (member_insert.hpp). Through SPI, a one-row INSERT pays its executor's set-up at every call (the
// plan cache's check, a ModifyTable and a Result node, a projection of the member's 14 columns,
// the trigger's tuple copies), work about as large as the heap and index inserts themselves.
// Here the steps the executor would take for this statement on this table, in its order:
//
//   the columns' defaults   id = nextval('outbox.events_id_seq'), created_at = now(), as the
//                           members' defaults say (the extension's own: not read from the catalog)
//   BEFORE INSERT trigger   "~outbox_stamp" (generation_stamp.cpp): the row rules
//                           (CheckMemberRow), then the registration and the stamp
//   NOT NULL                every NOT NULL column is set by construction
//   heap insert             table_tuple_insert, with the command id the statement would use
//   index entries           index_insert into every index ready for inserts, a unique one
//                           checked as the executor checks it (UNIQUE_CHECK_YES: an ERROR on a
//                           duplicate, a wait for an in-progress inserter of the same id)
//   end of the statement    CommandCounterIncrement, as SPI does after its statement
//
// It is taken only where those are all the steps there are: a member with exactly the
// extension's columns, its stamp trigger as the one INSERT trigger (enabled ALWAYS), no rule, no
// CHECK, no row-level security, and plain indexes (no expression, predicate or exclusion, no
// deferred uniqueness); a read-only transaction or parallel mode leaves it to SPI's error. Every
// other shape (an administrator's trigger on a member, say) takes the SPI statement, whose executor
// handles it. Locks are the executor's: RowExclusiveLock on the member and its indexes, to the end
// of the transaction. Rights: the function's (enqueue is SECURITY DEFINER: its owner's, who owns
// the member), as the statement would run with them.
#include "enqueue/member_insert.hpp"

#include "enqueue/row_check.hpp"
#include "shared/open_writers.hpp"

extern "C" {
#include "access/tableam.h"
#include "catalog/index.h"      // BuildIndexInfo, FormIndexDatum
#include "catalog/pg_trigger.h" // TRIGGER_FOR_*
#include "commands/sequence.h" // nextval_internal
#include "commands/trigger.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h" // IndexInfo
#include "utils/rel.h"
#include "utils/xid8.h" // FullTransactionIdGetDatum
}

namespace outbox {

namespace {

// A member's columns, as the extension makes them (sql/outbox--0.3.0--0.4.0.sql).
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
	kColumnCount
};

struct ColumnShape {
	const char *name;
	Oid type;
};
constexpr ColumnShape kColumns[kColumnCount] = {
    {"id", INT8OID},          {"event_id", UUIDOID},  {"topic", TEXTOID},          {"key", TEXTOID},
    {"lane", INT2OID},        {"payload", BYTEAOID},  {"headers", JSONBOID},       {"created_at", TIMESTAMPTZOID},
    {"order_lsn", PG_LSNOID}, {"writer", XID8OID},    {"target_partition", INT4OID}, {"ce_content_type", TEXTOID},
    {"ce_type", TEXTOID},     {"ce_source", TEXTOID},
};

constexpr const char *kStampTrigger = "~outbox_stamp";
constexpr int kMaxIndexes = 8;

// attnum (0-based) of each Column in desc, or false: a column this path does not know, or one
// of its columns missing or of another type.
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
		if (found < 0 || att->atttypid != kColumns[found].type || positions[found] >= 0) {
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

// The member's INSERT has no step beyond the ones above: its one INSERT trigger is the stamp.
bool
OnlyTheStampTrigger(Relation rel) {
	TriggerDesc *triggers = rel->trigdesc;
	int stamps = 0;
	for (int i = 0; triggers != nullptr && i < triggers->numtriggers; i++) {
		const Trigger &t = triggers->triggers[i];
		if (!TRIGGER_FOR_INSERT(t.tgtype)) {
			continue; // the guard (UPDATE, DELETE, TRUNCATE)
		}
		if (strcmp(t.tgname, kStampTrigger) != 0 || !TRIGGER_FOR_ROW(t.tgtype) || !TRIGGER_FOR_BEFORE(t.tgtype) ||
		    t.tgenabled != TRIGGER_FIRES_ALWAYS) {
			return false;
		}
		stamps++;
	}
	return stamps == 1;
}

bool
PlainTable(Relation rel) {
	TupleConstr *constr = RelationGetDescr(rel)->constr;
	return rel->rd_rel->relkind == RELKIND_RELATION && rel->rd_rules == nullptr && !rel->rd_rel->relrowsecurity &&
	       (constr == nullptr || (constr->num_check == 0 && !constr->has_generated_stored));
}

// Opens the member's indexes as ExecOpenIndices does; false: one this path does not insert into
// as the executor would (they stay locked, as the SPI statement would lock them).
bool
OpenIndexes(Relation rel, Relation *indexes, IndexInfo **infos, int *count) {
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
		plain = info->ii_Expressions == NIL && info->ii_Predicate == NIL && info->ii_ExclusionOps == nullptr &&
		        (!info->ii_Unique || index->rd_index->indimmediate);
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

Oid
IdSequence() {
	Oid nsp = get_namespace_oid("outbox", false);
	Oid seq = get_relname_relid("events_id_seq", nsp);
	if (!OidIsValid(seq)) {
		ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT), errmsg("outbox: sequence outbox.events_id_seq is missing"),
		                errhint("ALTER EXTENSION outbox UPDATE, or make the extension again.")));
	}
	return seq;
}

} // namespace

bool
InsertIntoMember(Oid member_rel, const MemberRowValues &row, int64 *id, XLogRecPtr *order_lsn) {
	if (XactReadOnly || IsInParallelMode()) {
		return false; // the SPI statement raises the error the executor gives
	}
	Relation rel = table_open(member_rel, RowExclusiveLock);
	TupleDesc desc = RelationGetDescr(rel);
	int at[kColumnCount];
	Relation indexes[kMaxIndexes];
	IndexInfo *infos[kMaxIndexes];
	int n_indexes = 0;
	if (!PlainTable(rel) || !OnlyTheStampTrigger(rel) || !ColumnPositions(desc, at) ||
	    !OpenIndexes(rel, indexes, infos, &n_indexes)) {
		CloseIndexes(indexes, n_indexes);
		table_close(rel, NoLock);
		return false;
	}

	Datum *values = static_cast<Datum *>(palloc0(sizeof(Datum) * desc->natts));
	bool *nulls = static_cast<bool *>(palloc(sizeof(bool) * desc->natts));
	memset(nulls, true, sizeof(bool) * desc->natts);
	auto set = [&](Column c, Datum value, bool null = false) {
		values[at[c]] = value;
		nulls[at[c]] = null;
	};
	// The defaults, in the order the executor evaluates the target list (by column).
	*id = nextval_internal(IdSequence(), true);
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
