#include "io/fault_injection.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "io/io_test_helpers.h"
#include "io/posix_file.h"

namespace flatkv::io {
namespace {

using test::AlignedBuf;
using test::FillPattern;
using test::FirstMismatch;
using test::MakeRequest;
using test::PatternByte;

constexpr uint64_t kFileBytes = 64 * 1024;
constexpr uint64_t kOldSeed = 1;
constexpr uint64_t kNewSeed = 2;

// A FaultInjectionEngine over each real engine (GetParam() names the base),
// on a file that starts out holding pattern kOldSeed.
class FaultInjectionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    base_ = test::MakeEngineByName(GetParam());
    if (base_ == nullptr) GTEST_SKIP() << "io_uring is refused on this machine";
    engine_ = std::make_unique<FaultInjectionEngine>(base_);
    Result<File> file = File::Open(dir_.Sub("data"), /*create=*/true, /*want_direct=*/true);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    file_ = std::move(file).value();
    AlignedBuf old(kFileBytes);
    FillPattern(old, kOldSeed);
    ASSERT_TRUE(Run(Op::kWrite, 0, old).ok());
  }

  Status Run(Op op, uint64_t offset, AlignedBuf& buf) {
    return engine_->Execute(MakeRequest(op, file_.fd(), offset, buf.data(), buf.size()));
  }
  Status Read(AlignedBuf& buf) { return Run(Op::kRead, 0, buf); }
  Status Sync() { return engine_->Execute(MakeRequest(Op::kSync, file_.fd(), 0, nullptr, 0)); }
  // The whole file as it is on disk, read past the fault engine.
  AlignedBuf ReadBack() {
    AlignedBuf buf(kFileBytes);
    Status st = base_->Execute(MakeRequest(Op::kRead, file_.fd(), 0, buf.data(), buf.size()));
    EXPECT_TRUE(st.ok()) << st.ToString();
    return buf;
  }
  static FaultRule Rule(Fault fault, Op op) {
    FaultRule rule;
    rule.fault = fault;
    rule.op = op;
    return rule;
  }

  ::flatkv::testing::TempDir dir_;
  std::shared_ptr<IoEngine> base_;
  std::unique_ptr<FaultInjectionEngine> engine_;
  File file_;
};

TEST_P(FaultInjectionTest, PassesRequestsThroughWithoutRules) {
  EXPECT_EQ(engine_->name(), "fault");
  AlignedBuf buf(kFileBytes);
  ASSERT_TRUE(Read(buf).ok());
  EXPECT_EQ(FirstMismatch(buf.data(), kFileBytes, kOldSeed), -1);
  EXPECT_TRUE(Sync().ok());
  EXPECT_EQ(engine_->faults_fired(), 0u);
}

TEST_P(FaultInjectionTest, ErrorFailsWithErrnoWithoutTouchingTheDevice) {
  FaultRule no_space = Rule(Fault::kError, Op::kWrite);
  no_space.err = ENOSPC;
  engine_->AddRule(no_space);
  engine_->AddRule(Rule(Fault::kError, Op::kRead));  // EIO
  engine_->AddRule(Rule(Fault::kError, Op::kSync));

  AlignedBuf fresh(kFileBytes);
  FillPattern(fresh, kNewSeed);
  Status st = Run(Op::kWrite, 0, fresh);
  EXPECT_EQ(st.code(), Code::kNoSpace) << st.ToString();
  EXPECT_NE(st.message().find("injected write at offset 0"), std::string::npos) << st.message();
  EXPECT_EQ(FirstMismatch(ReadBack().data(), kFileBytes, kOldSeed), -1) << "the write reached the file";

  AlignedBuf buf(4096);
  FillPattern(buf, kNewSeed);
  st = Read(buf);
  EXPECT_EQ(st.code(), Code::kIoError) << st.ToString();
  EXPECT_NE(st.message().find(std::strerror(EIO)), std::string::npos) << st.message();
  EXPECT_EQ(FirstMismatch(buf.data(), 4096, kNewSeed), -1) << "the read reached the file";
  EXPECT_EQ(Sync().code(), Code::kIoError);
  EXPECT_EQ(engine_->faults_fired(), 3u);
}

TEST_P(FaultInjectionTest, ShortReadReportsHalf) {
  engine_->AddRule(Rule(Fault::kShortRead, Op::kRead));
  AlignedBuf buf(8192);
  Status st = Read(buf);
  EXPECT_EQ(st.code(), Code::kIoError) << st.ToString();
  EXPECT_NE(st.message().find("4096 of 8192 bytes"), std::string::npos) << st.message();
}

