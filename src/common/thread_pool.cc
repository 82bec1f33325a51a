#include "common/thread_pool.h"

namespace flatkv {

ThreadPool::ThreadPool(int threads) {
  const int n = threads < 1 ? 1 : threads;
  workers_.reserve(n - 1);
  for (int t = 1; t < n; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (auto& w : workers_) w.join();
}

int ThreadPool::HardwareThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::RunTasks(int thread) {
  for (;;) {
    const int task = next_.fetch_add(1, std::memory_order_relaxed);
    if (task >= tasks_) return;
    (*fn_)(task, thread);
  }
}

void ThreadPool::ParallelFor(int tasks, const Fn& fn) {
  if (tasks <= 0) return;
  if (workers_.empty() || tasks == 1) {
    for (int t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
  MutexLock call(&call_mu_);
  {
    MutexLock l(&mu_);
    fn_ = &fn;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.SignalAll();
  RunTasks(0);
  MutexLock l(&mu_);
  while (busy_ > 0) done_cv_.Wait(&mu_);
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    {
      MutexLock l(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
    }
    RunTasks(thread);
    MutexLock l(&mu_);
    if (--busy_ == 0) done_cv_.Signal();
  }
}

}  // namespace flatkv
