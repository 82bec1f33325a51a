// `flatkv bench metadata`: what the store's metadata costs at the scale of a
// node (issue 13 item 4), through the real Store on a real filesystem.
//
// Runs (each LAYERSxBLOCKS[:CODEC]; --runs replaces the default four):
//   1 x --blocks (10M) : raw      the 1-layer scale run, blocks stored with the raw codec
//   80 x --layers-80-blocks (250K) : raw
//   1 x min(--blocks, 1M) : none  the uncoded layout (the store's default), which costs one
//   80 x min(--layers-80-blocks, 10K) : none   4 KiB slot per block and layer on disk
// Every run's block is 16 tokens of one KV head of head_dim 2 in bf16: 128 bytes per layer,
// so the payload is small and the metadata is what grows. Uncoded, each layer slice still
// takes a 4 KiB-aligned slot on SSD (10M blocks = 41 GB), which is why the scale runs store
// through a codec: a coded extent packs its slices (docs/architecture.md, "Put with a
// codec"). A coded block keeps its encoded size in memory beside the uncoded block's
// metadata, and its slices' offsets and lengths in the sums table, so both layouts are measured.
//
// Per run:
//   fill       a forked child opens the store (DRAM tier off, so only metadata grows in
//              memory), puts --blocks blocks in sessions of --session-blocks, --put-blocks
//              per Put (one chain of fresh keys), and measures: heap growth (mallinfo2
//              uordblks + hblkhd) and RSS growth (/proc/self/statm) per block since Open;
//              ns per block of each Put; --lookups single-key Store::Match calls on random
//              stored keys after blocks/100 and after all blocks were put. It reports to
//              the parent through a pipe, once every Put has returned Ok (acknowledged).
//   recovery   the parent SIGKILLs the child, drops the page cache (drop_caches where it
//              can be written, else fdatasync + POSIX_FADV_DONTNEED on the store's files),
//              and times Store::Open of the directory; every block must be recovered.
//   space      a fresh store of a few extents' capacity takes sessions whose sizes are the
//              Mooncake conversation trace's (each conversation's new 512-token blocks, in
//              16-token blocks) until the extents they were given add up to three times the
//              capacity; space efficiency = payload bytes / SSD bytes held (Store::Stats()).
// Goals (issue 13) are printed beside the figures, not asserted.
#include "bench/bench_metadata.h"

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/random.h"
#include "flatkv/codec.h"
#include "flatkv/store.h"
#include "media/geometry.h"
#include "replay/trace.h"
#include "store/block_index.h"
#include "store/key_arena.h"
#include "bench/bench_util.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

using nlohmann::json;

constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kHeadDim = 2;
constexpr uint64_t kUncodedBlocksCap = 1'000'000;       // 1 layer: 4 GiB of 4 KiB slots
constexpr uint64_t kUncoded80BlocksCap = 10'000;        // 80 layers: 3.3 GB
constexpr uint64_t kDiskMargin = 2ull << 30;            // left free on the filesystem

// Issue 13's goals.
constexpr double kGoalIndexBytes = 64;
constexpr double kGoalProjectedBytes = 8e9;  // 100M blocks
constexpr double kGoalLookupGrowth = 2;
constexpr double kGoalSpace = 0.9;
constexpr double kGoalRecoveryPer10m = 5;
constexpr uint64_t kGoalBlocks = 10'000'000;

int Report(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv bench metadata: %s\n", msg.c_str());
  return code;
}

struct RunSpec {
  uint32_t layers = 0;
  uint64_t blocks = 0;
  std::string codec;  // a codec spec; empty: uncoded
  std::string name() const { return std::to_string(layers) + "x" + std::to_string(blocks) + ":" + (codec.empty() ? "none" : codec); }
};

Result<RunSpec> ParseRun(const std::string& s) {
  RunSpec r;
  const size_t x = s.find('x'), colon = s.find(':');
  if (x == std::string::npos || (colon != std::string::npos && colon < x))
    return Status::InvalidArgument("'" + s + "' is not LAYERSxBLOCKS[:CODEC]");
  char* end = nullptr;
  const std::string layers = s.substr(0, x), blocks = s.substr(x + 1, colon == std::string::npos ? colon : colon - x - 1);
  const unsigned long long l = std::strtoull(layers.c_str(), &end, 10);
  if (layers.empty() || *end != '\0' || l == 0 || l > 1024) return Status::InvalidArgument("'" + s + "': layers must be 1..1024");
  const unsigned long long b = std::strtoull(blocks.c_str(), &end, 10);
  if (blocks.empty() || *end != '\0' || b < 100) return Status::InvalidArgument("'" + s + "': blocks must be at least 100");
  r.layers = static_cast<uint32_t>(l);
  r.blocks = b;
  r.codec = colon == std::string::npos ? "raw" : s.substr(colon + 1);
  if (r.codec.empty()) return Status::InvalidArgument("'" + s + "': empty codec (a spec, or none)");
  if (r.codec == "none") r.codec.clear();
  return r;
}

// The heap in use (every arena, mmapped chunks included, the index's
// tables and the extents' key arrays, which the store maps itself in huge
// pages) and the resident set.
struct Memory {
  uint64_t heap = 0, rss = 0;
};

