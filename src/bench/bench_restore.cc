// `flatkv bench restore`: how fast a session's KV comes back, from 1 MiB to
// 1 GiB, against the ceilings and the peers, in one run on one filesystem.
//
// Workloads (each delivers the same session bytes into one pre-faulted
// destination buffer; timed regions exclude setup, page-cache eviction and
// verification, which runs on the first and the last repetition):
//   memcpy           memcpy of the session from a pre-faulted DRAM buffer: the DRAM ceiling.
//   raw_direct_read  O_DIRECT sequential read of one file holding the session, 4 MiB requests,
//                    8 in flight through io_uring: the fio-equivalent SSD ceiling.
//   dram_restore     flatkv Store, DRAM tier only (FixedPlacement(kDram)): StartRestore into
//                    the destination (a RestoreTarget, as an engine restores into its paged
//                    cache), then per layer WaitLayer and ReleaseLayer; then Finish.
//   ssd_restore      the same with the SSD tier only (FixedPlacement(kSsd), O_DIRECT segments).
//   files_per_block  one file per block (LMCache local-disk backend, SGLang HiCache file
//                    backend): write()+fsync, read back by buffered pread of each whole file
//                    on LMCache's 4 disk worker threads.
//   rocksdb          RocksDB, default options, block cache off: one value per block under its
//                    16-byte key, Get into a PinnableSlice, memcpy into the destination.
//   rocksdb_blobdb   RocksDB as a large-value store: integrated BlobDB, direct reads, no block
//                    cache, one MultiGet of every block, memcpy into the destination.
//   ssd_codec_restore  with --codec SPEC only: ssd_restore with the session stored encoded by
//                    SPEC (decoded into the destination on the store's decode workers). The
//                    payload of every run is then synthetic KV shaped like a real model's
//                    (codec/synthetic_kv.h), not random bytes, so compression means something;
//                    a lossy codec's run is verified against its own decoded bytes.
//
// A session of S MiB is max(1, S / block_bytes) blocks. Blocks are 64 tokens
// unless the session is smaller than one such block; then block_tokens is
// halved (down to the store's minimum, 16) until a block fits, and where even
// a 16-token block is bigger than S the session is one 16-token block (the
// table says so). The runs execute interleaved within each repetition, in an
// order rotated per repetition; the report gives medians.
//
// The real peers (a flatkv serve child, Mooncake Store, LMCache's backends)
// are runs too, listed in bench_peers.h; one that cannot start is left out
// and its error reported (peer_errors).
#include "bench/bench_restore.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>

#include "codec/synthetic_kv.h"
#include "common/thread_pool.h"
#include "flatkv/codec.h"
#include "flatkv/keys.h"
#include "flatkv/shape.h"
#include "bench/bench_peers.h"
#include "bench/bench_report.h"
#include "bench/bench_runs.h"
#include "bench/bench_util.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

constexpr uint32_t kDefaultBlockTokens = 64;
constexpr uint32_t kMinBlockTokens = 16;
constexpr uint64_t kSmallSessionBytes = 64ull << 20;  // sessions below this get 3x the reps (they are cheap)

struct SizePlan {
  uint64_t requested_mib = 0;
  uint32_t block_tokens = 0;
  uint32_t blocks = 0;
  uint64_t block_bytes = 0;
  uint64_t bytes = 0;
  uint64_t padded = 0;
  std::string note;
};

SizePlan PlanSize(const KvShape& shape, uint64_t mib, uint32_t fixed_block_tokens) {
  SizePlan p;
  p.requested_mib = mib;
  const uint64_t target = mib << 20;
  const uint64_t per_token = shape.BytesPerToken();
  p.block_tokens = fixed_block_tokens;
  if (p.block_tokens == 0) {
    p.block_tokens = kDefaultBlockTokens;
    while (p.block_tokens > kMinBlockTokens && p.block_tokens * per_token > target) p.block_tokens /= 2;
  }
  p.block_bytes = p.block_tokens * per_token;
  p.blocks = static_cast<uint32_t>(std::max<uint64_t>(1, target / p.block_bytes));
  p.bytes = uint64_t{p.blocks} * p.block_bytes;
  p.padded = (p.bytes + 4095) / 4096 * 4096;
  if (p.bytes != target) {
    p.note = "a session is whole blocks: " + std::to_string(p.blocks) + " x " + std::to_string(p.block_tokens) +
             "-token blocks of " + std::to_string(p.block_bytes) + " bytes = " + std::to_string(p.bytes) +
             " bytes (asked " + std::to_string(mib) + " MiB)";
  }
  return p;
}

