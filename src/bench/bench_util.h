// Helpers for `flatkv bench`: pre-faulted buffers, a stopwatch, sample
// medians and percentiles, deterministic random bytes, filesystem checks, page-cache
// eviction, interrupt handling and a self-removing scratch directory.
//
// Thread-safety: none of these objects is shared between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "flatkv/status.h"

namespace flatkv::tools {

// An anonymous mapping, 2 MiB aligned (so O_DIRECT accepts it), touched by
// memset once at Allocate and kept until destruction. Timed runs never pay
// first-touch page faults, which cost more than the SSD read on a
// balloon-backed VM (docs: shared/MACHINE.md §1b).
class PrefaultedBuffer {
 public:
  PrefaultedBuffer() = default;
  ~PrefaultedBuffer();
  PrefaultedBuffer(PrefaultedBuffer&& other) noexcept;
  PrefaultedBuffer& operator=(PrefaultedBuffer&& other) noexcept;
  PrefaultedBuffer(const PrefaultedBuffer&) = delete;
  PrefaultedBuffer& operator=(const PrefaultedBuffer&) = delete;

  // `bytes` is rounded up to 2 MiB.
  static Result<PrefaultedBuffer> Allocate(uint64_t bytes);

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::span<std::byte> first(uint64_t n) const { return {data_, n}; }

 private:
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// Seconds on the steady clock.
double NowSeconds();
// CPU seconds used by every thread of this process so far (user + system).
double ProcessCpuSeconds();
// The 1-minute load average (-1 when unknown): other work on a 2-core
// machine moves every figure.
double LoadAverage();

struct SampleSummary {
  double median = 0, min = 0, max = 0;
};
// Median (mean of the middle two for an even count), min and max; zeros when empty.
SampleSummary Summarize(std::vector<double> samples);

// The sample at rank floor(q * n) of the sorted samples (q in [0, 1]); 0 when empty.
double Percentile(std::vector<double> samples, double q);

// Fills `out` with pseudo-random bytes from `seed` (splitmix64): incompressible,
// so no codec on any path gets a free ride.
void FillRandom(std::span<std::byte> out, uint64_t seed);

// Filesystem facts from statfs/statvfs.
struct FsInfo {
  std::string type;  // "ext4", "xfs", "btrfs", "tmpfs", ... or "0x<magic>"
  bool tmpfs = false;
  uint64_t free_bytes = 0;  // available to this user
};
Result<FsInfo> GetFsInfo(const std::string& path);
// MemAvailable from /proc/meminfo, in bytes; 0 when unreadable.
uint64_t MemAvailableBytes();

// How a run drops its files from the page cache before each timed read.
class PageCacheEvictor {
 public:
  // With `use_drop_caches`, also writes 1 to /proc/sys/vm/drop_caches
  // (needs root) after the per-file eviction.
  explicit PageCacheEvictor(bool use_drop_caches) : drop_caches_(use_drop_caches) {}
  // fdatasync + posix_fadvise(POSIX_FADV_DONTNEED) on every regular file in
  // `paths` (a directory means every regular file below it).
  Status Evict(const std::vector<std::string>& paths) const;
  // Bytes of those files still resident in the page cache (mincore).
  Result<uint64_t> ResidentBytes(const std::vector<std::string>& paths) const;
  // "fadvise_dontneed" or "fadvise_dontneed+drop_caches".
  std::string method() const;

 private:
  bool drop_caches_;
};

// SIGINT and SIGTERM set a flag that long runs check between steps, so a
// scratch directory is removed on the way out; a second signal acts as
// usual. Blocking calls return EINTR (no SA_RESTART).
void InstallInterruptHandlers();
bool Interrupted();

// A fresh directory made by mkdtemp as `<parent>/flatkv-bench-XXXXXX`,
// removed with everything in it at destruction.
class ScratchDir {
 public:
  ScratchDir() = default;
  ~ScratchDir();
  ScratchDir(ScratchDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  ScratchDir& operator=(ScratchDir&&) = delete;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  static Result<ScratchDir> Create(const std::string& parent);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// --dir: an existing directory to hold the scratch directory (empty: /var/tmp).
CLI::Option* AddScratchDirOption(CLI::App& cmd, std::string& dir);

// Removes `path` and everything below it; Ok when it does not exist.
Status RemoveAll(const std::string& path);

}  // namespace flatkv::tools
