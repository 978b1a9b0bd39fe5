// The rules of an outbox event row (docs/sql-api.md "The table"), in one place: 0.3.0's table runs
// them as its CHECK (outbox.events_row_check), a 0.4.0 ring member in its stamp trigger.
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

// Refuses (23514, check_violation, naming the rule and the column) a new row of ring member `rel`
// that breaks a rule; `tuple` is the row as the BEFORE INSERT triggers left it.
void CheckMemberRow(Relation rel, HeapTuple tuple);

// The same for a row given as values and nulls by attribute (RelationGetDescr(rel)'s order).
void CheckMemberValues(Relation rel, const Datum *values, const bool *nulls);

} // namespace outbox
