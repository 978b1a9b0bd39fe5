// Lets DROP DATABASE of outbox.database through by stopping the relay workers first.
#pragma once

namespace outbox {

void InstallDropDatabaseHook();

} // namespace outbox
