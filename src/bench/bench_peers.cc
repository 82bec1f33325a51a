// The peer runs of `flatkv bench restore` (bench_peers.h): the Python
// driver's child process, the shared memfd, the runs, and their report.
#include "bench/bench_peers.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "replay/io_model.h"
#include "replay/policy.h"
#include "service/client.h"

extern char** environ;

namespace flatkv::tools {
namespace {

constexpr double kRequestTimeoutS = 900;  // a driver's longest step: SSD setup of a large session

std::string SourceDir() { return FLATKV_SOURCE_DIR; }

// The Python that runs the driver for `group`, with the steps tried when it is missing.
Result<std::string> FindPython(const std::string& group) {
  const bool lmcache = group == "lmcache";
  const char* var = lmcache ? "FLATKV_LMCACHE_PYTHON" : "FLATKV_PEERS_PYTHON";
  if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
    if (::access(v, X_OK) != 0) return Status::NotFound(std::string(var) + "=" + v + " is not executable");
    return std::string(v);
  }
  const std::string env = lmcache ? "vllm" : "peers";
  const std::string py = SourceDir() + "/build/pyenv/" + env + "/bin/python";
  if (::access(py.c_str(), X_OK) != 0) {
    return Status::NotFound("tried " + py + " (and $" + var + "): not installed; run scripts/install-deps.sh pyenv:" + env);
  }
  return py;
}

// A memfd both this process and the drivers map: the session at 0, a run's
// delivered bytes at dst_offset.
struct SharedMem {
  int fd = -1;
  std::byte* base = nullptr;
  uint64_t bytes = 0;
  ~SharedMem() {
    if (base != nullptr) ::munmap(base, bytes);
    if (fd >= 0) ::close(fd);
  }
  Status Ensure(uint64_t need) {
    if (need <= bytes) return Status::Ok();
    if (fd < 0) {
      fd = ::memfd_create("flatkv-bench-peers", 0);  // inherited by the drivers (no MFD_CLOEXEC)
      if (fd < 0) return Status::FromErrno(errno, "memfd_create");
    }
    if (base != nullptr) ::munmap(base, bytes);
    base = nullptr;
    bytes = 0;
    if (::ftruncate(fd, static_cast<off_t>(need)) != 0) return Status::FromErrno(errno, "ftruncate memfd");
    void* p = ::mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap memfd");
    base = static_cast<std::byte*>(p);
    bytes = need;
    return Status::Ok();
  }
};

// scripts/peer_bench.py as a child: one JSON object per line each way.
class Driver {
 public:
  ~Driver() { Stop(); }

  static Result<std::unique_ptr<Driver>> Start(const std::vector<std::string>& args, const std::string& log) {
    ::signal(SIGPIPE, SIG_IGN);  // a driver that died answers EPIPE, not a signal
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]);
      ::close(in[1]);
      return Status::FromErrno(errno, "pipe");
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    auto d = std::unique_ptr<Driver>(new Driver());
    const int rc = ::posix_spawn(&d->pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    d->in_ = in[1];
    d->out_ = out[0];
    if (rc != 0) {
      d->pid_ = -1;
      return Status::FromErrno(rc, "posix_spawn " + args[0]);
    }
    auto ready = d->ReadReply();
    if (!ready.ok()) return ready.status().WithContext("starting " + args[0] + " (log: " + log + ")");
    return d;
  }

