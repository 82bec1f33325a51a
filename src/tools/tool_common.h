// Exit codes shared by every `flatkv` subcommand, and the guard around a
// subcommand's body.
#pragma once

#include <cstdio>
#include <exception>

namespace flatkv::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the command ran and something failed (I/O, store, verification)
inline constexpr int kExitUsage = 2;    // a bad argument; the message names it

// Returns body(); an exception escaping it is reported as
// "flatkv <command>: unexpected error: <what>" and gives kExitFailure.
template <typename Body>
int RunCatching(const char* command, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flatkv %s: unexpected error: %s\n", command, e.what());
    return kExitFailure;
  }
}

}  // namespace flatkv::tools