Memory ReadMemory() {
  const struct mallinfo2 m = ::mallinfo2();
  Memory out{m.uordblks + m.hblkhd + BlockIndex::MappedBytes() + KeyArena::UsedBytes(), 0};
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long size = 0, resident = 0;
    if (std::fscanf(f, "%llu %llu", &size, &resident) == 2) out.rss = resident * uint64_t(::sysconf(_SC_PAGESIZE));
    std::fclose(f);
  }
  return out;
}

// Block i's key: distinct per run (`seed`), and the same in every process.
BlockKey KeyOf(uint64_t seed, uint64_t i) {
  const uint64_t lo = SplitMix64(seed ^ SplitMix64(i));
  return BlockKey{lo, SplitMix64(lo ^ 0x6D657461ull)};
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Everything a run's stores are opened with and filled by.
struct RunPlan {
  RunSpec spec;
  KvShape shape;
  std::shared_ptr<const Codec> codec;
  ExtentGeometry geometry;       // of the SSD extents
  uint64_t blocks_per_extent = 0;  // what the capacity estimate assumes (coded: packed)
  uint64_t capacity = 0;         // fill: room for every block, never reclaimed
  uint64_t space_capacity = 0;   // space phase: a few extents
  uint32_t session_blocks = 0, put_blocks = 0, lookups = 0;
  uint64_t seed = 0;
  bool quick = false;
  bool sized_extents = true;  // StoreOptions::sized_extents
};

StoreOptions OptionsFor(const RunPlan& p, const std::string& dir, uint64_t capacity) {
  StoreOptions o;
  o.shape = p.shape;
  o.block_tokens = kBlockTokens;
  o.dram_capacity_bytes = 0;  // only metadata grows in memory
  o.ssd_dirs = {dir};
  o.ssd_capacity_bytes = capacity;
  o.codec = p.codec;
  o.sized_extents = p.sized_extents;
  return o;
}

// The space phase's capacity: enough of the largest extents for a few
// hundred sessions where they are small, bounded in bytes where they are
// large (80 layers: 160 MiB each).
uint64_t SpaceCapacity(const ExtentGeometry& g, bool quick) {
  const uint64_t budget = quick ? (512ull << 20) : (2ull << 30);
  return std::clamp<uint64_t>(budget / g.extent_bytes, 2, quick ? 16 : 64) * g.extent_bytes;
}

// Extents needed for `blocks` in sessions of `session` blocks.
uint64_t ExtentsFor(uint64_t blocks, uint64_t session, uint64_t per_extent) {
  const uint64_t per_session = (session + per_extent - 1) / per_extent;
  const uint64_t rest = blocks % session;
  return blocks / session * per_session + (rest + per_extent - 1) / per_extent;
}

Result<RunPlan> Plan(const RunSpec& spec, const BenchMetadataArgs& a, bool quick, uint64_t seed) {
  RunPlan p;
  p.spec = spec;
  p.quick = quick;
  p.shape = KvShape::Mha(spec.layers, 1, kHeadDim, DType::kBF16);
  p.session_blocks = a.session_blocks;
  p.put_blocks = a.put_blocks;
  p.lookups = a.lookups ? a.lookups : (quick ? 20'000 : 200'000);
  p.seed = seed;
  const StoreOptions defaults;
  FLATKV_ASSIGN_OR_RETURN(p.geometry, ExtentGeometry::Make(p.shape, kBlockTokens, defaults.ssd_extent_layer_bytes,
                                                           defaults.segment_bytes, 4096, "ssd extent"));
  p.blocks_per_extent = p.geometry.extent_blocks;
  if (!spec.codec.empty()) {
    FLATKV_ASSIGN_OR_RETURN(auto codec, MakeCodec(spec.codec));
    const SliceLayout layout{p.shape, kBlockTokens, 0, SliceLayout::kUnknownPosition};
    FLATKV_RETURN_IF_ERROR(codec->Supports(layout));
    // A coded extent packs slices, each Put's batch 4 KiB aligned, up to
    // kCodedBlocksPerSlot (16) blocks per uncoded slot.
    const uint64_t per_block = codec->MaxEncodedSize(layout) + (4096 + a.put_blocks - 1) / a.put_blocks;
    p.blocks_per_extent = std::min<uint64_t>(16ull * p.geometry.extent_blocks, p.geometry.layer_stride / per_block);
    p.codec = std::move(codec);
  }
  // Sized extents (the default) split a session over extents growing by an
  // eighth of it, each leaving a tail: a quarter more than whole extents.
  p.capacity = (ExtentsFor(spec.blocks, p.session_blocks, p.blocks_per_extent) * 5 / 4 + 2) * p.geometry.extent_bytes;
  p.space_capacity = SpaceCapacity(p.geometry, quick);
  return p;
}

// The space phase on a model's layer: the run's own block (head_dim 2, 128
// bytes a layer, chosen so 10M blocks fit the disk) is far below the 4 KiB
// page an O_DIRECT write aligns each layer run to, so its figure measures
// that padding, not the store's extents (it is reported beside). One layer
// of a multi-query model (Falcon-7B: one KV head of 64, bf16) is 4 KiB per
// 16-token block, exactly a page, and the trace's sessions (a mean of 728
// blocks) are about the size of the largest extent (512 blocks), so what an
// extent leaves unfilled shows in full. Extents are layer-major, so every
// layer region fills alike and one layer measures the fraction.
Result<RunPlan> SpacePlan(const RunPlan& run) {
  RunPlan p = run;
  p.shape = KvShape::Mha(1, 1, 64, DType::kBF16);
  const StoreOptions defaults;
  FLATKV_ASSIGN_OR_RETURN(p.geometry, ExtentGeometry::Make(p.shape, kBlockTokens, defaults.ssd_extent_layer_bytes,
                                                           defaults.segment_bytes, 4096, "ssd extent"));
  p.space_capacity = SpaceCapacity(p.geometry, p.quick);
  return p;
}

// ---- The fill, in a child process ----------------------------------------

// Times `n` single-key Match calls on random keys among the first `stored`.
json TimeLookups(const Store& store, const RunPlan& p, uint64_t stored, std::mt19937_64& rng, std::vector<double>& ns) {
  ns.clear();
  uint64_t misses = 0;
  for (uint32_t k = 0; k < p.lookups; ++k) {
    const BlockKey key = KeyOf(p.seed, rng() % stored);
    const int64_t t0 = NowNs();
    const uint32_t hit = store.Match(std::span(&key, 1));
    ns.push_back(double(NowNs() - t0));
    misses += hit != 1;
  }
  return {{"blocks", stored}, {"lookups", p.lookups}, {"misses", misses}, {"p50_ns", Percentile(ns, 0.5)},
          {"p99_ns", Percentile(ns, 0.99)}, {"max_ns", Percentile(ns, 1.0)}};
}

json MemoryGrowth(const Memory& base, uint64_t blocks) {
  const Memory now = ReadMemory();
  return {{"blocks", blocks}, {"heap_bytes", int64_t(now.heap - base.heap)}, {"rss_bytes", int64_t(now.rss - base.rss)},
          {"heap_bytes_per_block", double(int64_t(now.heap - base.heap)) / double(blocks)},
          {"rss_bytes_per_block", double(int64_t(now.rss - base.rss)) / double(blocks)}};
}

Result<json> Fill(const RunPlan& p, const std::string& dir, std::unique_ptr<Store>* out) {
  // Everything the loop uses is allocated before the baseline.
  const uint64_t block_bytes = p.shape.BytesPerToken() * kBlockTokens;
  std::vector<BlockKey> keys(p.put_blocks);
  std::vector<std::byte> payload(p.put_blocks * block_bytes);
  FillRandom(payload, p.seed);
  std::vector<double> put_ns, lookup_ns;
  put_ns.reserve(p.spec.blocks / p.put_blocks + p.spec.blocks / p.session_blocks + 2);
  lookup_ns.reserve(p.lookups);
  std::mt19937_64 rng(p.seed);
  json early;
  // Pages the parent had freed before the fork would otherwise be reused
  // without showing in RSS.
  ::malloc_trim(0);
  const Memory before_open = ReadMemory();
  const double t_open = NowSeconds();
  FLATKV_ASSIGN_OR_RETURN(*out, Store::Open(OptionsFor(p, dir, p.capacity)));
  const double open_s = NowSeconds() - t_open;
  Store& store = **out;
  const Memory base = ReadMemory();
  const uint64_t early_at = std::max<uint64_t>(1, p.spec.blocks / 100);
  uint64_t stored = 0, in_session = 0;
  SessionId session = 1;
  const double t_fill = NowSeconds();
  while (stored < p.spec.blocks) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>({p.put_blocks, p.spec.blocks - stored, p.session_blocks - in_session}));
    for (uint32_t i = 0; i < n; ++i) keys[i] = KeyOf(p.seed, stored + i);
    const int64_t t0 = NowNs();
    Status st = store.Put(session, std::span(keys.data(), n), std::span(payload.data(), n * block_bytes));
    put_ns.push_back(double(NowNs() - t0) / n);
    if (!st.ok()) return st.WithContext("put of blocks " + std::to_string(stored) + ".." + std::to_string(stored + n));
    stored += n;
    if ((in_session += n) == p.session_blocks) {
      ++session;
      in_session = 0;
    }
    if (early.is_null() && stored >= early_at) {
      early = MemoryGrowth(base, stored);
      early["lookup"] = TimeLookups(store, p, stored, rng, lookup_ns);
    }
  }
  const double fill_s = NowSeconds() - t_fill;
  json full = MemoryGrowth(base, stored);
  full["lookup"] = TimeLookups(store, p, stored, rng, lookup_ns);
  const StoreStats st = store.Stats();
  if (st.ssd.blocks != stored || st.ssd.evicted_extents != 0 || st.dedup_blocks != 0)
    return Status::Aborted("the store holds " + std::to_string(st.ssd.blocks) + " of " + std::to_string(stored) +
                           " blocks (" + std::to_string(st.ssd.evicted_extents) + " extents reclaimed, " +
                           std::to_string(st.dedup_blocks) + " deduplicated): the capacity estimate of " +
                           std::to_string(p.capacity) + " bytes is too small");
  return json{{"early", early},
              {"full", full},
              {"open_empty_s", open_s},
              {"open_heap_bytes", int64_t(base.heap - before_open.heap)},
              {"put_ns_p50", Percentile(put_ns, 0.5)},
              {"put_ns_p99", Percentile(put_ns, 0.99)},
              {"fill_s", fill_s},
              {"sessions", st.sessions},
              {"ssd_extents", st.ssd.extents},
              {"ssd_used_bytes", st.ssd.used_bytes},
              {"ssd_payload_bytes", st.ssd.logical_bytes},
              {"ssd_stored_bytes", st.ssd.stored_bytes},
              {"manifest_bytes", st.manifest_bytes},
              {"ssd_engine", st.ssd_engine},
              {"ssd_direct_io", st.ssd_direct_io}};
}

