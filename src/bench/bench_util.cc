#include "bench/bench_util.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

namespace flatkv::tools {
namespace {

constexpr uint64_t kHugePage = 2ull << 20;

std::atomic<bool> g_interrupted{false};

void OnSignal(int) { g_interrupted.store(true); }

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Expands directories into the regular files below them.
Result<std::vector<std::string>> RegularFiles(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      for (auto it = std::filesystem::recursive_directory_iterator(p, ec); !ec && it != std::filesystem::end(it);
           it.increment(ec)) {
        if (it->is_regular_file()) files.push_back(it->path().string());
      }
      if (ec) return Status::FromErrno(ec.value(), "listing " + p);
    } else if (std::filesystem::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      return Status::NotFound(p + ": not a file or directory");
    }
  }
  return files;
}

}  // namespace

PrefaultedBuffer::~PrefaultedBuffer() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

PrefaultedBuffer::PrefaultedBuffer(PrefaultedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PrefaultedBuffer& PrefaultedBuffer::operator=(PrefaultedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Result<PrefaultedBuffer> PrefaultedBuffer::Allocate(uint64_t bytes) {
  const uint64_t size = RoundUp(std::max<uint64_t>(bytes, 1), kHugePage);
  // Over-map by one huge page, then trim head and tail so exactly
  // [aligned, aligned + size) stays mapped.
  void* raw = ::mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return Status::FromErrno(errno, "mmap of " + std::to_string(size) + " bytes");
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(base, kHugePage);
  const uintptr_t head = aligned - base;
  if (head > 0) ::munmap(raw, head);
  if (kHugePage - head > 0) ::munmap(reinterpret_cast<void*>(aligned + size), kHugePage - head);
  ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  std::memset(reinterpret_cast<void*>(aligned), 0, size);
  PrefaultedBuffer b;
  b.data_ = reinterpret_cast<std::byte*>(aligned);
  b.size_ = size;
  return b;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double ProcessCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double LoadAverage() {
  double l[1] = {0};
  return ::getloadavg(l, 1) == 1 ? l[0] : -1;
}

SampleSummary Summarize(std::vector<double> samples) {
  SampleSummary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  s.median = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

double Percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  return samples[std::min(samples.size() - 1, static_cast<size_t>(q * double(samples.size())))];
}

void FillRandom(std::span<std::byte> out, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&x] {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t v = next();
    std::memcpy(out.data() + i, &v, 8);
  }
  if (i < out.size()) {
    const uint64_t v = next();
    std::memcpy(out.data() + i, &v, out.size() - i);
  }
}

Result<FsInfo> GetFsInfo(const std::string& path) {
  struct statfs sf {};
  if (::statfs(path.c_str(), &sf) != 0) return Status::FromErrno(errno, "statfs " + path);
  struct statvfs sv {};
  if (::statvfs(path.c_str(), &sv) != 0) return Status::FromErrno(errno, "statvfs " + path);
  FsInfo info;
  info.free_bytes = uint64_t(sv.f_bavail) * sv.f_frsize;
  switch (static_cast<unsigned long>(sf.f_type)) {
    case EXT4_SUPER_MAGIC: info.type = "ext4"; break;  // also ext2/ext3: one magic
    case TMPFS_MAGIC: info.type = "tmpfs"; info.tmpfs = true; break;
    case XFS_SUPER_MAGIC: info.type = "xfs"; break;
    case BTRFS_SUPER_MAGIC: info.type = "btrfs"; break;
    case OVERLAYFS_SUPER_MAGIC: info.type = "overlayfs"; break;
    case RAMFS_MAGIC: info.type = "ramfs"; info.tmpfs = true; break;
    default: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "0x%lx", static_cast<unsigned long>(sf.f_type));
      info.type = buf;
    }
  }
  return info;
}

uint64_t MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

Status PageCacheEvictor::Evict(const std::vector<std::string>& paths) const {
  FLATKV_ASSIGN_OR_RETURN(auto files, RegularFiles(paths));
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + f);
    int err = 0;
    if (::fdatasync(fd) != 0) err = errno;
    const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (err != 0) return Status::FromErrno(err, "fdatasync " + f);
    if (rc != 0) return Status::FromErrno(rc, "posix_fadvise(DONTNEED) " + f);
  }
  if (drop_caches_) {
    ::sync();
    const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open /proc/sys/vm/drop_caches");
    const ssize_t n = ::write(fd, "1", 1);
    const int err = errno;
    ::close(fd);
    if (n != 1) return Status::FromErrno(err, "write /proc/sys/vm/drop_caches");
  }
  return Status::Ok();
}

Result<uint64_t> PageCacheEvictor::ResidentBytes(const std::vector<std::string>& paths) const {
  FLATKV_ASSIGN_OR_RETURN(auto files, RegularFiles(paths));
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t resident = 0;
  std::vector<unsigned char> vec;
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + f);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size == 0) {
      ::close(fd);
      continue;
    }
    void* map = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap " + f);
    vec.assign((st.st_size + page - 1) / page, 0);
    const int rc = ::mincore(map, st.st_size, vec.data());
    const int err = errno;
    ::munmap(map, st.st_size);
    if (rc != 0) return Status::FromErrno(err, "mincore " + f);
    for (unsigned char v : vec) resident += (v & 1) ? page : 0;
  }
  return resident;
}

std::string PageCacheEvictor::method() const {
  return drop_caches_ ? "fadvise_dontneed+drop_caches" : "fadvise_dontneed";
}

void InstallInterruptHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

bool Interrupted() { return g_interrupted.load(); }

ScratchDir::~ScratchDir() {
  if (!path_.empty()) {
    Status st = RemoveAll(path_);
    if (!st.ok()) std::fprintf(stderr, "warning: could not remove %s: %s\n", path_.c_str(), st.ToString().c_str());
  }
}

Result<ScratchDir> ScratchDir::Create(const std::string& parent) {
  std::string tmpl = parent + "/flatkv-bench-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return Status::FromErrno(errno, "mkdtemp " + tmpl);
  ScratchDir d;
  d.path_ = tmpl;
  return d;
}

CLI::Option* AddScratchDirOption(CLI::App& cmd, std::string& dir) {
  return cmd.add_option("--dir", dir, "Existing directory to hold the scratch directory (default /var/tmp)")
      ->check(CLI::ExistingDirectory);
}

Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return Status::FromErrno(ec.value(), "removing " + path);
  return Status::Ok();
}

}  // namespace flatkv::tools
