// The "flat" policy: flatkv's own Store (src/store), replayed. Each trace
// block is one store block; each conversation is a store session; the
// store's clock is the simulated time. In kModel the store runs on a
// down-scaled shape so the whole replay fits in memory and disk while
// placement, eviction and read amplification are the real store's.
//
// "flat-hints" is the same store driven as an agent-aware serving engine
// would drive it through the store's session operations:
//   - after each turn's put, Retain(its chain, ttl), ttl the gap this
//     conversation is predicted to leave before its next request: the
//     median of its last 4 gaps (from one turn's put to the next turn's
//     arrival), plus a quarter. Only the conversation's past gaps count,
//     never the trace's future; a conversation with no gap yet is not
//     retained;
//   - on an arrival that queues behind others on its instance,
//     Prefetch(its prompt's chain): SSD-only blocks come into DRAM copies
//     while it waits, as long as the copies prefetched for requests not yet
//     restored take less than a quarter of DRAM. (A request admitted at
//     once streams its restore by layer under its prefill, and a prefetch
//     would put a whole read first; unbounded prefetches for a long queue
//     evict each other before they are restored.)
//     The replay waits for the store's background read to finish
//     (StoreStats::prefetches_done) and reports its bytes, which the
//     simulator charges to the node's SSD and host memory.
// docs/benchmarks.md ("Agent-aware hints in the replay") has the figures
// and the variants tried.
//
// Where a restore lands (FlatWindow): the store as built copies its DRAM
// hits with its DramQueue threads (StoreOptions::dram_threads) into a host
// window, from which they cross to the GPU (kHost: dram_copy_threads() is
// that thread count, so the simulator charges the copy at threads x the
// node's memcpy_core_gbps, then the link). "flat-gpu-window" (kGpu) is the
// GPU window (src/gpu/, docs/gpu.md): DRAM hits DMA'd from the pinned arena
// at the link's rate. It is built, but no GPU has measured it yet, so the
// link's rate is the profile's, not a measured figure.
#pragma once

#include <memory>

#include "replay/policy.h"

namespace flatkv::replay {

enum class FlatHints { kNone, kAgent };
enum class FlatWindow { kHost, kGpu };

Result<std::unique_ptr<CachePolicy>> MakeFlatPolicy(const PolicyConfig& config, FlatHints hints = FlatHints::kNone,
                                                    FlatWindow window = FlatWindow::kHost);

}  // namespace flatkv::replay