bool WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// Forks a child that fills the store in `dir` and reports one JSON line;
// once it has, the child is SIGKILLed (every block was acknowledged).
Result<json> FillInChild(const RunPlan& p, const std::string& dir) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::close(fds[0]);
    std::unique_ptr<Store> store;  // kept open until the kill
    json j;
    try {
      auto r = Fill(p, dir, &store);
      j = r.ok() ? *r : json{{"error", r.status().ToString()}};
    } catch (const std::exception& e) {
      j = {{"error", std::string("unexpected error: ") + e.what()}};
    }
    if (!WriteAll(fds[1], j.dump() + "\n") || j.contains("error")) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  std::string line;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR && !Interrupted()) continue;
    if (n <= 0) break;
    line.append(buf, size_t(n));
    if (line.back() == '\n') break;
  }
  ::close(fds[0]);
  ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (Interrupted()) return Status::Aborted("interrupted");
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::Aborted("the filling child ended (wait status " + std::to_string(status) + ") without a report");
  if (j.contains("error")) return Status::Aborted(j["error"].get<std::string>());
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
    return Status::Aborted("the filling child was not killed by SIGKILL (wait status " + std::to_string(status) + ")");
  return j;
}

// ---- Recovery --------------------------------------------------------------

// CPU seconds (user + system) of this process's threads so far: what the
// open cost in CPU whatever else shares the cores (the wall time grows with
// the machine's load; this only with the work).
double CpuSeconds() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// `open_heap` is what an empty store's Open allocates (its window, ...).
Result<json> Recover(const RunPlan& p, const std::string& dir, int64_t open_heap) {
  // Drop the page cache where this process may; else evict the store's files.
  std::string method = PageCacheEvictor(true).method();
  if (Status st = PageCacheEvictor(true).Evict({dir}); !st.ok()) {
    method = PageCacheEvictor(false).method() + " (drop_caches: " + st.message() + ")";
    FLATKV_RETURN_IF_ERROR(PageCacheEvictor(false).Evict({dir}));
  }
  const Memory before = ReadMemory();
  const double cpu0 = CpuSeconds();
  const double t0 = NowSeconds();
  FLATKV_ASSIGN_OR_RETURN(auto store, Store::Open(OptionsFor(p, dir, p.capacity)));
  const double recovery_s = NowSeconds() - t0;
  const double recovery_cpu_s = CpuSeconds() - cpu0;
  const Memory after = ReadMemory();
  const StoreStats st = store->Stats();
  std::mt19937_64 rng(p.seed + 1);
  uint64_t misses = 0;
  for (int k = 0; k < 1000; ++k) {
    const BlockKey key = KeyOf(p.seed, rng() % p.spec.blocks);
    misses += store->Match(std::span(&key, 1)) != 1;
  }
  if (st.recovered_blocks != p.spec.blocks || misses != 0)
    return Status::Aborted("recovery found " + std::to_string(st.recovered_blocks) + " of " + std::to_string(p.spec.blocks) +
                           " acknowledged blocks (" + std::to_string(misses) + " of 1000 sampled keys missing)");
  const double close_t0 = NowSeconds();
  FLATKV_RETURN_IF_ERROR(store->Close().WithContext("close after recovery"));
  return json{{"recovery_s", recovery_s},
              {"recovery_cpu_s", recovery_cpu_s},
              {"recovered_blocks", st.recovered_blocks},
              {"page_cache", method},
              {"heap_bytes_per_block", double(int64_t(after.heap - before.heap) - open_heap) / double(p.spec.blocks)},
              {"close_s", NowSeconds() - close_t0}};
}