// The copy threads of memcpy and dram_restore alike: --copy-threads, else one per CPU online.
uint32_t CopyThreads(const BenchRestoreArgs& args) {
  return args.copy_threads != 0 ? args.copy_threads : uint32_t(ThreadPool::HardwareThreads());
}

std::vector<std::unique_ptr<RestoreRun>> MakeRuns(const BenchRestoreArgs& args, const PageCacheEvictor* ev,
                                                  const std::shared_ptr<const Codec>& codec,
                                                  const std::shared_ptr<PeerContext>& peers) {
  const std::vector<std::string>& names = args.runs;
  std::vector<std::unique_ptr<RestoreRun>> runs;
  for (std::string_view n : kRunNames) {
    if (!names.empty() && std::find(names.begin(), names.end(), n) == names.end()) continue;
    if (n == "memcpy") runs.push_back(MakeMemcpyRun(CopyThreads(args)));
    if (n == "raw_direct_read") runs.push_back(MakeRawDirectReadRun(uint64_t{args.raw_request_kib} << 10, args.raw_queue_depth));
    if (n == "dram_restore") runs.push_back(MakeStoreRun(Medium::kDram, args.window_layers, nullptr, 0, CopyThreads(args)));
    if (n == "ssd_restore") runs.push_back(MakeStoreRun(Medium::kSsd, args.window_layers));
    if (n == "files_per_block") runs.push_back(MakeFilesPerBlockRun(ev));
    if (n == "rocksdb") runs.push_back(MakeRocksDbRun(ev, RocksDbConfig::kDefaults));
    if (n == "rocksdb_blobdb") runs.push_back(MakeRocksDbRun(ev, RocksDbConfig::kBlobDb));
    if (n == "ssd_codec_restore" && codec)
      runs.push_back(MakeStoreRun(Medium::kSsd, args.window_layers, codec, args.decode_threads));
  }
  for (std::string_view n : kPeerRunNames) {  // the real peers (bench_peers.h); --no-peers leaves them out
    if (names.empty() ? args.no_peers : std::find(names.begin(), names.end(), n) == names.end()) continue;
    runs.push_back(MakePeerRun(n, peers));
  }
  return runs;
}

// Measures one size: set every run up, time `reps` interleaved repetitions, tear down.
// Fills the session with synthetic KV: block b's layer l slice is tokens
// b * block_tokens... of layer l of one continuous sequence.
void FillSynthetic(const KvShape& shape, const SizePlan& plan, std::span<std::byte> out, uint64_t seed) {
  const uint64_t lb = plan.block_bytes / shape.layers;
  for (uint32_t b = 0; b < plan.blocks; ++b)
    for (uint32_t l = 0; l < shape.layers; ++l) {
      const SliceLayout layout{shape, plan.block_tokens, l, b * plan.block_tokens};
      codec::FillSyntheticKv(layout, seed + l, out.subspan(uint64_t{b} * plan.block_bytes + l * lb, lb));
    }
  std::memset(out.data() + plan.bytes, 0, plan.padded - plan.bytes);
}