TEST_P(FaultInjectionTest, CorruptFlipsTheMiddleByteAndReportsOk) {
  engine_->AddRule(Rule(Fault::kCorrupt, Op::kRead));
  AlignedBuf buf(16384);
  ASSERT_TRUE(Read(buf).ok());
  EXPECT_EQ(FirstMismatch(buf.data(), 8192, kOldSeed), -1);
  EXPECT_EQ(buf.data()[8192], PatternByte(kOldSeed, 8192) ^ 0xFF);
  EXPECT_EQ(FirstMismatch(buf.data() + 8193, 16384 - 8193, kOldSeed, 8193), -1) << "more than one byte changed";
  // Only the caller's view was corrupted, not the file.
  EXPECT_EQ(FirstMismatch(ReadBack().data(), kFileBytes, kOldSeed), -1);
}

TEST_P(FaultInjectionTest, TornWriteKeepsTheFirstAlignedHalf) {
  engine_->AddRule(Rule(Fault::kTornWrite, Op::kWrite));
  // 16 KiB keeps 8 KiB; 12 KiB keeps 6 KiB rounded down to 4 KiB.
  for (uint64_t len : {16384, 12288}) {
    AlignedBuf fresh(len);
    FillPattern(fresh, kNewSeed);
    ASSERT_TRUE(Run(Op::kWrite, 0, fresh).ok()) << len;
    AlignedBuf disk = ReadBack();
    const uint64_t kept = len == 16384 ? 8192 : 4096;
    EXPECT_EQ(FirstMismatch(disk.data(), kept, kNewSeed), -1) << len;
    EXPECT_EQ(FirstMismatch(disk.data() + kept, kFileBytes - kept, kOldSeed, kept), -1) << len;
    FillPattern(disk, kOldSeed);  // restore for the next round
    ASSERT_TRUE(base_->Execute(MakeRequest(Op::kWrite, file_.fd(), 0, disk.data(), disk.size())).ok());
  }
}

TEST_P(FaultInjectionTest, TornSmallWriteOnBufferedFileKeepsHalf) {
  Result<File> buffered = File::Open(dir_.Sub("buffered"), /*create=*/true, /*want_direct=*/false);
  ASSERT_TRUE(buffered.ok()) << buffered.status().ToString();
  engine_->AddRule(Rule(Fault::kTornWrite, Op::kWrite));
  AlignedBuf fresh(4096);
  FillPattern(fresh, kNewSeed);
  ASSERT_TRUE(engine_->Execute(MakeRequest(Op::kWrite, buffered->fd(), 0, fresh.data(), 4096)).ok());
  EXPECT_EQ(buffered->Size().value(), 2048u);
}

TEST_P(FaultInjectionTest, DropWriteReportsOkAndWritesNothing) {
  engine_->AddRule(Rule(Fault::kDropWrite, Op::kWrite));
  AlignedBuf fresh(kFileBytes);
  FillPattern(fresh, kNewSeed);
  EXPECT_TRUE(Run(Op::kWrite, 0, fresh).ok());
  EXPECT_EQ(FirstMismatch(ReadBack().data(), kFileBytes, kOldSeed), -1);
  EXPECT_EQ(engine_->faults_fired(), 1u);
}

TEST_P(FaultInjectionTest, SkipThenCountThenStops) {
  FaultRule rule = Rule(Fault::kError, Op::kRead);
  rule.skip = 2;
  rule.count = 3;
  engine_->AddRule(rule);
  AlignedBuf buf(4096);
  std::vector<bool> ok;
  for (int i = 0; i < 8; ++i) ok.push_back(Read(buf).ok());
  EXPECT_EQ(ok, (std::vector<bool>{true, true, false, false, false, true, true, true}));
  EXPECT_EQ(engine_->faults_fired(), 3u);
}