// ---- Space efficiency --------------------------------------------------------

struct SessionSizes {
  std::vector<uint64_t> blocks;  // one per session, in 16-token blocks
  std::string source;            // what they were drawn from
  bool from_trace = false;
};

// Each Mooncake conversation's size: the trace blocks it was the first to
// send (its share of the KV a store would hold), in 16-token blocks.
SessionSizes LoadSessionSizes(const std::string& path) {
  SessionSizes s;
  auto trace = replay::ReadTrace(path, replay::TraceFormat::kMooncake);
  if (trace.ok()) {
    std::unordered_set<uint64_t> seen;
    std::map<uint64_t, uint64_t> fresh;  // conversation -> new trace blocks
    for (const replay::Request& r : trace->requests)
      for (uint64_t b : r.blocks)
        if (seen.insert(b).second) fresh[r.conversation]++;
    for (const auto& [conversation, n] : fresh) s.blocks.push_back(n * trace->block_tokens / kBlockTokens);
  }
  if (!s.blocks.empty()) {
    s.source = path + ": " + std::to_string(s.blocks.size()) + " conversations, each its new " +
               std::to_string(trace->block_tokens) + "-token blocks in " + std::to_string(kBlockTokens) + "-token blocks";
    s.from_trace = true;
    return s;
  }
  // Log-uniform from 16 to 2048 blocks (256 to 32K tokens).
  std::mt19937_64 rng(7);
  for (int i = 0; i < 4096; ++i)
    s.blocks.push_back(uint64_t(std::llround(16 * std::pow(2.0, 7.0 * double(rng() % 1000000) / 1e6))));
  s.source = "trace not usable (" + (trace.ok() ? std::string("no blocks") : trace.status().ToString()) +
             "); fallback: log-uniform 16..2048 blocks";
  return s;
}

