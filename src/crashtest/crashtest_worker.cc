#include "crashtest/crashtest_worker.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "flatkv/store.h"
#include "crashtest/crashtest_state.h"
#include "crashtest/crashtest_target.h"
#include "tools/tool_common.h"

namespace flatkv::tools::crashtest {
namespace {

// A worker left behind by a driver that died exits after this long.
constexpr auto kMaxWorkerLife = std::chrono::minutes(10);

struct Session {
  uint64_t id = 0;
  uint32_t owner = 0;   // thread
  uint32_t prefix = 0;  // leading blocks shared with another chain
  std::vector<BlockKey> keys;  // logged (acknowledged) blocks only
  bool dropped = false;
};

class Worker {
 public:
  explicit Worker(const WorkerOptions& o, ExpectedLog log) : o_(o), log_(std::move(log)) {}

  int Run() {
    if (o_.connect.empty()) {
      auto s = Store::Open(MakeStoreOptions(o_.dir, o_.dram_bytes, o_.ssd_bytes, o_.admission));
      if (!s.ok()) return Fail("opening the store in " + o_.dir + "/store: " + s.status().ToString());
      store_ = std::move(s).value();
      store_target_ = std::make_unique<StoreTarget>(store_.get());
    }
    std::vector<std::thread> threads;
    for (uint32_t t = 0; t < o_.writers; ++t) threads.emplace_back([this, t] { Loop(t); });
    std::printf("ready\n");
    std::fflush(stdout);
    const bool clean = WaitForStop();
    stop_ = true;
    for (auto& th : threads) th.join();
    if (!failure_.empty()) return Fail(failure_);
    if (!clean) return Fail("the driver went away (or " + std::to_string(kMaxWorkerLife.count()) + " minutes passed)");
    if (store_) {
      Status st = store_->Close();
      if (!st.ok()) return Fail("clean Close after SIGTERM: " + st.ToString());
    }
    std::fprintf(stderr, "crashtest worker %u: stopped cleanly (%llu puts, %llu restores, %llu put errors)\n",
                 o_.incarnation, (unsigned long long)puts_.load(), (unsigned long long)restores_.load(),
                 (unsigned long long)put_errors_.load());
    return kExitOk;
  }

 private:
  int Fail(const std::string& msg) {
    std::fprintf(stderr, "crashtest worker %u: %s\n", o_.incarnation, msg.c_str());
    return kExitFailure;
  }

  // True on SIGTERM; false when the driver died or the worker outlived its bound.
  bool WaitForStop() {
    const pid_t parent = ::getppid();
    const auto start = std::chrono::steady_clock::now();
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    const timespec tick{0, 100 * 1000 * 1000};
    while (std::chrono::steady_clock::now() - start < kMaxWorkerLife) {
      if (::sigtimedwait(&set, nullptr, &tick) == SIGTERM) return true;
      if (::getppid() != parent) return false;
      if (failed_) return true;  // a thread failed fatally: Run reports it
    }
    return false;
  }

  void SetFailure(const std::string& msg) {
    std::lock_guard lock(reg_mu_);
    if (failure_.empty()) failure_ = msg;
    failed_ = true;
    stop_ = true;
  }

  void Log(const std::vector<Record>& records) {
    Status st = log_.Append(records);
    if (!st.ok()) SetFailure(st.ToString());
  }

