#include "store/dram_queue.h"

#include <algorithm>

namespace flatkv {

DramQueue::DramQueue(uint32_t threads) {
  for (uint32_t i = 0; i < std::max<uint32_t>(threads, 1); ++i) threads_.emplace_back([this] { Worker(); });
}

DramQueue::~DramQueue() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  for (auto& t : threads_) t.join();
}

void DramQueue::Submit(std::function<void()> job) {
  {
    MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.Signal();
}

uint64_t DramQueue::outstanding() const {
  MutexLock lock(&mu_);
  return jobs_.size() + running_;
}

void DramQueue::Worker() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(&mu_);
      while (!stop_ && jobs_.empty()) cv_.Wait(&mu_);
      if (jobs_.empty()) return;  // stop_ and drained
      job = std::move(jobs_.front());
      jobs_.pop_front();
      ++running_;
    }
    job();
    MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace flatkv
