// Waking the relay when (and only when) the calling transaction commits: enqueue wakes the
// workers owning the lanes it wrote to, outbox.retry() and retry_failed() every worker of the
// database. Nothing is woken at abort or PREPARE TRANSACTION.
#pragma once

namespace outbox {

// The worker owning `lane` of this database is woken at commit.
void WakeLaneAtCommit(int lane);

// Every worker of this database is woken at commit.
void WakeAllAtCommit();

} // namespace outbox