TEST_P(FaultInjectionTest, RulesMatchOnlyTheirFdAndOp) {
  FaultRule other_fd = Rule(Fault::kError, Op::kRead);
  other_fd.fd = file_.fd() + 100;
  engine_->AddRule(other_fd);
  engine_->AddRule(Rule(Fault::kDropWrite, Op::kWrite));
  AlignedBuf buf(4096);
  EXPECT_TRUE(Read(buf).ok());
  EXPECT_TRUE(Sync().ok());
  EXPECT_EQ(engine_->faults_fired(), 0u);

  FaultRule this_fd = Rule(Fault::kError, Op::kRead);
  this_fd.fd = file_.fd();
  engine_->AddRule(this_fd);
  EXPECT_FALSE(Read(buf).ok());
  EXPECT_EQ(engine_->faults_fired(), 1u);
}

TEST_P(FaultInjectionTest, FirstFiringRuleConsumesTheRequest) {
  FaultRule once = Rule(Fault::kError, Op::kRead);
  once.count = 1;
  FaultRule later = Rule(Fault::kError, Op::kRead);
  later.err = ENOSPC;
  later.skip = 1;
  engine_->AddRule(once);
  engine_->AddRule(later);
  AlignedBuf buf(4096);
  EXPECT_EQ(Read(buf).code(), Code::kIoError);  // `once` fires; `later` does not see it
  EXPECT_TRUE(Read(buf).ok());                   // `later` skips its first
  EXPECT_EQ(Read(buf).code(), Code::kNoSpace);   // and fires on its second
}

TEST_P(FaultInjectionTest, ClearRulesStopsFaults) {
  engine_->AddRule(Rule(Fault::kError, Op::kRead));
  AlignedBuf buf(4096);
  EXPECT_FALSE(Read(buf).ok());
  engine_->ClearRules();
  EXPECT_TRUE(Read(buf).ok());
  EXPECT_EQ(engine_->faults_fired(), 1u);
}

TEST_P(FaultInjectionTest, InjectedErrorStillCompletesOnAnEngineThread) {
  engine_->AddRule(Rule(Fault::kError, Op::kRead));
  AlignedBuf buf(4096);
  std::promise<std::thread::id> where;
  Request req = MakeRequest(Op::kRead, file_.fd(), 0, buf.data(), buf.size());
  req.done = [&](Status) { where.set_value(std::this_thread::get_id()); };
  engine_->Submit(std::move(req));
  EXPECT_NE(where.get_future().get(), std::this_thread::get_id());
}

TEST_P(FaultInjectionTest, GateHoldsRequestsUntilOpened) {
  constexpr int kRequests = 5;
  std::vector<AlignedBuf> bufs;
  for (int i = 0; i < kRequests; ++i) bufs.emplace_back(4096);
  std::atomic<int> calls{0};
  std::latch all_done(kRequests);
  ASSERT_TRUE(test::WaitIdle(*engine_));  // SetUp's write may still be finishing
  ASSERT_TRUE(test::WaitIdle(*base_));
  engine_->CloseGate();
  for (int i = 0; i < kRequests; ++i) {
    Request req = MakeRequest(Op::kRead, file_.fd(), i * 4096, bufs[i].data(), 4096);
    req.done = [&](Status st) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      calls.fetch_add(1);
      all_done.count_down();
    };
    engine_->Submit(std::move(req));
  }
  EXPECT_EQ(engine_->held(), 5u);
  EXPECT_EQ(engine_->outstanding(), 5u);
  EXPECT_EQ(base_->outstanding(), 0u);
  EXPECT_EQ(calls.load(), 0);

  engine_->OpenGate();
  all_done.wait();
  EXPECT_EQ(engine_->held(), 0u);
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(bufs[i].data()[0], PatternByte(kOldSeed, i * 4096)) << i;
  }
  engine_.reset();
  EXPECT_EQ(calls.load(), kRequests);
}

TEST_P(FaultInjectionTest, DestructionReleasesHeldRequests) {
  std::vector<AlignedBuf> bufs;
  for (int i = 0; i < 3; ++i) bufs.emplace_back(4096);
  std::atomic<int> calls{0};
  engine_->CloseGate();
  for (int i = 0; i < 3; ++i) {
    Request req = MakeRequest(Op::kRead, file_.fd(), 0, bufs[i].data(), 4096);
    req.done = [&](Status) { calls.fetch_add(1); };
    engine_->Submit(std::move(req));
  }
  engine_.reset();
  EXPECT_EQ(calls.load(), 3);
}

INSTANTIATE_TEST_SUITE_P(Bases, FaultInjectionTest, ::testing::Values("io_uring", "threadpool"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "io_uring" ? std::string("Uring") : std::string("ThreadPool");
                         });

}  // namespace
}  // namespace flatkv::io