Status MeasureSize(const SizePlan& plan, const KvShape& shape, uint32_t reps, const std::string& dir,
                   PrefaultedBuffer& src, PrefaultedBuffer& dst, std::vector<std::unique_ptr<RestoreRun>>& runs,
                   bool synthetic, SizeResult& out) {
  BenchSession s;
  s.shape = shape;
  s.block_tokens = plan.block_tokens;
  s.blocks = plan.blocks;
  s.block_bytes = plan.block_bytes;
  s.block_layer_bytes = plan.block_bytes / shape.layers;
  s.bytes = src.first(plan.bytes);
  s.padded_bytes = plan.padded;
  s.dir = dir;
  if (synthetic) {
    FillSynthetic(shape, plan, src.first(plan.padded), 0x5E5510Eull + plan.requested_mib);
  } else {
    FillRandom(src.first(plan.padded), 0x5E5510Eull + plan.requested_mib);
  }
  // Synthetic tokens (a 128k vocabulary) chained into keys; the namespace
  // names the size so no two sizes share a key.
  std::vector<uint32_t> tokens(uint64_t{plan.blocks} * plan.block_tokens);
  std::vector<std::byte> token_bytes(tokens.size() * 4);
  FillRandom(token_bytes, plan.requested_mib);
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint32_t v;
    std::memcpy(&v, token_bytes.data() + 4 * i, 4);
    tokens[i] = v % 128256;
  }
  const KeyHasher hasher;
  const BlockKey ns = hasher.NamespaceDigest({"flatkv-bench/" + shape.ToString(), "", std::to_string(plan.requested_mib)});
  s.keys = hasher.ChainKeys(ns, tokens, plan.block_tokens);
  if (s.keys.size() != plan.blocks) return Status::FailedPrecondition("ChainKeys gave " + std::to_string(s.keys.size()) + " keys");

  struct Teardown {
    std::vector<std::unique_ptr<RestoreRun>>& runs;
    ~Teardown() {
      for (auto& r : runs) {
        Status st = r->Teardown();
        if (!st.ok()) std::fprintf(stderr, "warning: %s teardown: %s\n", std::string(r->name()).c_str(), st.ToString().c_str());
      }
    }
  } teardown{runs};
  std::vector<RestoreRun*> live;  // the runs that could start (a peer that cannot run reports why)
  for (auto& r : runs) {
    const double t0 = NowSeconds();
    FLATKV_RETURN_IF_ERROR(r->Setup(s).WithContext(std::string(r->name()) + " setup"));
    out.runs[std::string(r->name())]["setup_seconds"] = NowSeconds() - t0;
    if (const std::string why = r->Unavailable(); !why.empty()) {
      out.runs[std::string(r->name())]["error"] = why;
      std::fprintf(stderr, "warning: %s could not run: %s\n", std::string(r->name()).c_str(), why.c_str());
    } else {
      live.push_back(r.get());
    }
  }
  const std::span<std::byte> dest = dst.first(plan.padded);
  std::map<std::string, std::vector<double>> cpu_per_gb;  // process CPU seconds per GB delivered, per rep
  for (uint32_t rep = 0; rep < reps; ++rep) {
    for (size_t k = 0; k < live.size(); ++k) {
      RestoreRun& r = *live[(rep + k) % live.size()];
      const std::string name(r.name());
      if (out.runs[name].contains("error")) continue;  // a peer that failed in an earlier rep
      // The first and the last rep are verified (against a poisoned
      // destination, so stale bytes cannot pass); the others skip both
      // memset and memcmp, which would otherwise dominate a profile.
      // Small sessions are poisoned every rep, so each rep starts with the
      // destination equally cache-warm.
      const bool verify = rep == 0 || rep + 1 == reps;
      if (verify || plan.bytes < kSmallSessionBytes) std::memset(dest.data(), 0xA5, dest.size());
      if (Interrupted()) return Status::Aborted("interrupted");
      FLATKV_RETURN_IF_ERROR(r.Prepare().WithContext(name + " prepare"));
      if (rep == 0 && !r.CachedFiles().empty()) {
        PageCacheEvictor probe(false);
        auto resident = probe.ResidentBytes(r.CachedFiles());
        if (resident.ok()) {
          out.runs[name]["resident_bytes_after_eviction"] = *resident;
          if (*resident > plan.bytes / 100) {
            std::fprintf(stderr, "warning: %s: %llu bytes still in the page cache after eviction\n", name.c_str(),
                         static_cast<unsigned long long>(*resident));
          }
        }
      }
      const double cpu0 = ProcessCpuSeconds();
      auto seconds = r.Run(dest);
      const double cpu = ProcessCpuSeconds() - cpu0;
      if (!seconds.ok() && !r.Unavailable().empty()) {  // a peer failed: reported, the others go on
        out.runs[name]["error"] = "rep " + std::to_string(rep) + ": " + r.Unavailable();
        out.gbps.erase(name);
        std::fprintf(stderr, "warning: %s failed: %s\n", name.c_str(), r.Unavailable().c_str());
        continue;
      }
      if (!seconds.ok()) return seconds.status().WithContext(name + " rep " + std::to_string(rep));
      cpu_per_gb[name].push_back(cpu / (double(plan.bytes) / 1e9));
      if (verify) {
        BenchSession want = s;
        if (!r.Expected().empty()) want.bytes = r.Expected();
        FLATKV_RETURN_IF_ERROR(VerifyDestination(want, r.layout(), dest).WithContext(name + " rep " + std::to_string(rep) + " verify"));
      }
      out.gbps[name].push_back(double(plan.bytes) / std::max(*seconds, 1e-9) / 1e9);
    }
  }
  for (auto& r : runs) {
    nlohmann::json info = r->Describe();
    for (auto& [k, v] : info.items()) out.runs[std::string(r->name())][k] = v;
    if (!r->Unavailable().empty() || out.runs[std::string(r->name())].contains("error")) continue;
    out.runs[std::string(r->name())]["verified_reps"] = std::min<uint32_t>(reps, 2);
    // CPU of every thread of the process (store threads included) during Run.
    out.runs[std::string(r->name())]["cpu_seconds_per_gb"] = Summarize(cpu_per_gb[std::string(r->name())]).median;
  }
  return Status::Ok();
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "flatkv bench restore: %s\n", msg.c_str());
  return kExitFailure;
}

