// StoreOptions in words: the names of its enumerated values, as the daemon's
// config file, the Python module and JSON spell them, and the options as one
// JSON object (what `flatkv_store_options_json` and the daemon's /stats
// report, so a caller can read back the options a store runs with).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "flatkv/options.h"
#include "flatkv/status.h"

namespace flatkv {

// "all", "on-reuse".
std::string_view SsdAdmissionName(SsdAdmission a);
// The inverse; an unknown name fails with InvalidArgument listing the known ones.
Result<SsdAdmission> ParseSsdAdmission(std::string_view name);

// "auto", "uring", "threadpool".
std::string_view IoEngineKindName(IoEngineKind k);
Result<IoEngineKind> ParseIoEngineKind(std::string_view name);

// Every plain-valued field of `o` under its own name (durations as
// `<name>_ms`, enums by name, the shape as its ToString, the placement
// policy and codec by name, or null for the defaults).
std::string StoreOptionsToJson(const StoreOptions& o);

}  // namespace flatkv