Result<json> MeasureSpace(const RunPlan& p, const SessionSizes& sizes, const std::string& dir) {
  FLATKV_ASSIGN_OR_RETURN(auto store, Store::Open(OptionsFor(p, dir, p.space_capacity)));
  const uint64_t block_bytes = store->BlockBytes();
  std::vector<std::byte> payload(uint64_t{p.put_blocks} * block_bytes);
  FillRandom(payload, p.seed + 2);
  std::vector<BlockKey> keys(p.put_blocks);
  std::mt19937_64 rng(p.seed + 3);
  uint64_t next_key = 0, sessions = 0, payload_written = 0, allocated = 0;
  std::vector<double> efficiency;  // after each session once the capacity was written once
  StoreStats st;
  while (allocated < 3 * p.space_capacity) {
    if (Interrupted()) return Status::Aborted("interrupted");
    const uint64_t size = sizes.blocks[rng() % sizes.blocks.size()];
    const SessionId session = ++sessions;
    for (uint64_t done = 0; done < size;) {
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(p.put_blocks, size - done));
      for (uint32_t i = 0; i < n; ++i) keys[i] = KeyOf(p.seed + 4, next_key++);
      FLATKV_RETURN_IF_ERROR(store->Put(session, std::span(keys.data(), n), std::span(payload.data(), n * block_bytes))
                                 .WithContext("space: session " + std::to_string(session)));
      done += n;
    }
    payload_written += size * block_bytes;
    st = store->Stats();
    allocated = st.ssd.allocated_bytes;
    if (allocated >= p.space_capacity && st.ssd.used_bytes > 0)
      efficiency.push_back(double(st.ssd.logical_bytes) / double(st.ssd.used_bytes));
  }
  double mean = 0;
  for (double e : efficiency) mean += e / double(efficiency.size());
  return json{{"space_efficiency", st.ssd.used_bytes ? double(st.ssd.logical_bytes) / double(st.ssd.used_bytes) : 0.0},
              {"space_efficiency_mean", mean},
              {"capacity_bytes", p.space_capacity},
              {"extent_bytes", p.geometry.extent_bytes},
              {"sessions_written", sessions},
              {"sessions_held", st.sessions},
              {"extents_allocated_bytes", allocated},
              {"payload_written_bytes", payload_written},
              {"payload_held_bytes", st.ssd.logical_bytes},
              {"ssd_held_bytes", st.ssd.used_bytes}};
}

// ---- One run, and the report -----------------------------------------------

