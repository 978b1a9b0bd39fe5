// outbox.lane_of(key, event_id): the relay lane of a row, for the table's lane check. The same
// function enqueue uses (kafka_names.hpp), so a row written by hand can only carry the lane the
// relay would have given it.
#include "boundary.hpp"
#include "kafka_names.hpp"

OUTBOX_SQL_FUNCTION(outbox_lane_of) {
	if (PG_ARGISNULL(1)) {
		PG_RETURN_NULL(); // event_id is NOT NULL in the table: the check fails there anyway
	}
	text *key = PG_ARGISNULL(0) ? nullptr : PG_GETARG_TEXT_PP(0);
	PG_RETURN_INT16(int16(outbox::LaneOfEvent(key ? VARDATA_ANY(key) : nullptr, key ? VARSIZE_ANY_EXHDR(key) : 0,
	                                          PG_GETARG_UUID_P(1)->data)));
}