  Result<nlohmann::json> Request(const nlohmann::json& req, double timeout_s = kRequestTimeoutS) {
    const std::string line = req.dump() + "\n";
    for (size_t off = 0; off < line.size();) {
      const ssize_t n = ::write(in_, line.data() + off, line.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::FromErrno(errno, "writing to the peer driver");
      off += static_cast<size_t>(n);
    }
    return ReadReply(timeout_s);
  }

  void Stop() {
    if (pid_ <= 0) return;
    (void)Request({{"op", "quit"}}, 30);
    if (in_ >= 0) ::close(in_);
    in_ = -1;
    // The driver stops its Mooncake processes on quit; SIGTERM, then SIGKILL, if it does not exit.
    for (int i = 0; i < 300; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      if (i == 200) ::kill(pid_, SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (out_ >= 0) ::close(out_);
    out_ = -1;
  }

 private:
  Driver() = default;

  Result<nlohmann::json> ReadReply(double timeout_s = kRequestTimeoutS) {
    const double deadline = NowSeconds() + timeout_s;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) return Status::Corruption("peer driver replied '" + line + "'");
        if (!j.value("ok", false)) return Status::FailedPrecondition(j.value("error", std::string("unknown error")));
        return j;
      }
      const double left = deadline - NowSeconds();
      if (left <= 0) return Status::Aborted("the peer driver did not reply within " + std::to_string(int(timeout_s)) + " s");
      pollfd p{out_, POLLIN, 0};
      const int pr = ::poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000));
      if (pr < 0 && errno == EINTR) {
        if (Interrupted()) return Status::Aborted("interrupted");
        continue;
      }
      if (pr <= 0) continue;
      char chunk[65536];
      const ssize_t n = ::read(out_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::IoError("the peer driver exited");
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string buf_;
};

}  // namespace

// A driver shared by the runs of one group ("mooncake-dram": mooncake_dram and
// mooncake_dram_tcp; "mooncake-ssd"; "lmcache": lmcache_cpu and lmcache_disk),
// started by the first run's Setup of a size and stopped by the last Teardown.
struct PeerGroup {
  std::unique_ptr<Driver> driver;
  int users = 0;
  std::string error;  // why it could not run, with the steps tried
  nlohmann::json info = nlohmann::json::object();
};

struct PeerContext {
  SharedMem mem;
  std::map<std::string, PeerGroup> groups;
};

std::shared_ptr<PeerContext> MakePeerContext() { return std::make_shared<PeerContext>(); }

namespace {

struct GroupSpec {
  std::string peer;  // "mooncake" or "lmcache"
  bool ssd = false;
};

GroupSpec SpecOf(const std::string& group) {
  if (group == "lmcache") return {"lmcache", false};
  return {"mooncake", group == "mooncake-ssd"};
}

// Starts the group's driver and puts the session; on failure the group keeps the error.
void StartGroup(PeerContext& ctx, const std::string& group, const BenchSession& s) {
  PeerGroup& g = ctx.groups[group];
  const GroupSpec spec = SpecOf(group);
  auto python = FindPython(group);
  if (!python.ok()) {
    g.error = python.status().message();
    return;
  }
  const std::string dir = s.dir + "/" + group;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // Mooncake's pool: the session with room above the master's 90% eviction
  // watermark; with SSD offload, 512 MiB: two of the bucket backend's 256 MiB
  // buckets, smaller than what the setup writes (the session and as much again
  // of other sessions' blocks), so the session is evicted to SSD.
  const uint64_t pool = spec.ssd ? (512ull << 20) : (s.bytes.size() + s.bytes.size() / 4 + (64ull << 20));
  std::vector<std::string> args = {*python,         SourceDir() + "/scripts/peer_bench.py",
                                   spec.peer,       "--dir",
                                   dir,             "--memfd",
                                   std::to_string(ctx.mem.fd), "--memfd-bytes",
                                   std::to_string(ctx.mem.bytes), "--dst-offset",
                                   std::to_string(s.padded_bytes)};
  if (spec.peer == "mooncake") {
    args.push_back("--pool-bytes");
    args.push_back(std::to_string(pool));
    if (spec.ssd) args.push_back("--ssd");
  }
  auto d = Driver::Start(args, dir + "/driver.log");
  if (!d.ok()) {
    g.error = d.status().message() + " (steps: " + *python + " scripts/peer_bench.py " + spec.peer + ")";
    return;
  }
  nlohmann::json keys = nlohmann::json::array();
  for (const BlockKey& k : s.keys) keys.push_back(k.ToHex());
  auto rep = (*d)->Request({{"op", "setup"},
                            {"blocks", s.blocks},
                            {"block_bytes", s.block_bytes},
                            {"block_tokens", s.block_tokens},
                            {"layers", s.shape.layers},
                            {"keys", keys}});
  if (!rep.ok()) {
    g.error = rep.status().message() + " (log: " + dir + ")";
    return;
  }
  g.info = rep->value("info", nlohmann::json::object());
  g.driver = std::move(d).value();
}

class PeerRun final : public RestoreRun {
 public:
  PeerRun(std::string name, std::string group, std::string mode, std::shared_ptr<PeerContext> ctx)
      : name_(std::move(name)), group_(std::move(group)), mode_(std::move(mode)), ctx_(std::move(ctx)) {}