Result<json> RunOne(const RunPlan& p, const SessionSizes& sizes, const std::string& scratch) {
  const std::string dir = scratch + "/" + std::to_string(p.spec.layers) + "x" + std::to_string(p.spec.blocks);
  std::fprintf(stderr, "flatkv bench metadata: %s: filling (%s, up to %.0f MB on disk)\n", p.spec.name().c_str(),
               p.shape.ToString().c_str(), double(p.capacity) / 1e6);
  FLATKV_ASSIGN_OR_RETURN(json fill, FillInChild(p, dir + "/fill"));
  std::fprintf(stderr, "  filled in %.1f s; recovering\n", fill["fill_s"].get<double>());
  FLATKV_ASSIGN_OR_RETURN(json rec, Recover(p, dir + "/fill", fill["open_heap_bytes"].get<int64_t>()));
  FLATKV_RETURN_IF_ERROR(RemoveAll(dir + "/fill"));
  std::fprintf(stderr, "  recovered in %.2f s (%.2f s of CPU); space efficiency\n", rec["recovery_s"].get<double>(),
               rec["recovery_cpu_s"].get<double>());
  FLATKV_ASSIGN_OR_RETURN(json space_run, MeasureSpace(p, sizes, dir + "/space-run"));
  FLATKV_ASSIGN_OR_RETURN(RunPlan sp, SpacePlan(p));
  FLATKV_ASSIGN_OR_RETURN(json space, MeasureSpace(sp, sizes, dir + "/space"));
  space["shape"] = sp.shape.ToString() + " (one layer of a multi-query model, Falcon-7B's KV head)";
  sp.sized_extents = false;  // the same sessions into extents of one size, as before manifest version 5
  FLATKV_ASSIGN_OR_RETURN(json space_fixed, MeasureSpace(sp, sizes, dir + "/space-fixed"));
  space_run["shape"] = p.shape.ToString();
  FLATKV_RETURN_IF_ERROR(RemoveAll(dir));

  const json& full = fill["full"];
  const json& early = fill["early"];
  const double per_block = full["heap_bytes_per_block"].get<double>();
  const double p99 = full["lookup"]["p99_ns"].get<double>(), p99_early = early["lookup"]["p99_ns"].get<double>();
  const double growth = p99_early > 0 ? p99 / p99_early : 0;
  const double recovery_s = rec["recovery_s"].get<double>();
  const double per_10m = recovery_s * 1e7 / double(p.spec.blocks);
  const double projected = per_block * 1e8;
  const double space_eff = space["space_efficiency"].get<double>();
  json r;
  r["name"] = p.spec.name();
  r["layers"] = p.spec.layers;
  r["blocks"] = p.spec.blocks;
  r["codec"] = p.spec.codec.empty() ? "none" : p.spec.codec;
  r["shape"] = p.shape.ToString();
  r["block_tokens"] = kBlockTokens;
  r["block_bytes"] = p.shape.BytesPerToken() * kBlockTokens;
  r["index_bytes_per_block"] = per_block;
  r["index_rss_bytes_per_block"] = full["rss_bytes_per_block"];
  r["index_bytes_per_block_at_1pct"] = early["heap_bytes_per_block"];
  r["put_ns_p50"] = fill["put_ns_p50"];
  r["put_ns_p99"] = fill["put_ns_p99"];
  r["lookup_ns_p50"] = full["lookup"]["p50_ns"];
  r["lookup_ns_p99"] = p99;
  r["lookup_ns_max"] = full["lookup"]["max_ns"];
  r["lookup_at_1pct"] = early["lookup"];
  r["lookup_p99_growth"] = growth;
  r["recovery_s"] = recovery_s;
  r["recovery_s_per_10m_blocks"] = per_10m;
  r["recovery_cpu_s_per_10m_blocks"] = rec["recovery_cpu_s"].get<double>() * 1e7 / double(p.spec.blocks);
  r["recovery"] = rec;
  r["recovery"]["open_empty_s"] = fill["open_empty_s"];
  r["recovery"]["open_heap_bytes"] = fill["open_heap_bytes"];
  r["space_efficiency"] = space_eff;
  r["space_efficiency_on_run_shape"] = space_run["space_efficiency"];
  r["space"] = space;
  r["space_on_run_shape"] = space_run;
  r["space_efficiency_fixed_extents"] = space_fixed["space_efficiency"];
  r["fill"] = {{"seconds", fill["fill_s"]},         {"sessions", fill["sessions"]},
               {"ssd_extents", fill["ssd_extents"]}, {"ssd_used_bytes", fill["ssd_used_bytes"]},
               {"ssd_payload_bytes", fill["ssd_payload_bytes"]}, {"ssd_stored_bytes", fill["ssd_stored_bytes"]},
               {"manifest_bytes", fill["manifest_bytes"]}, {"ssd_engine", fill["ssd_engine"]},
               {"ssd_direct_io", fill["ssd_direct_io"]}, {"memory_full", full}, {"memory_at_1pct", early}};
  r["projection_100m"] = {{"index_bytes", projected}, {"goal_bytes", kGoalProjectedBytes}};
  r["goals"] = {{"index_bytes_per_block_max", kGoalIndexBytes},     {"index_met", per_block <= kGoalIndexBytes},
                {"projected_100m_bytes_max", kGoalProjectedBytes}, {"projection_met", projected <= kGoalProjectedBytes},
                {"lookup_p99_growth_max", kGoalLookupGrowth},      {"lookup_growth_met", growth <= kGoalLookupGrowth},
                {"space_efficiency_min", kGoalSpace},               {"space_met", space_eff >= kGoalSpace},
                {"recovery_s_per_10m_blocks_max", kGoalRecoveryPer10m},
                {"recovery_met", per_10m <= kGoalRecoveryPer10m}};
  return r;
}

const char* Met(bool b) { return b ? "met" : "NOT met"; }

