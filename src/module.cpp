// Module entry: PG_MODULE_MAGIC (PG_MODULE_MAGIC_EXT on 18+) and _PG_init. _PG_init runs in the postmaster, so it
// only registers things (settings, the commit-order callbacks, shared memory, the launcher of the relay workers): no
// librdkafka, no threads.
#include "shared/boundary.hpp"
#include "enqueue/commit_order.hpp"
#include "enqueue/member_insert.hpp"
#include "enqueue/queue_target.hpp"
#include "shared/open_writers.hpp"
#include "launcher/drop_database.hpp"
#include "shared/guc.hpp"
#include "launcher/launcher.hpp"
#include "shared/shmem.hpp"

extern "C" {
#if PG_VERSION_NUM >= 180000
// Name and version for pg_get_loaded_modules() (18+).
PG_MODULE_MAGIC_EXT(.name = "outbox", .version = OUTBOX_SCHEMA_VERSION);
#else
PG_MODULE_MAGIC;
#endif
}

namespace {

void
Init() {
	if (IsBinaryUpgrade) {
		return;
	}
	if (!process_shared_preload_libraries_in_progress) {
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		                errmsg("outbox must be loaded via shared_preload_libraries"),
		                errhint("Add outbox to shared_preload_libraries in postgresql.conf and restart the server.")));
	}
	outbox::DefineSettings();
	// Here, not at first use: registered before any library loaded after outbox, its pre-commit
	// callback runs after theirs (PostgreSQL calls the newest first).
	outbox::RegisterCommitOrderCallbacks();
	// enqueue's target follows an ALTER EXTENSION UPDATE to 0.4.0 in the same backend.
	outbox::RegisterQueueTargetInvalidation();
	outbox::RegisterMemberShapeInvalidation();
	outbox::RequestSharedMemory();
	outbox::RegisterOpenWritersCallbacks();
	outbox::RegisterLauncher();
	outbox::InstallDropDatabaseHook();
}

} // namespace

extern "C" {
PGDLLEXPORT void _PG_init(void);

void
_PG_init(void) {
	outbox::CallFromPostgres("_PG_init", Init);
}
}