int Usage(const std::string& msg) {
  std::fprintf(stderr, "flatkv bench restore: %s\n", msg.c_str());
  return kExitUsage;
}

int RunChecked(const BenchRestoreArgs& args) {
  auto shape = FindShapePreset(args.shape);
  if (!shape.ok()) return Usage("--shape: " + shape.status().message());
  std::vector<uint64_t> sizes = args.sizes_mib;
  if (sizes.empty()) sizes = args.quick ? std::vector<uint64_t>{1, 16, 64, 256} : std::vector<uint64_t>{1, 4, 16, 64, 256, 1024};
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const uint32_t reps = args.reps ? args.reps : (args.quick ? 3 : 5);
  if (args.drop_caches && ::geteuid() != 0) return Usage("--drop-caches: needs root (writes /proc/sys/vm/drop_caches)");
  std::shared_ptr<const Codec> codec;
  if (!args.codec.empty()) {
    auto made = MakeCodec(args.codec);
    if (!made.ok()) return Usage("--codec: " + made.status().message());
    codec = std::move(made).value();
    if (Status st = codec->Supports({*shape, args.block_tokens ? args.block_tokens : kDefaultBlockTokens}); !st.ok())
      return Usage("--codec " + args.codec + " with --shape " + args.shape + ": " + st.message());
  } else if (std::find(args.runs.begin(), args.runs.end(), "ssd_codec_restore") != args.runs.end()) {
    return Usage("--runs ssd_codec_restore: needs --codec SPEC");
  }
  const std::string parent = args.dir.empty() ? "/var/tmp" : args.dir;

  std::vector<SizePlan> plans;
  uint64_t max_padded = 0;
  for (uint64_t mib : sizes) {
    plans.push_back(PlanSize(*shape, mib, args.block_tokens));
    max_padded = std::max(max_padded, plans.back().padded);
  }
  // Source, destination, DRAM arena, slack; a lossy codec's expected bytes.
  const bool peers = args.runs.empty() ? !args.no_peers
                                       : std::any_of(args.runs.begin(), args.runs.end(), [](const std::string& r) {
                                           return std::find(kPeerRunNames.begin(), kPeerRunNames.end(), r) != kPeerRunNames.end();
                                         });
  const PeerFootprint peer_need = peers ? PeerFootprintOf(max_padded) : PeerFootprint{};
  const uint64_t mem_need = (codec && !codec->Lossless() ? 4 : 3) * max_padded + (512ull << 20) + peer_need.memory_bytes;
  const uint64_t mem_avail = MemAvailableBytes();
  if (mem_avail != 0 && mem_need > mem_avail) {
    return Usage("--sizes-mib: the largest session (" + std::to_string(max_padded >> 20) + " MiB) needs about " +
                 std::to_string(mem_need >> 20) + " MiB of memory" + (peers ? " with the peers (--no-peers leaves them out)" : "") +
                 "; " + std::to_string(mem_avail >> 20) + " MiB is available");
  }
  auto fs = GetFsInfo(parent);
  if (!fs.ok()) return Usage((args.dir.empty() ? "default directory: " : "--dir: ") + fs.status().ToString());
  const uint64_t disk_need = 6 * max_padded + (1ull << 30) + peer_need.disk_bytes;
  if (fs->free_bytes < disk_need) {
    return Usage("--dir " + parent + ": " + std::to_string(fs->free_bytes >> 20) + " MiB free, the benchmark needs about " +
                 std::to_string(disk_need >> 20) + " MiB");
  }
  if (fs->tmpfs) {
    std::fprintf(stderr,
                 "warning: %s is %s: its 'disk' is memory, so disk runs measure DRAM. Use --dir on a disk-backed "
                 "filesystem.\n",
                 parent.c_str(), fs->type.c_str());
  }
  InstallInterruptHandlers();
  auto scratch = ScratchDir::Create(parent);
  if (!scratch.ok()) return Fail(scratch.status().ToString());
  const PageCacheEvictor evictor(args.drop_caches);

  BenchReport report;
  report.config = {{"shape", args.shape},
                   {"shape_detail", shape->ToString()},
                   {"bytes_per_token", shape->BytesPerToken()},
                   {"block_tokens", args.block_tokens ? std::to_string(args.block_tokens) : "auto"},
                   {"block_tokens_rule", args.block_tokens ? "fixed by --block-tokens"
                                                           : "64, halved down to 16 while a block exceeds the session"},
                   {"reps", reps},
                   {"reps_small_sessions", reps * 3},
                   {"small_session_bytes_below", kSmallSessionBytes},
                   {"order", "runs interleaved in each rep, starting run rotated per rep"},
                   {"page_cache_eviction", evictor.method()},
                   {"dir", scratch->path()},
                   {"filesystem", fs->type},
                   {"quick", args.quick},
                   {"raw_direct_read",
                    {{"engine", "io_uring"}, {"request_bytes", uint64_t{args.raw_request_kib} << 10}, {"queue_depth", args.raw_queue_depth}}},
                   {"gbps", "1e9 bytes per second"},
                   {"summary", "top-level *_gbps and ratios are for the largest session measured"},
                   {"cpus_online", ::sysconf(_SC_NPROCESSORS_ONLN)},
                   {"codec", codec ? codec->Spec() : std::string()},
                   {"payload", codec ? "synthetic KV (codec/synthetic_kv.h)" : "random bytes"},
                   {"loadavg_1m_at_start", LoadAverage()}};

  std::fprintf(stderr, "flatkv bench restore: %s, %zu sizes, dir %s (%s), page cache: %s\n", args.shape.c_str(),
               plans.size(), scratch->path().c_str(), fs->type.c_str(), evictor.method().c_str());
  auto src = PrefaultedBuffer::Allocate(max_padded);
  if (!src.ok()) return Fail("source buffer: " + src.status().ToString());
  auto dst = PrefaultedBuffer::Allocate(max_padded);
  if (!dst.ok()) return Fail("destination buffer: " + dst.status().ToString());
  auto runs = MakeRuns(args, &evictor, codec, MakePeerContext());

  for (const SizePlan& plan : plans) {
    SizeResult out;
    out.requested_mib = plan.requested_mib;
    out.session_bytes = plan.bytes;
    out.blocks = plan.blocks;
    out.block_tokens = plan.block_tokens;
    out.block_bytes = plan.block_bytes;
    out.reps = plan.bytes < kSmallSessionBytes ? reps * 3 : reps;
    out.note = plan.note;
    const std::string dir = scratch->path() + "/s" + std::to_string(plan.requested_mib);
    if (auto st = RemoveAll(dir); !st.ok()) return Fail(st.ToString());
    if (std::error_code ec; !std::filesystem::create_directory(dir, ec)) return Fail("mkdir " + dir + ": " + ec.message());
    const double t0 = NowSeconds();
    Status st = MeasureSize(plan, *shape, out.reps, dir, *src, *dst, runs, codec != nullptr, out);
    if (!st.ok()) return Fail(std::to_string(plan.requested_mib) + " MiB session: " + st.ToString());
    if (auto rm = RemoveAll(dir); !rm.ok()) std::fprintf(stderr, "warning: %s\n", rm.ToString().c_str());
    std::fprintf(stderr, "  %6llu MiB: %u blocks x %u tokens, %u reps, %.1f s; ssd %.2f GB/s, raw %.2f GB/s\n",
                 static_cast<unsigned long long>(plan.requested_mib), plan.blocks, plan.block_tokens, out.reps,
                 NowSeconds() - t0, MedianGbps(out, "ssd_restore"), MedianGbps(out, "raw_direct_read"));
    if (out.runs.contains("ssd_restore")) {
      const auto& info = out.runs["ssd_restore"];
      report.config["ssd_engine"] = info.value("ssd_engine", "");
      report.config["ssd_direct_io"] = info.value("ssd_direct_io", false);
    }
    report.sizes.push_back(std::move(out));
  }
  report.config["engine"] = report.config.value("ssd_engine", "n/a");
  report.config["loadavg_1m_at_end"] = LoadAverage();
  if (args.json) {
    nlohmann::json j = ToJson(report);
    AddPeerJson(report, j);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("flatkv bench restore: shape %s (%s), dir %s (%s), load average %.1f -> %.1f on %ld cpus\npage-cache eviction before files_per_block and "
                "rocksdb reads: %s; ssd engine: %s, O_DIRECT: %s\n\n%s",
                args.shape.c_str(), shape->ToString().c_str(), scratch->path().c_str(), fs->type.c_str(),
                report.config.value("loadavg_1m_at_start", 0.0), report.config.value("loadavg_1m_at_end", 0.0),
                ::sysconf(_SC_NPROCESSORS_ONLN), evictor.method().c_str(), report.config.value("ssd_engine", std::string("n/a")).c_str(),
                report.config.value("ssd_direct_io", false) ? "yes" : "no",
                (FormatTable(report) + FormatPeerTable(report)).c_str());
    if (fs->tmpfs) std::printf("WARNING: %s is %s (memory): the disk runs did not touch a disk.\n", parent.c_str(), fs->type.c_str());
  }
  return kExitOk;
}

}  // namespace

