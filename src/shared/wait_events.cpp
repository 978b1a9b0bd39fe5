// Named wait events on PostgreSQL 17+ (wait_events.hpp). Each backend registers a name once (the
// server keeps one id per name, cluster-wide) and remembers the id.
#include "shared/wait_events.hpp"

namespace outbox {

namespace {

#if PG_VERSION_NUM >= 170000
constexpr const char *kWaitEventNames[] = {"OutboxIdle", "OutboxPublish", "OutboxStopRelay"};
uint32 wait_event_ids[lengthof(kWaitEventNames)]; // 0: not registered yet in this backend
#endif

} // namespace

uint32
WaitEventOf(WaitPoint point) {
#if PG_VERSION_NUM >= 170000
	int i = int(point);
	if (wait_event_ids[i] == 0) {
		wait_event_ids[i] = WaitEventExtensionNew(kWaitEventNames[i]);
	}
	return wait_event_ids[i];
#else
	(void)point;
	return PG_WAIT_EXTENSION;
#endif
}

} // namespace outbox
