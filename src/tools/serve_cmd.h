// `flatkv serve`: runs the daemon (src/service/server.h) until SIGTERM or
// SIGINT, then stops gracefully: in-flight requests finish, the store is
// closed and its SSD index persisted. Configuration: built-in defaults,
// then --config FILE (TOML, docs/service.md), then the flags below.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct ServeArgs {
  std::string config;             // TOML file
  std::string unix_path;          // --unix PATH ("none" disables)
  std::string tcp;                // --tcp HOST:PORT ("none" disables)
  std::string http;               // --http HOST:PORT ("none" disables)
  std::vector<std::string> ssd_dirs;
  std::string ssd_bytes, dram_bytes;  // sizes like 64GiB
  std::string shape;              // a preset name
  // One flag per [store] knob (service::StoreKnobs(), e.g.
  // --session-dram-share-bytes 1GiB): key -> value, "" when not given.
  std::map<std::string, std::string> store_knobs;
  bool print_config = false;      // print the effective settings and exit
};

CLI::App* AddServeCommand(CLI::App& app, ServeArgs& args);
int RunServe(const ServeArgs& args);

}  // namespace flatkv::tools