  std::string_view name() const override { return name_; }

  Status Setup(const BenchSession& s) override {
    session_ = &s;
    error_.clear();
    FLATKV_RETURN_IF_ERROR(ctx_->mem.Ensure(2 * s.padded_bytes));
    first_chunk_s_.clear();
    retried_gets_ = 0;
    latency_ = nullptr;
    PeerGroup& g = ctx_->groups[group_];
    if (g.users++ == 0) {
      g.error.clear();
      std::memcpy(ctx_->mem.base, s.bytes.data(), s.bytes.size());
      StartGroup(*ctx_, group_, s);
    }
    error_ = g.error;
    info_ = g.info;
    if (error_.empty() && mode_ == "dram") {
      // Per-object gets of the session's blocks from the DRAM pool (untimed for the other runs).
      auto lat = g.driver->Request({{"op", "latency"}, {"count", std::max<uint32_t>(100, s.blocks)}});
      latency_ = lat.ok() ? *lat : nlohmann::json{{"error", lat.status().message()}};
    }
    return Status::Ok();
  }

  std::string Unavailable() const override { return error_; }

  Result<nlohmann::json> Latency(uint32_t value_bytes, uint32_t count) {
    PeerGroup& g = ctx_->groups[group_];
    if (!g.driver) return Status::FailedPrecondition(name_ + ": " + error_);
    return g.driver->Request({{"op", "latency"}, {"count", count}, {"value_bytes", value_bytes}});
  }

  Status Prepare() override {
    PeerGroup& g = ctx_->groups[group_];
    if (!error_.empty() || !g.driver) return Status::Ok();
    return g.driver->Request({{"op", "prepare"}, {"mode", mode_}}).status();
  }

  Result<double> Run(std::span<std::byte> dst) override {
    PeerGroup& g = ctx_->groups[group_];
    if (!g.driver) return Status::FailedPrecondition(name_ + ": " + error_);
    const BenchSession& s = *session_;
    std::memset(ctx_->mem.base + s.padded_bytes, 0, s.bytes.size());  // stale bytes cannot pass
    auto got = g.driver->Request({{"op", "run"}, {"mode", mode_}});
    if (!got.ok()) {
      error_ = got.status().message();  // Unavailable() from now on: the benchmark reports it and goes on
      return got.status();
    }
    const nlohmann::json& rep = *got;
    if (rep.value("retried_gets", 0) > 0) retried_gets_ += rep.value("retried_gets", 0);
    std::memcpy(dst.data(), ctx_->mem.base + s.padded_bytes, s.bytes.size());  // untimed: the driver timed its gets
    first_chunk_s_.push_back(rep.value("first_chunk_seconds", 0.0));
    return rep.value("seconds", 0.0);
  }

  Status Teardown() override {
    auto it = ctx_->groups.find(group_);
    if (it == ctx_->groups.end()) return Status::Ok();
    PeerGroup& g = it->second;
    if (--g.users == 0) {
      if (g.driver) g.driver->Stop();
      g.driver.reset();
    }
    return Status::Ok();
  }

  nlohmann::json Describe() const override {
    nlohmann::json j = info_;
    if (!first_chunk_s_.empty()) j["first_chunk_ms"] = Summarize(first_chunk_s_).median * 1e3;
    j["retried_gets"] = retried_gets_;
    j["first_chunk"] = mode_ == "cpu" || mode_ == "disk" ? "one 256-token chunk (LMCache's default chunk_size)"
                                                         : "one object (one flatkv block) fetched alone";
    if (!latency_.is_null()) {
      j["get_p50_us"] = latency_.value("p50_us", -1.0);
      j["get_p99_us"] = latency_.value("p99_us", -1.0);
      j["get_count"] = latency_.value("count", 0);
    }
    return j;
  }

