#include "crashtest/crashtest_cmd.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "flatkv/store.h"
#include "service/config.h"
#include "service/options_json.h"
#include "crashtest/crashtest_state.h"
#include "crashtest/crashtest_target.h"
#include "tools/tool_common.h"

extern char** environ;

namespace flatkv::tools {
namespace {

using namespace crashtest;
using Clock = std::chrono::steady_clock;

// Bounds on every wait of the driver, so that a hung child is a failure
// with a message rather than a hung run.
constexpr auto kReadyTimeout = std::chrono::seconds(60);
constexpr auto kExitTimeout = std::chrono::seconds(60);
// Sessions of this many earlier rounds stay; older ones are dropped after
// a round's check (store target), so the store never fills.
constexpr uint32_t kKeepRounds = 3;
// One SSD extent of a crashtest store (a session fits in one): a layer run
// per layer, as MakeStoreOptions configures it.
uint64_t SsdExtentBytes(const StoreOptions& o) { return o.ssd_extent_layer_bytes * o.shape.layers; }

int Usage(const std::string& msg) {
  std::fprintf(stderr, "flatkv crashtest: %s\n", msg.c_str());
  return kExitUsage;
}

std::string SelfExe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, n) : "flatkv";
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// A child process: its pid and, for a worker, the read end of its stdout.
struct Child {
  pid_t pid = -1;
  int out = -1;
};

// Starts `argv` with stderr appended to `log`, and stdout to a pipe (when
// `pipe_stdout`) or to `log` too.
Result<Child> Spawn(const std::vector<std::string>& argv, bool pipe_stdout, const std::string& log) {
  int fds[2] = {-1, -1};
  if (pipe_stdout && ::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (pipe_stdout) posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (!pipe_stdout) posix_spawn_file_actions_adddup2(&fa, 2, 1);  // keep the driver's stdout (--json) clean
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Child c;
  const int rc = ::posix_spawn(&c.pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (pipe_stdout) ::close(fds[1]);
  if (rc != 0) {
    if (pipe_stdout) ::close(fds[0]);
    return Status::FromErrno(rc, "starting " + argv[0]);
  }
  c.out = fds[0];
  return c;
}

// Waits until the child writes "ready"; false if it exits or times out.
bool WaitReady(const Child& c) {
  std::string got;
  const auto until = Clock::now() + kReadyTimeout;
  while (Clock::now() < until) {
    pollfd p{c.out, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      char buf[64];
      const ssize_t n = ::read(c.out, buf, sizeof buf);
      if (n <= 0) return false;  // closed: the child died
      got.append(buf, n);
      if (got.find("ready") != std::string::npos) return true;
    }
  }
  return false;
}

// Waits for `pid` to exit; the wait status, or -1 after the timeout.
int WaitExit(pid_t pid, std::chrono::seconds timeout) {
  const auto until = Clock::now() + timeout;
  int status = 0;
  while (Clock::now() < until) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

void Reap(Child* c) {
  if (c->pid > 0) {
    ::kill(c->pid, SIGKILL);
    ::waitpid(c->pid, nullptr, 0);
  }
  if (c->out >= 0) ::close(c->out);
  *c = Child{};
}

std::string DescribeExit(int status) {
  if (status < 0) return "did not exit within " + std::to_string(kExitTimeout.count()) + " s";
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + ::strsignal(WTERMSIG(status));
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

struct Round {
  uint32_t index = 0;
  std::string stop;  // "SIGKILL", "SIGKILL early" (before the worker was ready), "SIGTERM"
  double ran_ms = 0, restart_ms = 0;
  uint64_t log_records = 0, log_ignored_bytes = 0, puts = 0, drops = 0, reuses = 0, wrong_in_worker = 0;
  VerifyCounts v;
  uint64_t new_lost = 0;
  uint64_t gc_dropped = 0;
  uint64_t skipped_gone = 0;  // not required blocks already missing in an earlier round, not looked up again
};

class Driver {
 public:
  Driver(const CrashtestArgs& a, uint64_t dram, uint64_t ssd, SsdAdmission adm)
      : a_(a), dram_(dram), ssd_(ssd), contract_{adm, a.shared_refcount}, rng_(a.seed), exe_(SelfExe()) {}

  int Run() {
    std::error_code ec;
    std::filesystem::create_directories(a_.dir + "/store", ec);
    if (ec) return Usage("--dir " + a_.dir + ": " + ec.message());
    log_path_ = a_.dir + "/expected.log";
    // An earlier run in this directory is continued: its sessions stay checked.
    uint64_t ignored = 0;
    auto prior = ExpectedLog::ReadAll(log_path_, &ignored);
    if (!prior.ok()) return Fail(prior.status().ToString());
    for (const Record& r : *prior) first_round_ = std::max(first_round_, SessionIncarnation(r.session) + 1);
    const bool serve = a_.target == "serve";
    const uint64_t rounds_held = serve ? a_.kills + 1 : kKeepRounds + 1;
    budget_ = static_cast<uint32_t>(std::max<uint64_t>(1, ssd_ / 2 / SsdExtentBytes(MakeStoreOptions(a_.dir, dram_, ssd_, contract_.admission)) / rounds_held));
    if (!a_.json) {
      std::printf("crashtest: target %s, dir %s, %u rounds, seed %llu, %u writers, DRAM %llu bytes, SSD %llu bytes, "
                  "admission %s, shared refcount %s, %u sessions per round\n",
                  a_.target.c_str(), a_.dir.c_str(), a_.kills, (unsigned long long)a_.seed, a_.writers,
                  (unsigned long long)dram_, (unsigned long long)ssd_, a_.admission.c_str(),
                  a_.shared_refcount ? "on" : "off", budget_);
      std::fflush(stdout);
    }
    int rc = serve ? RunServe() : RunStore();
    Report();
    if (rc != kExitOk) return rc;
    return passed() ? kExitOk : kExitFailure;
  }

 private:
  int Fail(const std::string& msg) {
    std::fprintf(stderr, "flatkv crashtest: %s\n", msg.c_str());
    failure_ = msg;
    return kExitFailure;
  }
  bool passed() const {
    return failure_.empty() && total_wrong_ == 0 && distinct_lost_.empty() && total_restore_errors_ == 0;
  }

  std::vector<std::string> WorkerArgv(uint32_t round, bool serve) {
    std::vector<std::string> v = {exe_, "crashtest", "--worker", "--dir", a_.dir, "--incarnation", std::to_string(round),
                                  "--seed", std::to_string(a_.seed), "--writers", std::to_string(a_.writers),
                                  "--dram", std::to_string(dram_), "--ssd", std::to_string(ssd_),
                                  "--ssd-admission", a_.admission, "--session-budget", std::to_string(budget_)};
    if (serve) v.insert(v.end(), {"--connect", "unix:" + SocketPath()});
    return v;
  }
  std::string SocketPath() const { return a_.dir + "/flatkv.sock"; }
  uint32_t RunMs() { return a_.min_ms + rng_() % (a_.max_ms - a_.min_ms + 1); }

  // Runs one worker until it is stopped (SIGTERM when `clean`, else
  // SIGKILL); fills round->stop and ran_ms. With `daemon`, the daemon is
  // what gets killed (or stopped) first.
  int RunWorkerRound(uint32_t round, bool clean, Round* r, Child* daemon) {
    auto w = Spawn(WorkerArgv(round, daemon != nullptr), true, a_.dir + "/worker.log");
    if (!w.ok()) return Fail(w.status().ToString());
    Child worker = *w;
    const auto start = Clock::now();
    // One round in eight (store target) kills the worker whenever it is,
    // perhaps still opening (recovering) the store.
    const bool early = !daemon && !clean && rng_() % 8 == 0;
    if (!early && !WaitReady(worker)) {
      const int st = WaitExit(worker.pid, std::chrono::seconds(1));
      worker.pid = st >= 0 ? -1 : worker.pid;
      Reap(&worker);
      return Fail("round " + std::to_string(round) + ": the worker never became ready (it " + DescribeExit(st) +
                  "); see " + a_.dir + "/worker.log");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(RunMs()));
    r->ran_ms = Ms(Clock::now() - start);
    const pid_t victim = daemon ? daemon->pid : worker.pid;
    // An exit before the kill is a failure (the worker or daemon gave up).
    int early_status = 0;
    if (::waitpid(victim, &early_status, WNOHANG) == victim) {
      if (daemon) daemon->pid = -1; else worker.pid = -1;
      Reap(&worker);
      return Fail("round " + std::to_string(round) + ": the " + (daemon ? "daemon" : "worker") + " " +
                  DescribeExit(early_status) + " before it was stopped; see " + a_.dir +
                  (daemon ? "/serve.log" : "/worker.log"));
    }
    // With the daemon as the victim, the worker must still be running too: a
    // worker that gave up (its threads could not connect) checked nothing.
    if (daemon && ::waitpid(worker.pid, &early_status, WNOHANG) == worker.pid) {
      worker.pid = -1;
      Reap(&worker);
      return Fail("round " + std::to_string(round) + ": the worker " + DescribeExit(early_status) +
                  " before the daemon was stopped; see " + a_.dir + "/worker.log");
    }
    r->stop = clean ? "SIGTERM" : early ? "SIGKILL early" : "SIGKILL";
    ::kill(victim, clean ? SIGTERM : SIGKILL);
    const int st = WaitExit(victim, kExitTimeout);
    if (daemon) daemon->pid = st >= 0 ? -1 : daemon->pid; else worker.pid = st >= 0 ? -1 : worker.pid;
    Reap(&worker);  // the daemon's worker has nothing left to talk to
    if (clean && !(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      return Fail("round " + std::to_string(round) + ": after SIGTERM the " + (daemon ? "daemon" : "worker") + " " +
                  DescribeExit(st) + " (a clean stop must exit 0); see " + a_.dir + (daemon ? "/serve.log" : "/worker.log"));
    }
    if (!clean && st < 0) return Fail("round " + std::to_string(round) + ": SIGKILL did not end the process");
    return kExitOk;
  }

  // Reads the log and checks every logged block through `target`.
  Status Check(Target& target, Round* r) {
    uint64_t ignored = 0;
    FLATKV_ASSIGN_OR_RETURN(auto log, ExpectedLog::ReadAll(log_path_, &ignored));
    const LogSummary s = Summarize(log);
    r->log_records = log.size();
    r->log_ignored_bytes = ignored;
    r->puts = s.puts, r->drops = s.drops, r->reuses = s.reuses, r->wrong_in_worker = s.wrong_in_worker;
    // A block that was not required and already missing in an earlier
    // round (a dropped session's) is not looked up again: each is a
    // restore of its own, and they pile up over a long run.
    std::vector<BlockExpectation> want = Expectations(log, contract_);
    r->skipped_gone = std::erase_if(want, [&](const BlockExpectation& e) { return !e.required && gone_.count(e.key); });
    r->v = Verify(target, want);
    gone_.insert(r->v.allowed_miss_keys.begin(), r->v.allowed_miss_keys.end());
    for (const BlockKey& k : r->v.lost_keys) r->new_lost += distinct_lost_.insert(k).second;
    total_wrong_ += r->v.wrong + (s.wrong_in_worker - prev_wrong_in_worker_);
    prev_wrong_in_worker_ = s.wrong_in_worker;
    total_restore_errors_ += r->v.restore_errors;
    live_ = s.live_sessions;
    return Status::Ok();
  }

  // Drops the sessions of rounds older than kKeepRounds (drop logged first).
  Status CollectOld(Target& target, uint32_t round, Round* r) {
    FLATKV_ASSIGN_OR_RETURN(ExpectedLog log, ExpectedLog::Open(log_path_));
    for (uint64_t id : live_) {
      if (SessionIncarnation(id) + kKeepRounds > round) continue;
      FLATKV_RETURN_IF_ERROR(log.Append(std::vector<Record>{{RecordType::kDrop, id, {}, 0}}));
      // NotFound: none of its blocks is left (all of them lost, or shared
      // blocks another session's drop freed).
      Status st = target.Drop(id);
      if (!st.ok() && st.code() != Code::kNotFound) return st.WithContext("dropping old session " + std::to_string(id));
      ++r->gc_dropped;
    }
    return Status::Ok();
  }

  int RunStore() {
    const StoreOptions so = MakeStoreOptions(a_.dir, dram_, ssd_, contract_.admission);
    for (uint32_t i = 0; i < a_.kills; ++i) {
      const uint32_t round = first_round_ + i;
      Round r;
      r.index = round;
      if (int rc = RunWorkerRound(round, i % 4 == 2, &r, nullptr); rc != kExitOk) return rc;
      const auto t0 = Clock::now();
      auto store = Store::Open(so);
      if (!store.ok()) return Fail("round " + std::to_string(round) + ": reopening the store after " + r.stop + ": " +
                                   store.status().ToString());
      r.restart_ms = Ms(Clock::now() - t0);
      StoreTarget target(store->get());
      Status st = Check(target, &r);
      if (st.ok()) st = CollectOld(target, round, &r);
      if (st.ok()) st = (*store)->Close();
      if (!st.ok()) return Fail("round " + std::to_string(round) + ": " + st.ToString());
      Print(r);
    }
    return kExitOk;
  }

  // The daemon's config: the store target's options (MakeStoreOptions), every
  // [store] knob written from them, so both targets run the same store.
  Status WriteServeConfig(const std::string& path) {
    service::ServerConfig c;
    c.store = MakeStoreOptions(a_.dir, dram_, ssd_, contract_.admission);
    const KvShape& sh = c.store.shape;
    std::ofstream f(path);
    f << "# written by flatkv crashtest\n[store]\n"
      << "shape = { kind = \"mha\", layers = " << sh.layers << ", kv_heads = " << sh.kv_heads
      << ", head_dim = " << sh.head_dim << ", dtype = \"" << DTypeName(sh.dtype) << "\" }\n"
      << "dram_bytes = " << c.store.dram_capacity_bytes << "\nssd_dir = \"" << c.store.ssd_dirs.at(0)
      << "\"\nssd_bytes = " << c.store.ssd_capacity_bytes << "\n";
    for (const auto& k : service::StoreKnobs()) f << k.key << " = " << service::StoreKnobValue(k.key, c) << "\n";
    f << "[listen]\nunix = \"" << SocketPath() << "\"\ntcp = \"\"\nhttp = \"\"\n";
    f.close();
    if (!f) return Status::IoError("writing " + path);
    return Status::Ok();
  }

  // Starts the daemon and waits until it answers; `*restart_ms` the time it took.
  Result<Child> StartDaemon(double* restart_ms) {
    std::error_code ec;
    std::filesystem::remove(SocketPath(), ec);
    const auto t0 = Clock::now();
    FLATKV_ASSIGN_OR_RETURN(Child d, Spawn({exe_, "serve", "--config", a_.dir + "/serve.toml"}, false, a_.dir + "/serve.log"));
    while (Clock::now() - t0 < kReadyTimeout) {
      int status = 0;
      if (::waitpid(d.pid, &status, WNOHANG) == d.pid) {
        return Status::Aborted("flatkv serve " + DescribeExit(status) + " while starting; see " + a_.dir + "/serve.log");
      }
      if (std::filesystem::exists(SocketPath(), ec)) {
        auto c = ConnectClientTarget("unix:" + SocketPath());
        if (c.ok()) {
          *restart_ms = Ms(Clock::now() - t0);
          return d;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Reap(&d);
    return Status::Aborted("flatkv serve did not answer within " + std::to_string(kReadyTimeout.count()) + " s; see " +
                           a_.dir + "/serve.log");
  }

  int RunServe() {
    if (Status st = WriteServeConfig(a_.dir + "/serve.toml"); !st.ok()) return Fail(st.ToString());
    double ms = 0;
    auto d = StartDaemon(&ms);
    if (!d.ok()) return Fail(d.status().ToString());
    Child daemon = *d;
    for (uint32_t i = 0; i < a_.kills; ++i) {
      const uint32_t round = first_round_ + i;
      Round r;
      r.index = round;
      if (int rc = RunWorkerRound(round, i % 4 == 2, &r, &daemon); rc != kExitOk) {
        Reap(&daemon);
        return rc;
      }
      auto next = StartDaemon(&r.restart_ms);
      if (!next.ok()) return Fail("round " + std::to_string(round) + ": restarting after " + r.stop + ": " + next.status().ToString());
      daemon = *next;
      auto target = ConnectClientTarget("unix:" + SocketPath());
      Status st = target.ok() ? Check(**target, &r) : target.status();
      if (!st.ok()) {
        Reap(&daemon);
        return Fail("round " + std::to_string(round) + ": " + st.ToString());
      }
      Print(r);
    }
    ::kill(daemon.pid, SIGTERM);
    const int st = WaitExit(daemon.pid, kExitTimeout);
    if (st >= 0) daemon.pid = -1;
    Reap(&daemon);
    if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      return Fail("the final SIGTERM: flatkv serve " + DescribeExit(st) + "; see " + a_.dir + "/serve.log");
    }
    return kExitOk;
  }

  static nlohmann::json ToJson(const Round& r) {
    return {{"round", r.index}, {"stop", r.stop}, {"ran_ms", r.ran_ms}, {"restart_ms", r.restart_ms},
            {"log_records", r.log_records}, {"log_ignored_bytes", r.log_ignored_bytes}, {"acked_puts", r.puts},
            {"drops", r.drops}, {"reuses", r.reuses}, {"checked", r.v.checked}, {"required", r.v.required},
            {"served_ok", r.v.served_ok}, {"wrong", r.v.wrong}, {"wrong_in_worker", r.wrong_in_worker},
            {"lost", r.v.lost}, {"new_lost", r.new_lost}, {"allowed_misses", r.v.allowed_misses},
            {"restore_errors", r.v.restore_errors}, {"skipped_gone", r.skipped_gone}, {"gc_dropped_sessions", r.gc_dropped}, {"examples", r.v.examples}};
  }

  void Print(const Round& r) {
    rounds_.push_back(r);
    if (a_.json) return;
    std::printf("round %4u %-13s after %6.0f ms, restart %5.0f ms: %6llu blocks checked (%6llu required): "
                "ok %6llu, wrong %llu, lost %llu (new %llu), allowed misses %llu%s\n",
                r.index, r.stop.c_str(), r.ran_ms, r.restart_ms, (unsigned long long)r.v.checked,
                (unsigned long long)r.v.required, (unsigned long long)r.v.served_ok, (unsigned long long)r.v.wrong,
                (unsigned long long)r.v.lost, (unsigned long long)r.new_lost, (unsigned long long)r.v.allowed_misses,
                r.wrong_in_worker ? " WRONG BYTES SEEN BY THE WORKER" : "");
    for (size_t i = 0; i < std::min<size_t>(3, r.v.examples.size()); ++i) std::printf("    %s\n", r.v.examples[i].c_str());
    std::fflush(stdout);
  }

  void Report() {
    uint64_t checked = 0, rounds_with_loss = 0, max_lost = 0, errors = 0;
    for (const Round& r : rounds_) {
      checked += r.v.checked;
      rounds_with_loss += r.v.lost > 0;
      max_lost = std::max(max_lost, r.v.lost);
      errors += r.v.restore_errors;
    }
    const uint64_t final_lost = rounds_.empty() ? 0 : rounds_.back().v.lost;
    if (a_.json) {
      nlohmann::json j;
      j["target"] = a_.target;
      j["dir"] = a_.dir;
      j["seed"] = a_.seed;
      j["writers"] = a_.writers;
      j["dram_bytes"] = dram_;
      j["ssd_bytes"] = ssd_;
      j["contract"] = {{"ssd_admission", a_.admission}, {"shared_refcount", a_.shared_refcount}};
      j["rounds"] = nlohmann::json::array();
      for (const Round& r : rounds_) j["rounds"].push_back(ToJson(r));
      j["totals"] = {{"rounds", rounds_.size()}, {"blocks_checked", checked}, {"wrong", total_wrong_},
                     {"rounds_with_loss", rounds_with_loss}, {"distinct_lost", distinct_lost_.size()}, {"max_lost", max_lost}, {"final_lost", final_lost},
                     {"restore_errors", errors}};
      j["failure"] = failure_;
      j["passed"] = passed();
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("total: %zu rounds, %llu block checks, wrong %llu, %zu distinct blocks lost (in %llu rounds, at most %llu in one, %llu at the end), "
                  "restore errors %llu: %s\n",
                  rounds_.size(), (unsigned long long)checked, (unsigned long long)total_wrong_,
                  distinct_lost_.size(), (unsigned long long)rounds_with_loss, (unsigned long long)max_lost, (unsigned long long)final_lost,
                  (unsigned long long)errors, passed() ? "PASSED" : "FAILED");
    }
    std::fflush(stdout);
  }

  const CrashtestArgs& a_;
  const uint64_t dram_, ssd_;
  const Contract contract_;
  std::mt19937_64 rng_;
  const std::string exe_;
  std::string log_path_;
  uint32_t first_round_ = 0;
  uint32_t budget_ = 1;
  std::vector<uint64_t> live_;
  std::vector<Round> rounds_;
  std::unordered_set<BlockKey, BlockKeyHash> distinct_lost_;  // every block found lost in some round
  std::unordered_set<BlockKey, BlockKeyHash> gone_;  // not required, and a miss in an earlier round
  uint64_t prev_wrong_in_worker_ = 0, total_wrong_ = 0, total_restore_errors_ = 0;
  std::string failure_;
};

int RunChecked(const CrashtestArgs& a) {
  if (a.dir.empty()) return Usage("--dir is required");
  auto dram = service::ParseByteSize(a.dram);
  if (!dram.ok()) return Usage("--dram: " + dram.status().ToString());
  auto ssd = service::ParseByteSize(a.ssd);
  if (!ssd.ok()) return Usage("--ssd: " + ssd.status().ToString());
  if (*ssd < 4 * kSegmentBytes) return Usage("--ssd " + a.ssd + ": at least " + std::to_string(4 * kSegmentBytes) + " bytes");
  auto parsed = ParseSsdAdmission(a.admission);  // the daemon's config spells it the same way
  if (!parsed.ok()) return Usage("--ssd-admission: " + parsed.status().message());
  const SsdAdmission adm = *parsed;
  if (a.worker) {
    WorkerOptions w;
    w.dir = a.dir, w.connect = a.connect, w.incarnation = a.incarnation, w.seed = a.seed, w.writers = a.writers;
    w.dram_bytes = *dram, w.ssd_bytes = *ssd, w.admission = adm, w.session_budget = a.session_budget;
    w.drops = !a.no_drops, w.reopen = !a.no_reopen;
    return RunWorker(w);
  }
  if (a.faults) {
    if (a.target != "store") return Usage("--faults runs against --target store only");
    return RunFaultPass(a.dir, a.seed, a.json);
  }
  if (a.target != "store" && a.target != "serve") return Usage("--target '" + a.target + "': expected store or serve");
  if (a.writers < 1 || a.writers > 64) return Usage("--writers " + std::to_string(a.writers) + ": expected 1..64");
  if (a.min_ms > a.max_ms) return Usage("--min-ms is above --max-ms");
  Driver d(a, *dram, *ssd, adm);
  return d.Run();
}

}  // namespace

CLI::App* AddCrashtestCommand(CLI::App& app, CrashtestArgs& a) {
  CLI::App* cmd = app.add_subcommand("crashtest", "Kill -9 a store or daemon at random times and check every acknowledged block (docs/crashtest.md)");
  cmd->add_option("--target", a.target, "store (a directory opened in a worker process) or serve (a flatkv serve daemon)");
  cmd->add_option("--dir", a.dir, "Directory of the run (store, expected-state log, logs); an earlier run there is continued");
  cmd->add_option("--kills", a.kills, "Rounds (each ends in SIGKILL, every fourth in SIGTERM)");
  cmd->add_option("--seed", a.seed, "Seed of the workload and of the kill times");
  cmd->add_option("--writers", a.writers, "Worker threads");
  cmd->add_option("--dram", a.dram, "DRAM tier bytes, e.g. 64MiB (0 disables the tier)");
  cmd->add_option("--ssd", a.ssd, "SSD capacity bytes, e.g. 512MiB");
  cmd->add_option("--ssd-admission", a.admission, "all (every acknowledged block must survive) or on-reuse");
  cmd->add_flag("--shared-refcount", a.shared_refcount,
                "Also require blocks a dropped session shared with a live one (reference-counted stores)");
  cmd->add_option("--min-ms", a.min_ms, "Shortest time a worker runs before it is stopped");
  cmd->add_option("--max-ms", a.max_ms, "Longest time a worker runs before it is stopped");
  cmd->add_flag("--faults", a.faults, "Run the fault-injection pass instead (EIO, ENOSPC, torn and lost writes)");
  cmd->add_flag("--json", a.json, "Print the figures as JSON");
  // The worker mode the driver starts; not for people.
  cmd->add_flag("--worker", a.worker)->group("");
  cmd->add_option("--incarnation", a.incarnation)->group("");
  cmd->add_option("--session-budget", a.session_budget)->group("");
  cmd->add_option("--connect", a.connect)->group("");
  cmd->add_flag("--no-drops", a.no_drops)->group("");
  cmd->add_flag("--no-reopen", a.no_reopen)->group("");
  return cmd;
}

int RunCrashtest(const CrashtestArgs& args) { return RunCatching("crashtest", [&] { return RunChecked(args); }); }

}  // namespace flatkv::tools
