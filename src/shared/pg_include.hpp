// The one place that includes PostgreSQL's server headers into C++.
//
// Files that own C++ objects with destructors must not include this header (see
// no_postgres.hpp): an ereport(ERROR) longjmps, and a longjmp over a live destructor is undefined
// behaviour. Files that include it keep to plain data on the stack and enter C++ only through the
// guards in boundary.hpp.
#pragma once

extern "C" {
#include "postgres.h"

#include "access/transam.h"         // FirstNormalObjectId
#include "access/twophase.h"        // max_prepared_xacts: commit order's global lock
#include "access/xact.h"            // StartTransactionCommand, RegisterXactCallback
#include "access/xlog.h"            // XLogFlush, GetXLogInsertRecPtr: durability, commit-order stamps
#include "access/xlog_internal.h"   // XLogSegmentOffset, page header sizes: the end of the inserted WAL
#include "access/xloginsert.h"      // XLogInsert: commit order's WAL past its stamps
#include "catalog/pg_control.h"     // XLOG_NOOP
#include "catalog/dependency.h"     // getExtensionOfObject: the relay's objects are the extension's
#include "catalog/pg_class.h"       // RELKIND_RELATION
#include "catalog/pg_database.h"    // DatabaseRelationId (16+: object_ownercheck)
#include "catalog/pg_namespace.h"   // NamespaceRelationId
#include "catalog/pg_extension.h"   // extversion: the relay waits for ALTER EXTENSION UPDATE
#include "catalog/indexing.h"
#include "access/genam.h"           // systable_beginscan
#include "access/table.h"
#include "utils/fmgroids.h"         // F_OIDEQ
#include "commands/extension.h"     // get_extension_oid
#include "catalog/pg_proc.h"        // Anum_pg_proc_oid: the relay role's EXECUTE on events_row_check
#include "catalog/pg_authid.h"      // BOOTSTRAP_SUPERUSERID
#include "utils/acl.h"              // the relay role's rights, DROP DATABASE ownership
#include "catalog/namespace.h"      // get_namespace_oid
#include "catalog/pg_type.h"        // type OIDs for SPI parameters
#include "commands/dbcommands.h"    // get_database_name
#include "common/hashfn.h"          // hash_bytes_extended (stable lane hash)
#include "executor/spi.h"           // SPI_*
#include "fmgr.h"
#include "funcapi.h"                // set-returning worker_status()
#include "mb/pg_wchar.h"            // pg_server_to_any: payloads and ids are UTF-8
#include "miscadmin.h"
#include "pgstat.h"                 // pgstat_report_activity, pgstat_report_stat
#include "portability/instr_time.h" // the relay's timings (metrics.hpp)
#include "postmaster/bgworker.h"
#if PG_VERSION_NUM < 150000
#include "postmaster/autovacuum.h"  // autovacuum_max_workers: MaxBackends before it is known
#endif
#include "postmaster/interrupt.h"   // ShutdownRequestPending, ConfigReloadPending
#include "replication/syncrep.h"    // SyncRepWaitForLSN, as a commit waits for synchronous standbys
#include "replication/walsender.h"  // max_wal_senders: failover-safe publishing (standby_wait.cpp)
#include "replication/walsender_private.h" // WalSndCtl: the standbys' flush and replay positions
#include "access/xlog_internal.h"   // SizeOfXLogShortPHD: a WAL position just past a page header
#if PG_VERSION_NUM >= 140000
#include "utils/backend_status.h"   // a walsender's application_name (pgstat.h before 14)
#endif
#include "storage/bufmgr.h"         // the relay's error recovery releases what a transaction would
#include "storage/fd.h"
#include "storage/ipc.h"            // before_shmem_exit, shmem hooks
#include "storage/latch.h"
#include "storage/lmgr.h"           // ConditionalLockRelationOid
#include "storage/lwlock.h"
#include "storage/smgr.h"
#include "storage/proc.h"           // MyProc
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"          // debug_query_string
#include "utils/array.h"
#include "utils/builtins.h"         // text_to_cstring
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/json.h"         // escape_json: trace context headers
#include "utils/jsonb.h"
#include "utils/lsyscache.h"        // get_relname_relid
#include "utils/memutils.h"
#include "utils/pg_lsn.h"           // LSNGetDatum: commit-order stamps
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/catcache.h"         // CatCList (members of the relay role)
#include "utils/syscache.h"         // SearchSysCacheExists1
#include "utils/timeout.h"          // disable_all_timeouts
#include "utils/timestamp.h"
#include "utils/uuid.h"
#if PG_VERSION_NUM >= 180000
#include "storage/aio_subsys.h"     // pgaio_error_cleanup
#endif
}

// PostgreSQL 14 to 18 differ in a few spellings; keep the branches here.
#if PG_VERSION_NUM >= 160000
#define OutboxNamespaceAclCheck(nsp, role, mode) object_aclcheck(NamespaceRelationId, nsp, role, mode)
#define OutboxProcAclCheck(proc, role, mode) object_aclcheck(ProcedureRelationId, proc, role, mode)
#define OutboxDatabaseOwnerCheck(db, role) object_ownercheck(DatabaseRelationId, db, role)
#else
#define OutboxNamespaceAclCheck(nsp, role, mode) pg_namespace_aclcheck(nsp, role, mode)
#define OutboxProcAclCheck(proc, role, mode) pg_proc_aclcheck(proc, role, mode)
#define OutboxDatabaseOwnerCheck(db, role) pg_database_ownercheck(db, role)
#endif
#if PG_VERSION_NUM >= 170000
#define OutboxLockHeldByMe(tag, mode) LockHeldByMe(tag, mode, false)
#define OutboxLocalTransactionId() (MyProc->vxid.lxid)
// This backend's index among MaxBackends (regular backends and background workers come first).
#define OutboxBackendIndex() uint32(MyProcNumber)
#else
#define OutboxLockHeldByMe(tag, mode) LockHeldByMe(tag, mode)
#define OutboxLocalTransactionId() (MyProc->lxid)
#define OutboxBackendIndex() uint32(MyBackendId - 1)
#endif
// The backend status array's local copy (standby_wait.cpp): read by index, dropped to see it anew.
#if PG_VERSION_NUM >= 160000
#define OutboxLocalBackendStatus(index) pgstat_get_local_beentry_by_index(index)
#else
#define OutboxLocalBackendStatus(index) pgstat_fetch_stat_local_beentry(index)
#endif
#if PG_VERSION_NUM >= 150000
#define OutboxClearBackendStatusCopy() pgstat_clear_backend_activity_snapshot()
#else
#define OutboxClearBackendStatusCopy() pgstat_clear_snapshot()
#endif
#if PG_VERSION_NUM >= 150000
#define OUTBOX_HAS_SHMEM_REQUEST_HOOK 1
#else
#define OUTBOX_HAS_SHMEM_REQUEST_HOOK 0
#endif
