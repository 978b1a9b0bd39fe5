// The launcher: one background worker, connected to no database (only the shared catalogs),
// that starts the relay workers of every database where the extension is installed and stops
// them when it is dropped, its database is dropped or its outbox.workers changes
// (docs/many-databases.md, DESIGN.md "Launcher").
#pragma once

#include "shared/pg_include.hpp"

namespace outbox {

// From _PG_init: registers the launcher (unless outbox.max_workers = 0).
void RegisterLauncher();

// outbox.database names one database (deprecated): only it is relayed, and its workers wait for
// CREATE EXTENSION instead of exiting.
bool SingleDatabaseMode();

// In a relay worker, after connecting: whether this database has the extension (own transaction).
bool ExtensionInstalled();

// In a relay worker: its database has no extension; the launcher starts it again only after
// CREATE EXTENSION outbox (or its next probe). Logs once and exits.
[[noreturn]] void ExitForMissingExtension(const char *database, int worker_index);

// Tells the launcher to look now, from a worker (its database has the extension).
void WakeLauncher();

// From the utility hook, before a statement runs: whether it is a CREATE EXTENSION outbox of
// an extension already installed (IF NOT EXISTS then creates nothing).
bool OutboxExtensionExistsFor(Node *stmt);

// From the utility hook, once the statement has succeeded: what the commit of its
// (sub)transaction should tell the launcher (CREATE EXTENSION outbox that created it: look at
// this database; ALTER DATABASE ... SET/RESET outbox.workers of a database that exists: restart
// its workers; CREATE/DROP/ALTER/RENAME DATABASE: rescan; DROP EXTENSION outbox: wake this
// database's workers so they see it gone).
void NoteStatementForLauncher(Node *stmt, bool outbox_existed);

// DROP DATABASE (drop_database.cpp): no worker is started for `db` for a minute, or until
// ResumeDatabase after a failed drop.
void PauseDatabase(Oid db);
void ResumeDatabase(Oid db);

} // namespace outbox