void PrintTable(const json& j) {
  const json& c = j["config"];
  std::printf("flatkv bench metadata: %s blocks of 16 tokens, %u per Put, sessions of %u; DRAM tier off; dir %s (%s); "
              "load average %.1f -> %.1f on %ld cpus\n",
              c["block_shape"].get<std::string>().c_str(), c["put_blocks"].get<uint32_t>(), c["session_blocks"].get<uint32_t>(),
              c["dir"].get<std::string>().c_str(), c["filesystem"].get<std::string>().c_str(),
              c["loadavg_1m_at_start"].get<double>(), c["loadavg_1m_at_end"].get<double>(), c["cpus_online"].get<long>());
  std::printf("%-20s %8s %8s %8s %8s %8s %8s %6s %9s %9s %8s %8s\n", "run", "B/block", "rss B/b", "put ns", "look p50",
              "look p99", "look max", "growth", "recover s", "per 10M s", "space", "100M GB");
  for (const json& r : j["runs"]) {
    std::printf("%-20s %8.1f %8.1f %8.0f %8.0f %8.0f %8.0f %6.2f %9.2f %9.2f %8.4f %8.2f\n", r["name"].get<std::string>().c_str(),
                r["index_bytes_per_block"].get<double>(), r["index_rss_bytes_per_block"].get<double>(),
                r["put_ns_p50"].get<double>(), r["lookup_ns_p50"].get<double>(), r["lookup_ns_p99"].get<double>(),
                r["lookup_ns_max"].get<double>(), r["lookup_p99_growth"].get<double>(), r["recovery_s"].get<double>(),
                r["recovery_s_per_10m_blocks"].get<double>(), r["space_efficiency"].get<double>(),
                r["projection_100m"]["index_bytes"].get<double>() / 1e9);
  }
  std::printf("goals: index <= %.0f B/block, 100M blocks within %.0f GB, lookup p99 growth (full / 1%%) <= %.0fx, "
              "space efficiency >= %.1f, recovery <= %.0f s per 10M blocks\n",
              kGoalIndexBytes, kGoalProjectedBytes / 1e9, kGoalLookupGrowth, kGoalSpace, kGoalRecoveryPer10m);
  for (const json& r : j["runs"]) {
    const json& g = r["goals"];
    std::printf("  %-20s index %s, 100M projection %.1f GB %s, growth %s, space %s, recovery %s\n",
                r["name"].get<std::string>().c_str(), Met(g["index_met"].get<bool>()), r["projection_100m"]["index_bytes"].get<double>() / 1e9,
                Met(g["projection_met"].get<bool>()), Met(g["lookup_growth_met"].get<bool>()), Met(g["space_met"].get<bool>()),
                Met(g["recovery_met"].get<bool>()));
  }
  std::printf("  10M blocks measured: %s (largest 1-layer run: %llu blocks)\n", Met(j["goals"]["blocks_met"].get<bool>()),
              static_cast<unsigned long long>(j["goals"]["largest_1_layer_blocks"].get<uint64_t>()));
  std::printf("space sessions: %s\n", j["config"]["session_sizes"].get<std::string>().c_str());
  if (!j["runs"].empty())
    std::printf("space measured on %s; the same sessions in fixed extents, and on each run's own block "
                "(128-byte layer slices in 4 KiB pages): %s\n",
                j["runs"][0]["space"]["shape"].get<std::string>().c_str(), [&] {
                  std::string s;
                  for (const json& r : j["runs"])
                    s += (s.empty() ? "" : "; ") + r["name"].get<std::string>() + " fixed " +
                         std::to_string(r["space_efficiency_fixed_extents"].get<double>()).substr(0, 5) + ", own block " +
                         std::to_string(r["space_efficiency_on_run_shape"].get<double>()).substr(0, 5);
                  return s;
                }().c_str());
}

std::string DefaultTrace() {
  if (const char* env = std::getenv("FLATKV_SHARED_DATA"); env != nullptr && *env != '\0')
    return std::string(env) + "/traces/mooncake_conversation_trace.jsonl";
  return std::string(FLATKV_SOURCE_DIR) + "/../shared/data/traces/mooncake_conversation_trace.jsonl";
}

