// The relay background workers (DESIGN.md).
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

// From the launcher: starts the relay worker of a slot it reserved (a dynamic background worker
// that notifies the launcher when it stops). False when max_worker_processes has no room.
bool StartRelayWorker(int slot_number, uint32 generation, BackgroundWorkerHandle **handle);

} // namespace outbox
