// ThreadPool under concurrent use (built alone for ThreadSanitizer too):
// every task runs exactly once per ParallelFor, on a valid thread index,
// with the caller's writes before the call visible to the tasks and the
// tasks' writes visible to the caller after it; concurrent callers
// serialise; a pool of one runs everything on the caller.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace flatkv {
namespace {

TEST(ThreadPoolTest, EveryTaskRunsOnceAndWritesAreVisible) {
  ThreadPool pool(4);
  ASSERT_EQ(pool.threads(), 4);
  for (int round = 0; round < 200; ++round) {
    const int tasks = 1 + round % 37;
    std::vector<int> in(tasks), out(tasks, -1), thread_of(tasks, -1);
    for (int t = 0; t < tasks; ++t) in[t] = round * 1000 + t;  // plain writes before the call
    std::vector<std::atomic<int>> runs(tasks);
    pool.ParallelFor(tasks, [&](int task, int thread) {
      runs[task].fetch_add(1, std::memory_order_relaxed);
      out[task] = in[task] * 2;  // plain writes, read after the call
      thread_of[task] = thread;
    });
    for (int t = 0; t < tasks; ++t) {
      ASSERT_EQ(runs[t].load(), 1) << "round " << round << " task " << t;
      ASSERT_EQ(out[t], in[t] * 2) << "round " << round << " task " << t;
      ASSERT_GE(thread_of[t], 0);
      ASSERT_LT(thread_of[t], 4);
    }
  }
}

TEST(ThreadPoolTest, ConcurrentCallersSerialise) {
  ThreadPool pool(3);
  std::atomic<long> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        std::vector<int> slot(16, 0);
        pool.ParallelFor(16, [&](int task, int) {
          slot[task] += task;
          total.fetch_add(1, std::memory_order_relaxed);
        });
        for (int t = 0; t < 16; ++t) ASSERT_EQ(slot[t], t);
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 50 * 16);
}

TEST(ThreadPoolTest, OneThreadRunsOnTheCaller) {
  ThreadPool pool(0);  // < 1 means 1
  EXPECT_EQ(pool.threads(), 1);
  const std::thread::id me = std::this_thread::get_id();
  int ran = 0;
  pool.ParallelFor(5, [&](int, int thread) {
    EXPECT_EQ(thread, 0);
    EXPECT_EQ(std::this_thread::get_id(), me);
    ++ran;
  });
  EXPECT_EQ(ran, 5);
  pool.ParallelFor(0, [&](int, int) { ++ran; });
  EXPECT_EQ(ran, 5);
}

}  // namespace
}  // namespace flatkv