 private:
  const std::string name_, group_, mode_;
  std::shared_ptr<PeerContext> ctx_;
  const BenchSession* session_ = nullptr;
  std::string error_;
  std::vector<double> first_chunk_s_;
  uint64_t retried_gets_ = 0;  // gets Mooncake failed with a retryable code, retried in the timed region
  nlohmann::json info_ = nlohmann::json::object();
  nlohmann::json latency_;
};

// flatkv through the daemon: a `flatkv serve` child process (this binary)
// with a DRAM-only store; a client restores into a registered memfd window.
class DaemonShmRun final : public RestoreRun {
 public:
  std::string_view name() const override { return "daemon_shm_restore"; }
  DestLayout layout() const override { return DestLayout::kLayerMajor; }

  Status Setup(const BenchSession& s) override {
    session_ = &s;
    error_.clear();
    first_layer_s_.clear();  // this size's alone: a run's object serves every size
    Status st = Start(s);
    if (!st.ok()) {
      error_ = st.ToString() + " (log: " + s.dir + "/daemon.log)";
      Stop();
    }
    return Status::Ok();
  }

  std::string Unavailable() const override { return error_; }

  Result<double> Run(std::span<std::byte> dst) override {
    const BenchSession& s = *session_;
    double first = -1;
    const double t0 = NowSeconds();
    auto r = client_->RestoreToShm(*window_, 0, s.keys, [&](uint32_t layer, uint32_t, std::span<const std::byte>) {
      if (layer == 0) first = NowSeconds() - t0;
      return Status::Ok();
    });
    const double seconds = NowSeconds() - t0;
    if (!r.ok()) return r.status().WithContext("daemon_shm_restore: RestoreToShm");
    if (r->valid_blocks != s.blocks)
      return Status::FailedPrecondition("daemon_shm_restore: " + std::to_string(r->valid_blocks) + " of " +
                                        std::to_string(s.blocks) + " blocks valid");
    std::memcpy(dst.data(), window_->base, s.bytes.size());  // untimed: the check reads dst
    first_layer_s_.push_back(first);
    return seconds;
  }

  Status Teardown() override {
    Stop();
    return Status::Ok();
  }

  nlohmann::json Describe() const override {
    nlohmann::json j = {{"process", "flatkv serve (child), DRAM tier only, Unix socket + memfd window"}};
    if (!first_layer_s_.empty()) j["first_layer_ms"] = Summarize(first_layer_s_).median * 1e3;
    j["first_layer_samples"] = first_layer_s_.size();
    return j;
  }

