// Fuzzes the manifest parser with arbitrary bytes: it must return a Status
// or a valid prefix, never crash, and a valid prefix must re-parse to the
// same contents.
#include <cstddef>
#include <cstdint>

#include "persist/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = flatkv::persist::ParseManifest({data, size});
  if (!parsed.ok()) return 0;
  const auto& c = parsed.value();
  if (c.good_bytes > size) __builtin_trap();
  auto again = flatkv::persist::ParseManifest({data, static_cast<size_t>(c.good_bytes)});
  if (!again.ok() || again->torn_tail || again->extents.size() != c.extents.size()) __builtin_trap();
  return 0;
}
