// outbox.consumed_retention(): the dedup window consume_once and purge_consumed purge with, read
// from the library. Calling it loads the library, which refuses to load outside
// shared_preload_libraries: without the preload, current_setting() would read a placeholder any
// session can SET (outbox.consumed_retention = '1s' would purge every consumer's marks).
#include "shared/boundary.hpp"
#include "shared/guc.hpp"

OUTBOX_SQL_FUNCTION(outbox_consumed_retention) {
	static_cast<void>(fcinfo); // no arguments
	const int seconds = outbox::settings.consumed_retention_s;
	auto *window = static_cast<Interval *>(palloc0(sizeof(Interval)));
	// Whole days as days, like SHOW prints them ('30d' = interval '30 days'): across a DST change a
	// window of days stays calendar days.
	if (seconds % SECS_PER_DAY == 0) {
		window->day = seconds / SECS_PER_DAY;
	} else {
		window->time = int64(seconds) * USECS_PER_SEC;
	}
	PG_RETURN_INTERVAL_P(window);
}
