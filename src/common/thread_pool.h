// ThreadPool: a small persistent pool for data-parallel loops (the
// transformer's matmuls and attention, src/model/). ParallelFor(tasks, fn)
// runs fn(task, thread) for every task in [0, tasks) on the pool's threads
// and the calling thread, and returns when all are done; `thread` in
// [0, threads()) names the thread running it (0: the caller), so callers
// can give each thread its own scratch. Which thread runs which task varies
// from call to call: callers must make each task's result depend on the
// task alone (the transformer's determinism rule, model/transformer.h).
//
// Thread-safety: one ParallelFor at a time (calls from several threads
// serialise on a mutex); fn runs concurrently on different tasks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace flatkv {

class ThreadPool {
 public:
  // threads >= 1: the caller plus threads - 1 workers (values < 1 mean 1).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  using Fn = std::function<void(int task, int thread)>;
  void ParallelFor(int tasks, const Fn& fn) FLATKV_EXCLUDES(call_mu_, mu_);

  // The machine's hardware threads (at least 1).
  static int HardwareThreads();

 private:
  void WorkerLoop(int thread) FLATKV_EXCLUDES(mu_);
  void RunTasks(int thread);

  Mutex call_mu_;  // one ParallelFor at a time
  Mutex mu_;
  CondVar work_cv_, done_cv_;
  uint64_t generation_ FLATKV_GUARDED_BY(mu_) = 0;  // bumped per ParallelFor
  int busy_ FLATKV_GUARDED_BY(mu_) = 0;             // workers still in this generation
  bool stop_ FLATKV_GUARDED_BY(mu_) = false;
  // The current loop: set under mu_ before the generation is bumped, read
  // by workers after they see the new generation (mu_ orders both).
  const Fn* fn_ = nullptr;
  int tasks_ = 0;
  std::atomic<int> next_{0};
  std::vector<std::thread> workers_;
};

}  // namespace flatkv