CLI::App* AddBenchRestoreCommand(CLI::App& bench, BenchRestoreArgs& a) {
  CLI::App* cmd = bench.add_subcommand("restore", "Session restore throughput: flatkv DRAM and SSD tiers against memcpy, "
                                                  "a raw O_DIRECT read, one-file-per-block, RocksDB, "
                                                  "Mooncake Store and LMCache's backends");
  cmd->add_flag("--quick", a.quick, "Sizes 1,16,64,256 MiB and 3 reps (about a minute)");
  cmd->add_flag("--json", a.json, "Print one JSON object instead of the table");
  AddScratchDirOption(*cmd, a.dir);
  cmd->add_option("--shape", a.shape, "KV shape preset")
      ->check(CLI::Validator(
          [](std::string& v) {
            auto s = FindShapePreset(v);
            return s.ok() ? std::string() : s.status().message();
          },
          "PRESET"))
      ->capture_default_str();
  cmd->add_option("--sizes-mib", a.sizes_mib, "Session sizes in MiB, comma separated (default 1,4,16,64,256,1024)")
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, uint64_t{64} << 10));
  cmd->add_option("--reps", a.reps, "Repetitions per size (default 5, --quick 3; sessions < 64 MiB get 3x)")
      ->check(CLI::Range(1u, 1000u));
  cmd->add_option("--block-tokens", a.block_tokens, "Tokens per block for every size (default: 64, halved down to 16 while a block exceeds the session)")
      ->check(CLI::Range(kMinBlockTokens, 512u));
  std::vector<std::string> names(kRunNames.begin(), kRunNames.end());
  names.insert(names.end(), kPeerRunNames.begin(), kPeerRunNames.end());
  cmd->add_flag("--no-peers", a.no_peers,
                "Leave out the real peers (a flatkv serve child, Mooncake Store, LMCache's backends; bench_peers.h)");
  cmd->add_option("--runs", a.runs, "Only these runs, comma separated")->delimiter(',')->check(CLI::IsMember(names));
  cmd->add_option("--raw-request-kib", a.raw_request_kib, "raw_direct_read request size in KiB (multiple of 4)")
      ->check(CLI::Range(4u, 65536u))
      ->check(CLI::Validator([](std::string& v) { return std::strtoul(v.c_str(), nullptr, 10) % 4 ? std::string("must be a multiple of 4") : std::string(); }, "MULTIPLE OF 4"))
      ->capture_default_str();
  cmd->add_option("--raw-queue-depth", a.raw_queue_depth, "raw_direct_read requests in flight")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  cmd->add_option("--window-layers", a.window_layers,
                  "StoreOptions::window_layers for dram_restore and ssd_restore (default: the store's default)")
      ->check(CLI::Range(1u, 1024u));
  cmd->add_option("--codec", a.codec,
                  "Also restore the session stored with this codec (ssd_codec_restore; e.g. pred, kivi:bits=2) "
                  "and fill every run's session with synthetic KV");
  cmd->add_option("--copy-threads", a.copy_threads,
                  "Threads of the memcpy baseline and StoreOptions::dram_threads of dram_restore (default: one per CPU online)")
      ->check(CLI::Range(1u, 256u));
  cmd->add_option("--decode-threads", a.decode_threads,
                  "StoreOptions::decode_threads for ssd_codec_restore (default: the store's default)")
      ->check(CLI::Range(1u, 256u));
  cmd->add_flag("--drop-caches", a.drop_caches,
                "Also write 1 to /proc/sys/vm/drop_caches before page-cache reads (needs root)");
  return cmd;
}

int RunBenchRestore(const BenchRestoreArgs& args) { return RunCatching("bench restore", [&] { return RunChecked(args); }); }

}  // namespace flatkv::tools
