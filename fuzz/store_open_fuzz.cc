// Fuzzes Store::Open on a directory whose MANIFEST is the fuzz input and
// whose first segment file holds arbitrary bytes: opening must fail with a
// Status or recover, and every restore of a recovered block must then end
// in a checksum-verified hit or a clean miss, never a crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flatkv/store.h"

namespace {

std::string Dir() {
  static std::string dir = [] {
    char templ[] = "/tmp/flatkv-fuzz-XXXXXX";
    std::string d = ::mkdtemp(templ);
    std::vector<char> junk(1 << 20, 0x5a);
    FILE* f = std::fopen((d + "/seg-000000.dat").c_str(), "wb");
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = Dir();
  FILE* f = std::fopen((dir + "/MANIFEST").c_str(), "wb");
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  flatkv::StoreOptions o;  // shape left empty: adopted from the manifest
  o.dram_capacity_bytes = 0;
  o.ssd_dirs = {dir};
  o.ssd_capacity_bytes = 64ull << 20;
  o.ssd_io = flatkv::IoEngineKind::kThreadPool;
  o.ssd_threads = 1;
  o.window_bytes = 0;
  auto store = flatkv::Store::Open(o);
  if (!store.ok()) return 0;
  // Any key the fuzzer managed to index: restore it (verification must catch junk).
  flatkv::BlockKey k{0, 0};
  auto r = store.value()->StartRestore({&k, 1});
  if (r.ok()) (void)r.value()->Finish();
  (void)store.value()->Close();
  return 0;
}
