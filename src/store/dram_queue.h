// DramQueue: the DRAM medium's own request queue and workers. DRAM hits are
// copied into restore windows here, never behind SSD requests, which have
// their own queue in the SSD IoEngine.
// Thread-safety: Submit may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace flatkv {

class DramQueue {
 public:
  explicit DramQueue(uint32_t threads);
  ~DramQueue();  // runs every queued job, then joins
  void Submit(std::function<void()> job);
  uint64_t outstanding() const;

 private:
  void Worker();
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ FLATKV_GUARDED_BY(mu_);
  uint64_t running_ FLATKV_GUARDED_BY(mu_) = 0;
  bool stop_ FLATKV_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace flatkv
