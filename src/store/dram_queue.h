// DramQueue: the DRAM medium's own request queue and workers. DRAM hits are
// copied into restore windows here, never behind SSD requests, which have
// their own queue in the SSD IoEngine.
// Thread-safety: Submit may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flatkv {

class DramQueue {
 public:
  explicit DramQueue(uint32_t threads);
  ~DramQueue();  // runs every queued job, then joins
  void Submit(std::function<void()> job);
  uint64_t outstanding() const;

 private:
  void Worker();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  uint64_t running_ = 0;                    // guarded by mu_
  bool stop_ = false;                       // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace flatkv
