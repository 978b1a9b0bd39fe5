// outbox.lane_of(key, event_id): the relay lane of a row, for the table's lane check. The same
// function enqueue uses (kafka_names.hpp), so a row written by hand can only carry the lane the
// relay would have given it.
#include "shared/boundary.hpp"
#include "shared/kafka_names.hpp"

OUTBOX_SQL_FUNCTION(outbox_lane_of) {
	if (!PG_ARGISNULL(0)) {
		text *key = PG_GETARG_TEXT_PP(0);
		PG_RETURN_INT16(int16(outbox::LaneOf(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key))));
	}
	if (PG_ARGISNULL(1)) {
		PG_RETURN_NULL(); // no key and no event id: event_id is NOT NULL in the table anyway
	}
	PG_RETURN_INT16(int16(outbox::LaneOfEvent(nullptr, 0, PG_GETARG_UUID_P(1)->data)));
}
