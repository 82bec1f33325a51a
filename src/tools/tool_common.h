// Exit codes shared by every `flatkv` subcommand.
#pragma once

namespace flatkv::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the command ran and something failed (I/O, store, verification)
inline constexpr int kExitUsage = 2;    // a bad argument; the message names it

}  // namespace flatkv::tools
