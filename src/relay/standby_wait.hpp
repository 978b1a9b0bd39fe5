// Failover-safe publishing (DESIGN.md "Failover"): nothing is published before the standbys named
// in outbox.failover_standbys have flushed (or replayed) the WAL the claim flushed, so a failover
// to one of them cannot lose a business row whose event Kafka already has.
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

// The check and assign hooks of outbox.failover_standbys (guc.cpp): a value that does not parse
// is refused with the reason, and changes nothing.
bool CheckFailoverStandbys(char **newval, void **extra, GucSource source);
void AssignFailoverStandbys(const char *newval, void *extra);

enum class StandbyWait {
	Reached,  // the standbys have the WAL (or the setting is off, or the timeout publishes anyway)
	HeldBack, // outbox.failover_wait_timeout passed (outbox.failover_on_timeout = wait): do not publish
	Stopped,  // a stop request: do not publish
};

// In the claim's transaction, right after the WAL was flushed up to `flushed`: waits until the
// standbys have it, at most outbox.failover_wait_timeout, serving interrupts. While it waits, the
// worker's state is 'waiting for standby' with the standby and its lag as the reason.
StandbyWait WaitForFailoverStandbys(XLogRecPtr flushed);

// Whether the last batch was held back for the standbys (then the worker claims nothing until
// they caught up: WaitForHeldBackStandbys).
bool HeldBackForStandbys();

// Between claims, holding no rows: waits until the standbys reach what the held-back batch needed,
// at most max_ms (and not past a stop or a reload). True when the worker may claim again.
bool WaitForHeldBackStandbys(long max_ms);

} // namespace outbox
