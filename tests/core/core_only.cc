// A program of the core store alone: only flatkv/store.h, linked against
// flatkv_core and nothing else (tests/core/core_link_test.sh checks its link
// line). It puts and restores a few blocks, and checks that options for the
// remote tier, whose component it does not link, fail at Open naming the
// medium and the component to link.
// Usage: flatkv_core_only DIR
#include <cstdio>
#include <string>
#include <vector>

#include "flatkv/store.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return Fail("usage: flatkv_core_only DIR");
  flatkv::StoreOptions o;
  o.shape = flatkv::KvShape::Mha(4, 2, 16, flatkv::DType::kF16);
  o.block_tokens = 16;
  o.dram_capacity_bytes = 16ull << 20;
  o.ssd_dirs = {std::string(argv[1]) + "/ssd"};
  o.ssd_capacity_bytes = 64ull << 20;
  auto store = flatkv::Store::Open(o);
  if (!store.ok()) return Fail("Open: " + store.status().ToString());

  flatkv::KeyHasher hasher;
  const std::vector<uint32_t> tokens(4 * o.block_tokens, 3);
  const auto keys = hasher.ChainKeys(hasher.NamespaceDigest({"model", "", ""}), tokens, o.block_tokens);
  const std::vector<std::byte> data(keys.size() * (*store)->BlockBytes(), std::byte{5});
  if (flatkv::Status st = (*store)->Put(1, keys, data); !st.ok()) return Fail("Put: " + st.ToString());
  {
    auto restore = (*store)->StartRestore(keys);
    if (!restore.ok()) return Fail("StartRestore: " + restore.status().ToString());
    for (uint32_t l = 0; l < o.shape.layers; ++l) {
      auto view = (*restore)->WaitLayer(l);
      if (!view.ok() || view->blocks != keys.size()) return Fail("WaitLayer " + std::to_string(l));
      for (std::byte b : view->data)
        if (b != std::byte{5}) return Fail("layer " + std::to_string(l) + ": wrong bytes");
      (*restore)->ReleaseLayer(l);
    }
    if ((*restore)->Finish() != keys.size()) return Fail("Finish: not every block");
  }
  if (flatkv::Status st = (*store)->Close(); !st.ok()) return Fail("Close: " + st.ToString());

  // The remote tier is not linked here: its options must fail at Open, naming it.
  flatkv::StoreOptions r = o;
  r.ssd_dirs = {std::string(argv[1]) + "/remote"};
  r.remote.seeds = {"127.0.0.1:1"};
  auto refused = flatkv::Store::Open(r);
  if (refused.ok()) return Fail("a store with remote seeds opened without the remote medium registered");
  const std::string m = refused.status().ToString();
  if (refused.status().code() != flatkv::Code::kFailedPrecondition || m.find("'remote'") == std::string::npos ||
      m.find("flatkv::remote") == std::string::npos)
    return Fail("the error does not name the medium and its component: " + m);
  std::printf("core alone: put and restored %zu blocks; remote options refused: %s\n", keys.size(), m.c_str());
  return 0;
}
