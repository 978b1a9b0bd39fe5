// exactly_once keeps max_prepared_transactions slots for the relay's batches (DESIGN.md "Exactly
// once", "What the relay trusts"): PREPARE TRANSACTION needs no privilege, and a role that may only
// connect could otherwise fill every slot with transactions that outlive its session and stop the
// relay's batches at their PREPARE. Called by the utility hook (drop_database.cpp) for PREPARE
// TRANSACTION statements; the relay's own PREPARE is not a statement and is never refused.
#pragma once

namespace outbox {

// ERROR (53400) when this PREPARE would leave fewer free slots than outbox.max_workers while
// outbox.delivery = exactly_once; nothing otherwise.
void RefusePrepareIntoRelayReserve();

} // namespace outbox
