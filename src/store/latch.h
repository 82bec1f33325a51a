// Latch: counts down outstanding async requests and keeps the first error.
// Thread-safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <utility>

#include "common/mutex.h"
#include "flatkv/status.h"

namespace flatkv {

class Latch {
 public:
  void Add(uint64_t n = 1) {
    MutexLock lock(&mu_);
    pending_ += n;
  }
  void Done(Status s) {
    MutexLock lock(&mu_);
    if (!s.ok() && first_.ok()) first_ = std::move(s);
    if (--pending_ == 0) cv_.SignalAll();
  }
  Status Wait() {
    MutexLock lock(&mu_);
    while (pending_ != 0) cv_.Wait(&mu_);
    return first_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  uint64_t pending_ FLATKV_GUARDED_BY(mu_) = 0;
  Status first_ FLATKV_GUARDED_BY(mu_);
};

}  // namespace flatkv
