// The wait events the relay reports in pg_stat_activity. PostgreSQL 17+ has named wait events for
// extensions (WaitEventExtensionNew): wait_event_type 'Extension', wait_event 'OutboxIdle' etc.,
// also listed in pg_wait_events. Before 17 every one of them shows as the generic 'Extension'.
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

enum class WaitPoint {
	Idle,      // OutboxIdle: nothing to publish, a backoff or a pause after an error
	Publish,   // OutboxPublish: a batch is out, waiting for the broker's acks
	StopRelay, // OutboxStopRelay: DROP DATABASE waits for the relay workers to exit
};

// The wait_event_info to pass to WaitLatch for `point`. Postgres code: may raise an ERROR on 17+
// the first time a name is registered (shared memory for custom wait events full).
uint32 WaitEventOf(WaitPoint point);

} // namespace outbox
