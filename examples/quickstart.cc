// The store embedded in an engine: open it, put a prompt's KV blocks after
// its prefill, and restore them layer by layer before the next one.
// Build it against an installed flatkv (README.md, "Using the store"):
//   find_package(flatkv REQUIRED)
//   target_link_libraries(quickstart PRIVATE flatkv::core)
// Run: quickstart DIR (the store's SSD directory, e.g. /mnt/nvme0/flatkv).
#include <cstdint>
#include <cstdio>
#include <vector>

#include "flatkv/store.h"

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: %s SSD_DIR\n", argv[0]), 2;
  flatkv::StoreOptions o;
  o.shape = flatkv::FindShapePreset("llama-3.1-8b").value();
  o.dram_capacity_bytes = 1ull << 30;  // a serving node: tens of GiB
  o.ssd_dirs = {argv[1]};
  o.ssd_capacity_bytes = 2ull << 30;   // a serving node: most of an NVMe drive
  auto opened = flatkv::Store::Open(o);
  if (!opened.ok()) return std::fprintf(stderr, "%s\n", opened.status().ToString().c_str()), 1;
  auto store = std::move(opened).value();

  // Keys name what the KV depends on: the model, the adapter, the tenant, the tokens.
  flatkv::KeyHasher hasher;
  auto ns = hasher.NamespaceDigest({"model-fingerprint", "adapter-id", "tenant-salt"});
  std::vector<uint32_t> prompt_tokens(3 * o.block_tokens + 5, 7);  // the engine's token ids
  auto keys = hasher.ChainKeys(ns, prompt_tokens, o.block_tokens);  // one per full block

  // After a prefill: its full blocks' KV, BlockBytes() each, every layer of a block in turn.
  std::vector<std::byte> kv(keys.size() * store->BlockBytes(), std::byte{42});
  if (flatkv::Status st = store->Put(/*session=*/1, keys, kv); !st.ok())
    return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;

  // Before a prefill: the stored prefix of its keys, layer by layer.
  auto restore = store->StartRestore(keys).value();
  uint64_t restored_bytes = 0;
  for (uint32_t l = 0; l < o.shape.layers; ++l) {
    auto view = restore->WaitLayer(l).value();   // view.blocks blocks of layer l
    /* copy view.data into the engine's paged KV cache, compute layer l */
    restored_bytes += view.data.size();
    restore->ReleaseLayer(l);
  }
  uint32_t reused = restore->Finish();           // blocks valid in every layer
  /* prefill tokens from reused * block_tokens on, then Put the new full blocks */
  restore.reset();
  std::printf("reused %u of %zu blocks (%llu bytes)\n", reused, keys.size(),
              static_cast<unsigned long long>(restored_bytes));
  return reused == keys.size() && store->Close().ok() ? 0 : 1;
}