 private:
  Status Start(const BenchSession& s) {
    char exe[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return Status::FromErrno(errno, "readlink /proc/self/exe");
    exe[n] = '\0';
    std::string preset;
    for (const ShapePreset& p : ShapePresets())
      if (p.shape == s.shape) preset = std::string(p.name);
    if (preset.empty()) return Status::NotSupported("no `flatkv serve --shape` preset matches " + s.shape.ToString());
    const std::string sock = s.dir + "/daemon.sock";
    // A DRAM-only store: `ssd_dir = ""` (docs/service.md); without it the daemon would open its
    // default SSD directory under ~/.cache.
    const std::string config = s.dir + "/daemon.toml";
    if (FILE* f = std::fopen(config.c_str(), "w")) {
      std::fputs("[store]\nssd_dir = \"\"\n", f);
      if (std::fclose(f) != 0) return Status::IoError("writing " + config);
    } else {
      return Status::FromErrno(errno, "creating " + config);
    }
    const uint64_t dram = (s.padded_bytes + s.padded_bytes / 4 + (64ull << 20) + (1ull << 20) - 1) >> 20;
    std::vector<std::string> args = {exe, "serve", "--config", config, "--unix", sock, "--tcp",
                                     "none",       "--http", "none",          "--dram-bytes", std::to_string(dram) + "MiB",
                                     "--shape",    preset,   "--block-tokens", std::to_string(s.block_tokens)};
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    const std::string log = s.dir + "/daemon.log";
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = ::posix_spawn(&pid_, exe, &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      pid_ = -1;
      return Status::FromErrno(rc, "posix_spawn flatkv serve");
    }
    service::ClientOptions co;
    co.deadline = std::chrono::milliseconds(120000);
    co.client_name = "flatkv-bench-restore";
    Status last = Status::IoError("not tried");
    for (int i = 0; i < 100 && !client_; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        std::string said;
        if (FILE* f = std::fopen(log.c_str(), "r")) {
          char buf[512];
          while (std::fgets(buf, sizeof buf, f) != nullptr) said = buf;  // its last line
          std::fclose(f);
        }
        while (!said.empty() && said.back() == '\n') said.pop_back();
        return Status::IoError("flatkv serve exited at start: " + said);
      }
      auto c = service::Client::Connect("unix:" + sock, co);
      if (c.ok()) {
        client_ = std::move(c).value();
      } else {
        last = c.status();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    if (!client_) return last.WithContext("connecting to flatkv serve");
    FLATKV_RETURN_IF_ERROR(client_->Put(1, s.keys, s.bytes).WithContext("put"));
    auto w = client_->RegisterShmWindow(s.padded_bytes);
    if (!w.ok()) return w.status().WithContext("RegisterShmWindow");
    window_ = *w;
    return Status::Ok();
  }

  void Stop() {
    client_.reset();
    window_.reset();
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      for (int i = 0; i < 100 && ::waitpid(pid_, nullptr, WNOHANG) != pid_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (::kill(pid_, 0) == 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
      }
      pid_ = -1;
    }
  }

  const BenchSession* session_ = nullptr;
  std::string error_;
  pid_t pid_ = -1;
  std::unique_ptr<service::Client> client_;
  std::optional<service::ShmWindow> window_;
  std::vector<double> first_layer_s_;
};

}  // namespace

PeerFootprint PeerFootprintOf(uint64_t padded) {
  // memfd 2x; Mooncake DRAM pool 1.25x + its dummy pool 1x; SSD store's dummy 1x and
  // 512 MiB pool; LMCache's CPU pool up to 2x; the daemon 1.25x; plus fixed buffers.
  return {9 * padded + (2ull << 30), 2 * padded + (1280ull << 20)};
}

nlohmann::json PeerLatency(RestoreRun& run, uint32_t value_bytes, uint32_t count) {
  auto* peer = dynamic_cast<PeerRun*>(&run);
  if (peer == nullptr) return {{"error", std::string(run.name()) + " has no per-object gets"}};
  auto r = peer->Latency(value_bytes, count);
  if (!r.ok()) return {{"error", r.status().message()}};
  return {{"get_p50_us", r->value("p50_us", -1.0)}, {"get_p99_us", r->value("p99_us", -1.0)},
          {"gets", r->value("count", 0)}, {"value_bytes", r->value("value_bytes", 0)}, {"clients", r->value("clients", 1)}};
}

std::unique_ptr<RestoreRun> MakePeerRun(std::string_view name, const std::shared_ptr<PeerContext>& ctx) {
  if (name == "daemon_shm_restore") return std::make_unique<DaemonShmRun>();
  if (name == "mooncake_dram") return std::make_unique<PeerRun>("mooncake_dram", "mooncake-dram", "dram", ctx);
  if (name == "mooncake_dram_tcp") return std::make_unique<PeerRun>("mooncake_dram_tcp", "mooncake-dram", "tcp", ctx);
  if (name == "mooncake_ssd") return std::make_unique<PeerRun>("mooncake_ssd", "mooncake-ssd", "ssd", ctx);
  if (name == "lmcache_cpu") return std::make_unique<PeerRun>("lmcache_cpu", "lmcache", "cpu", ctx);
  if (name == "lmcache_disk") return std::make_unique<PeerRun>("lmcache_disk", "lmcache", "disk", ctx);
  return nullptr;
}

}  // namespace flatkv::tools
