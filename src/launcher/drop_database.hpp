// Lets DROP DATABASE of a relayed database through by stopping its relay workers first; tells
// the launcher what committed statements change for it.
#pragma once

namespace outbox {

void InstallDropDatabaseHook();

} // namespace outbox
