// Several threads submitting to one engine at once. Also built into the
// ThreadSanitizer binary (files ending in concurrency_test.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "io/fault_injection.h"
#include "io/io_engine.h"
#include "io/io_test_helpers.h"
#include "io/posix_file.h"

namespace flatkv::io {
namespace {

using test::AlignedBuf;
using test::FillPattern;
using test::FirstMismatch;
using test::MakeRequest;

constexpr int kThreads = 4;
constexpr int kPerThread = 48;
constexpr uint64_t kSize = 16 * 1024;

// One request's slot: its buffer and what its callback saw.
struct Slot {
  explicit Slot(uint64_t len) : buf(len) {}
  AlignedBuf buf;
  Status status;
  std::atomic<int> calls{0};
};

class IoConcurrencyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // A small queue depth, so that io_uring requests also wait in its queue.
    engine_ = test::MakeEngineByName(GetParam(), /*queue_depth=*/4, /*threads=*/3);
    if (engine_ == nullptr) GTEST_SKIP() << "io_uring is refused on this machine";
    Result<File> file = File::Open(dir_.Sub("data"), /*create=*/true, /*want_direct=*/true);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    file_ = std::move(file).value();
    for (int i = 0; i < kThreads * kPerThread; ++i) slots_.push_back(std::make_unique<Slot>(kSize));
  }

  // kThreads threads each submit `op` for their kPerThread slots through
  // `engine`, while one more thread polls outstanding(); returns when every
  // callback has run.
  void SubmitFromAllThreads(IoEngine* engine, Op op) {
    std::latch all_done(kThreads * kPerThread);
    std::atomic<bool> stop{false};
    std::thread poller([&] {
      while (!stop.load()) (void)engine->outstanding();
    });
    std::vector<std::thread> submitters;
    for (int t = 0; t < kThreads; ++t) {
      submitters.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          const int i = t * kPerThread + k;
          Slot* slot = slots_[i].get();
          Request req = MakeRequest(op, file_.fd(), i * kSize, slot->buf.data(), kSize);
          req.done = [slot, &all_done](Status st) {
            slot->status = std::move(st);
            slot->calls.fetch_add(1);
            all_done.count_down();
          };
          engine->Submit(std::move(req));
        }
      });
    }
    for (std::thread& s : submitters) s.join();
    all_done.wait();
    stop = true;
    poller.join();
  }

  ::flatkv::testing::TempDir dir_;
  std::unique_ptr<IoEngine> engine_;
  File file_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

TEST_P(IoConcurrencyTest, ConcurrentWritersThenReadersSeeTheirOwnData) {
  for (size_t i = 0; i < slots_.size(); ++i) FillPattern(slots_[i]->buf, i);
  SubmitFromAllThreads(engine_.get(), Op::kWrite);
  for (size_t i = 0; i < slots_.size(); ++i) {
    ASSERT_EQ(slots_[i]->calls.exchange(0), 1) << i;
    ASSERT_TRUE(slots_[i]->status.ok()) << slots_[i]->status.ToString();
    FillPattern(slots_[i]->buf, 1000 + i);  // anything but the expected bytes
  }
  SubmitFromAllThreads(engine_.get(), Op::kRead);
  for (size_t i = 0; i < slots_.size(); ++i) {
    ASSERT_EQ(slots_[i]->calls.load(), 1) << i;
    ASSERT_TRUE(slots_[i]->status.ok()) << slots_[i]->status.ToString();
    ASSERT_EQ(FirstMismatch(slots_[i]->buf.data(), kSize, i), -1) << "slot " << i;
  }
}

TEST_P(IoConcurrencyTest, FaultEngineUnderConcurrentGateAndRuleChanges) {
  for (size_t i = 0; i < slots_.size(); ++i) FillPattern(slots_[i]->buf, i);
  SubmitFromAllThreads(engine_.get(), Op::kWrite);

  std::shared_ptr<IoEngine> base = std::move(engine_);
  auto fault = std::make_unique<FaultInjectionEngine>(base);
  std::atomic<bool> stop{false};
  std::thread meddler([&] {
    for (int round = 0; !stop.load(); ++round) {
      fault->CloseGate();
      FaultRule rule;
      rule.fault = round % 2 == 0 ? Fault::kError : Fault::kShortRead;
      rule.op = Op::kRead;
      rule.skip = round % 3;
      rule.count = 2;
      fault->AddRule(rule);
      std::this_thread::yield();
      (void)fault->held();
      fault->OpenGate();
      if (round % 4 == 3) fault->ClearRules();
    }
  });
  for (auto& slot : slots_) slot->calls = 0;
  SubmitFromAllThreads(fault.get(), Op::kRead);
  stop = true;
  meddler.join();

  uint64_t failed = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    ASSERT_EQ(slots_[i]->calls.load(), 1) << i;
    if (!slots_[i]->status.ok()) {
      ++failed;
      EXPECT_EQ(slots_[i]->status.code(), Code::kIoError) << slots_[i]->status.ToString();
    } else {
      EXPECT_EQ(FirstMismatch(slots_[i]->buf.data(), kSize, i), -1) << "slot " << i << " is Ok with wrong data";
    }
  }
  EXPECT_EQ(fault->faults_fired(), failed);
}

INSTANTIATE_TEST_SUITE_P(Engines, IoConcurrencyTest, ::testing::Values("io_uring", "threadpool"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "io_uring" ? std::string("Uring") : std::string("ThreadPool");
                         });

}  // namespace
}  // namespace flatkv::io