  void Loop(uint32_t t) {
    std::mt19937_64 rng(o_.seed * 0x9E3779B97F4A7C15ull + o_.incarnation * 1000003ull + t);
    std::unique_ptr<Target> client;
    if (!o_.connect.empty()) {
      auto c = ConnectClientTarget(o_.connect);
      if (!c.ok()) {  // the driver saw the daemon answer before starting us: a real failure
        return SetFailure("thread " + std::to_string(t) + ": connecting to " + o_.connect + ": " + c.status().ToString());
      }
      client = std::move(c).value();
    }
    std::vector<std::shared_ptr<Session>> own;
    uint32_t counter = 0;
    while (!stop_) {
      if (pausing_) {  // thread 0 waits to close and reopen the store
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      std::shared_lock store_lock(store_mu_, std::defer_lock);
      if (store_) store_lock.lock();
      Target& target = client ? *client : *store_target_;
      const uint32_t r = rng() % 100;
      Status st;
      if (r < 35 && !own.empty()) {
        st = Grow(target, *own[rng() % own.size()], rng);
      } else if (r < 55 && created_.fetch_add(1) < o_.session_budget) {
        st = NewSession(target, t, counter++, rng, &own);
      } else if (r < 93 || own.empty()) {
        Restore(target, t, own, rng);
      } else if (r < 98 && store_ && o_.drops && own.size() > 1) {
        const size_t i = rng() % own.size();
        st = DropSession(target, *own[i]);
        own.erase(own.begin() + i);
      } else if (t == 0 && store_ && o_.reopen && rng() % 8 == 0) {
        store_lock.unlock();
        Reopen();
      }
      if (!st.ok() && client) return;  // the daemon is gone: its Client is broken for good
    }
  }

  Status Grow(Target& target, Session& s, std::mt19937_64& rng) {
    std::vector<BlockKey> have;
    {
      std::lock_guard lock(reg_mu_);
      have = s.keys;
    }
    if (have.size() >= kMaxSessionBlocks) return Status::Ok();
    const uint32_t n = std::min<uint32_t>(1 + rng() % 3, kMaxSessionBlocks - have.size());
    std::vector<BlockKey> full = ContinueChain(have, s.id, have.size(), n);
    std::span<const BlockKey> fresh(full.data() + have.size(), n);
    const uint64_t bb = target.BlockBytes();
    Status st = target.Put(s.id, fresh, Payloads(fresh, bb), static_cast<uint32_t>(have.size()));
    if (!st.ok()) return PutFailed(st);
    std::vector<Record> recs;
    for (uint32_t i = 0; i < n; ++i) recs.push_back({RecordType::kPut, s.id, fresh[i], (have.size() + i) | kOwnBit});
    Log(recs);
    ++puts_;
    std::lock_guard lock(reg_mu_);
    s.keys = std::move(full);
    return Status::Ok();
  }

  Status NewSession(Target& target, uint32_t t, uint32_t n, std::mt19937_64& rng,
                    std::vector<std::shared_ptr<Session>>* own) {
    auto s = std::make_shared<Session>();
    s->id = MakeSession(o_.incarnation, t, n);
    s->owner = t;
    std::vector<BlockKey> prefix;
    {
      std::lock_guard lock(reg_mu_);
      std::vector<const Session*> live;
      for (const auto& x : sessions_)
        if (!x->dropped && !x->keys.empty()) live.push_back(x.get());
      if (!live.empty() && rng() % 2) {  // fork from another session's prefix, as an agent or a chat branch does
        const Session* from = live[rng() % live.size()];
        prefix.assign(from->keys.begin(), from->keys.begin() + 1 + rng() % from->keys.size());
      }
    }
    if (prefix.empty()) {
      const uint32_t p = rng() % kSystemPrompts;
      prefix = ContinueChain({}, kSystemPromptChain + p, 0, 1 + p);
    }
    if (prefix.size() >= kMaxSessionBlocks) prefix.resize(kMaxSessionBlocks - 1);
    s->prefix = static_cast<uint32_t>(prefix.size());
    const uint32_t mine = std::min<uint32_t>(1 + rng() % 3, kMaxSessionBlocks - s->prefix);
    std::vector<BlockKey> keys = ContinueChain(prefix, s->id, s->prefix, mine);
    Status st = target.Put(s->id, keys, Payloads(keys, target.BlockBytes()), 0);
    if (!st.ok()) return PutFailed(st);
    std::vector<Record> recs;
    for (size_t i = 0; i < keys.size(); ++i)
      recs.push_back({RecordType::kPut, s->id, keys[i], i < s->prefix ? uint64_t(i) : (i | kOwnBit)});
    Log(recs);
    ++puts_;
    s->keys = std::move(keys);
    std::lock_guard lock(reg_mu_);
    sessions_.push_back(s);
    own->push_back(s);
    return Status::Ok();
  }

  Status PutFailed(const Status& st) {
    if (put_errors_.fetch_add(1) < 3) std::fprintf(stderr, "crashtest worker %u: put failed: %s\n", o_.incarnation, st.ToString().c_str());
    return st;
  }

  void Restore(Target& target, uint32_t t, const std::vector<std::shared_ptr<Session>>& own, std::mt19937_64& rng) {
    uint64_t id = 0;
    uint32_t prefix = 0;
    bool mine = false;
    std::vector<BlockKey> keys;
    {
      std::lock_guard lock(reg_mu_);
      const Session* s = nullptr;
      if (!own.empty() && rng() % 10 < 7) s = own[rng() % own.size()].get();
      else if (!sessions_.empty()) s = sessions_[rng() % sessions_.size()].get();
      if (!s) return;
      id = s->id, prefix = s->prefix, keys = s->keys, mine = s->owner == t && !s->dropped;
    }
    if (keys.empty()) return;
    std::vector<std::byte> got;
    auto r = target.Restore(keys, &got);
    if (!r.ok()) return;
    ++restores_;
    const uint64_t bb = target.BlockBytes();
    std::vector<Record> recs;
    for (uint32_t b = 0; b < *r; ++b)
      if (!PayloadMatches(keys[b], std::span(got.data() + b * bb, bb))) recs.push_back({RecordType::kWrong, id, keys[b], b});
    // The session's own blocks were hit: under on-reuse it is now reused.
    // Logged by the owning thread only, so that it orders with its puts.
    if (mine && *r > prefix) recs.push_back({RecordType::kReuse, id, {}, *r});
    if (!recs.empty()) Log(recs);
  }

  Status DropSession(Target& target, Session& s) {
    {
      std::lock_guard lock(reg_mu_);
      s.dropped = true;
    }
    Log({{RecordType::kDrop, s.id, {}, 0}});  // before the drop: a logged drop may or may not have happened
    return target.Drop(s.id);
  }

  void Reopen() {
    pausing_ = true;  // glibc's rwlock prefers readers: keep new ones out meanwhile
    std::unique_lock lock(store_mu_);
    struct Unpause {
      std::atomic<bool>* p;
      ~Unpause() { *p = false; }
    } unpause{&pausing_};
    if (stop_) return;
    Status st = store_->Close();
    store_.reset();
    if (!st.ok()) return SetFailure("clean Close before reopen: " + st.ToString());
    auto s = Store::Open(MakeStoreOptions(o_.dir, o_.dram_bytes, o_.ssd_bytes, o_.admission));
    if (!s.ok()) return SetFailure("reopening the store after a clean Close: " + s.status().ToString());
    store_ = std::move(s).value();
    store_target_->Reset(store_.get());
    ++reopens_;
  }

  const WorkerOptions o_;
  ExpectedLog log_;
  std::shared_mutex store_mu_;  // shared by operations, exclusive for Close + reopen
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreTarget> store_target_;
  std::mutex reg_mu_;
  std::vector<std::shared_ptr<Session>> sessions_;  // guarded by reg_mu_, as are Session fields
  std::string failure_;                             // guarded by reg_mu_
  std::atomic<bool> stop_{false}, failed_{false}, pausing_{false};
  std::atomic<uint32_t> created_{0};
  std::atomic<uint64_t> puts_{0}, restores_{0}, put_errors_{0}, reopens_{0};
};

}  // namespace

int RunWorker(const WorkerOptions& options) {
  // SIGTERM is taken by WaitForStop; block it before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto log = ExpectedLog::Open(options.dir + "/expected.log");
  if (!log.ok()) {
    std::fprintf(stderr, "crashtest worker: %s\n", log.status().ToString().c_str());
    return kExitFailure;
  }
  Worker w(options, std::move(log).value());
  return w.Run();
}

}  // namespace flatkv::tools::crashtest