int RunChecked(const BenchMetadataArgs& a) {
  if (a.put_blocks == 0 || a.session_blocks == 0 || a.session_blocks % a.put_blocks != 0)
    return Report(kExitUsage, "--session-blocks " + std::to_string(a.session_blocks) + " must be a positive multiple of --put-blocks " +
                                  std::to_string(a.put_blocks));
  std::vector<RunSpec> specs;
  for (const std::string& s : a.runs) {
    auto r = ParseRun(s);
    if (!r.ok()) return Report(kExitUsage, "--runs: " + r.status().message());
    specs.push_back(*r);
  }
  if (specs.empty()) {
    const uint64_t one = a.blocks ? a.blocks : (a.quick ? 20'000 : 10'000'000);
    const uint64_t eighty = a.layers80_blocks ? a.layers80_blocks : (a.quick ? 2'000 : 250'000);
    specs = {{1, one, "raw"}, {80, eighty, "raw"}};
    if (!a.quick) specs.insert(specs.end(), {{1, std::min(one, kUncodedBlocksCap), ""}, {80, std::min(eighty, kUncoded80BlocksCap), ""}});
  }
  std::vector<RunPlan> plans;
  uint64_t disk_need = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto p = Plan(specs[i], a, a.quick, 0x6D657461'00000000ull + i);
    if (!p.ok()) return Report(kExitUsage, "run " + specs[i].name() + ": " + p.status().ToString());
    disk_need = std::max(disk_need, std::max(p->capacity, p->space_capacity));
    plans.push_back(std::move(p).value());
  }
  const std::string parent = a.dir.empty() ? "/var/tmp" : a.dir;
  auto fs = GetFsInfo(parent);
  if (!fs.ok()) return Report(kExitUsage, (a.dir.empty() ? "default directory: " : "--dir: ") + fs.status().ToString());
  if (fs->tmpfs) return Report(kExitUsage, "--dir " + parent + " is " + fs->type + " (memory): the SSD tier needs a disk-backed filesystem");
  if (fs->free_bytes < disk_need + kDiskMargin)
    return Report(kExitUsage, "--dir " + parent + ": " + std::to_string(fs->free_bytes >> 20) + " MiB free; the largest run needs up to " +
                                  std::to_string(disk_need >> 20) + " MiB plus " + std::to_string(kDiskMargin >> 20) + " MiB to spare");
  const std::string trace = a.trace.empty() ? DefaultTrace() : a.trace;
  const SessionSizes sizes = LoadSessionSizes(trace);
  if (!sizes.from_trace) std::fprintf(stderr, "flatkv bench metadata: %s\n", sizes.source.c_str());
  InstallInterruptHandlers();
  auto scratch = ScratchDir::Create(parent);
  if (!scratch.ok()) return Report(kExitFailure, scratch.status().ToString());

  std::vector<uint64_t> sorted = sizes.blocks;
  std::sort(sorted.begin(), sorted.end());
  json j;
  j["config"] = {{"block_shape", "mha kv_heads=1 head_dim=" + std::to_string(kHeadDim) + " dtype=bf16"},
                 {"block_tokens", kBlockTokens}, {"put_blocks", a.put_blocks}, {"session_blocks", a.session_blocks},
                 {"dram_capacity_bytes", 0}, {"dir", scratch->path()}, {"filesystem", fs->type}, {"quick", a.quick},
                 {"cpus_online", ::sysconf(_SC_NPROCESSORS_ONLN)}, {"loadavg_1m_at_start", LoadAverage()},
                 {"index_bytes", "heap growth since Open (mallinfo2 uordblks + hblkhd) / blocks"},
                 {"lookup", "one Store::Match of a single random stored key, steady_clock around it"},
                 {"put_ns", "each Put's time / its blocks"},
                 {"session_sizes", sizes.source}, {"session_sizes_from_trace", sizes.from_trace},
                 {"session_blocks_p50", sorted[sorted.size() / 2]}, {"session_blocks_max", sorted.back()}};
  uint64_t largest_one = 0;
  for (const RunPlan& p : plans) {
    auto r = RunOne(p, sizes, scratch->path());
    if (!r.ok()) return Report(kExitFailure, "run " + p.spec.name() + ": " + r.status().ToString());
    if (p.spec.layers == 1) largest_one = std::max(largest_one, p.spec.blocks);
    j["runs"].push_back(std::move(r).value());
  }
  j["config"]["loadavg_1m_at_end"] = LoadAverage();
  j["goals"] = {{"blocks_min", kGoalBlocks}, {"largest_1_layer_blocks", largest_one}, {"blocks_met", largest_one >= kGoalBlocks}};
  if (a.json) std::printf("%s\n", j.dump(2).c_str());
  else PrintTable(j);
  return kExitOk;
}

}  // namespace

CLI::App* AddBenchMetadataCommand(CLI::App& bench, BenchMetadataArgs& a) {
  CLI::App* cmd = bench.add_subcommand("metadata", "The store's metadata at scale: memory per block, lookup latency growth, "
                                                   "recovery after kill -9, SSD space efficiency");
  cmd->add_flag("--quick", a.quick, "Small runs for tests: 20K 1-layer and 2K 80-layer blocks, coded only (seconds)");
  cmd->add_flag("--json", a.json, "Print one JSON object instead of the table");
  AddScratchDirOption(*cmd, a.dir);
  CLI::Option* blocks =
      cmd->add_option("--blocks", a.blocks, "Blocks of the 1-layer runs (default 10000000; the uncoded run at most 1000000)")
          ->check(CLI::Range(uint64_t{100}, uint64_t{1} << 32));
  CLI::Option* eighty =
      cmd->add_option("--layers-80-blocks", a.layers80_blocks, "Blocks of the 80-layer runs (default 250000; the uncoded run at most 10000)")
          ->check(CLI::Range(uint64_t{100}, uint64_t{1} << 32));
  cmd->add_option("--runs", a.runs, "Instead of the default runs: LAYERSxBLOCKS[:CODEC] ... (CODEC a codec spec or none; default raw)")
      ->excludes(blocks)
      ->excludes(eighty);
  cmd->add_option("--trace", a.trace, "Mooncake conversation trace for the space phase's session sizes (default: the shared data's)");
  cmd->add_option("--session-blocks", a.session_blocks, "Blocks per session while filling (a multiple of --put-blocks)")
      ->check(CLI::Range(1u, 1u << 24))
      ->capture_default_str();
  cmd->add_option("--put-blocks", a.put_blocks, "Blocks per Put")->check(CLI::Range(1u, 4096u))->capture_default_str();
  cmd->add_option("--lookups", a.lookups, "Timed lookups per measuring point (default 200000, quick 20000)")
      ->check(CLI::Range(100u, 100'000'000u));
  return cmd;
}

int RunBenchMetadata(const BenchMetadataArgs& args) { return RunCatching("bench metadata", [&] { return RunChecked(args); }); }

}  // namespace flatkv::tools
