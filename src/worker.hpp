// The relay background workers (DESIGN.md).
#pragma once

namespace outbox {

// From _PG_init: registers outbox.workers static background workers.
void RegisterRelayWorkers();

} // namespace outbox
