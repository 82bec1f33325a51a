#include "io/io_engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <latch>
#include <mutex>
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

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// Every case runs on each engine: GetParam() is the engine's name().
class IoEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    engine_ = test::MakeEngineByName(GetParam(), /*queue_depth=*/8, /*threads=*/4);
    if (engine_ == nullptr) GTEST_SKIP() << "io_uring is refused on this machine";
    Result<File> file = File::Open(dir_.Sub("data"), /*create=*/true, /*want_direct=*/true);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    file_ = std::move(file).value();
  }

  Status Run(Op op, uint64_t offset, AlignedBuf& buf) {
    return engine_->Execute(MakeRequest(op, file_.fd(), offset, buf.data(), buf.size()));
  }

  ::flatkv::testing::TempDir dir_;
  std::unique_ptr<IoEngine> engine_;
  File file_;
};

TEST_P(IoEngineTest, NameMatches) { EXPECT_EQ(engine_->name(), GetParam()); }

TEST_P(IoEngineTest, WritesThenReadsBackEverySize) {
  uint64_t offset = 0;
  for (uint64_t size : {4 * kKiB, 64 * kKiB, 1 * kMiB, 8 * kMiB}) {
    AlignedBuf out(size);
    FillPattern(out, size);
    ASSERT_TRUE(Run(Op::kWrite, offset, out).ok()) << size;
    AlignedBuf in(size);
    Status st = Run(Op::kRead, offset, in);
    ASSERT_TRUE(st.ok()) << size << ": " << st.ToString();
    EXPECT_EQ(FirstMismatch(in.data(), size, size), -1) << size;
    offset += size;
  }
  EXPECT_EQ(file_.Size().value(), offset);
}

TEST_P(IoEngineTest, ManyConcurrentRequestsCompleteOnceWithTheirData) {
  constexpr int kRequests = 256;
  constexpr uint64_t kSize = 64 * kKiB;
  std::vector<AlignedBuf> bufs;
  for (int i = 0; i < kRequests; ++i) bufs.emplace_back(kSize);
  std::vector<std::atomic<int>> calls(kRequests);
  std::vector<Status> statuses(kRequests);

  // Submits one `op` per buffer, all at once, and waits for every callback.
  auto run_all = [&](Op op) {
    for (auto& c : calls) c = 0;
    std::latch all_done(kRequests);
    for (int i = 0; i < kRequests; ++i) {
      Request req = MakeRequest(op, file_.fd(), i * kSize, bufs[i].data(), kSize);
      req.done = [&, i](Status st) {
        statuses[i] = std::move(st);
        calls[i].fetch_add(1);
        all_done.count_down();
      };
      engine_->Submit(std::move(req));
    }
    all_done.wait();
  };

  for (int i = 0; i < kRequests; ++i) FillPattern(bufs[i], i);
  run_all(Op::kWrite);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(calls[i].load(), 1) << i;
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].ToString();
    std::memset(bufs[i].data(), 0, kSize);
  }
  run_all(Op::kRead);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(calls[i].load(), 1) << i;
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].ToString();
    ASSERT_EQ(FirstMismatch(bufs[i].data(), kSize, i), -1) << "request " << i;
  }
}

TEST_P(IoEngineTest, ReadPastEofIsShortRead) {
  AlignedBuf page(4 * kKiB);
  FillPattern(page, 7);
  ASSERT_TRUE(Run(Op::kWrite, 0, page).ok());

  AlignedBuf two(8 * kKiB);
  Status st = Run(Op::kRead, 0, two);
  EXPECT_EQ(st.code(), Code::kIoError) << st.ToString();
  EXPECT_NE(st.message().find("4096 of 8192 bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("at offset 0"), std::string::npos) << st.message();

  st = Run(Op::kRead, 64 * kKiB, page);
  EXPECT_EQ(st.code(), Code::kIoError) << st.ToString();
  EXPECT_NE(st.message().find("0 of 4096 bytes"), std::string::npos) << st.message();
}

TEST_P(IoEngineTest, BadFdIsAnErrorNotACrash) {
  AlignedBuf buf(4 * kKiB);
  for (Op op : {Op::kRead, Op::kWrite, Op::kSync}) {
    Status st = engine_->Execute(MakeRequest(op, -1, 0, buf.data(), buf.size()));
    EXPECT_EQ(st.code(), Code::kIoError) << st.ToString();
    EXPECT_NE(st.message().find(std::strerror(EBADF)), std::string::npos) << st.message();
  }
}

TEST_P(IoEngineTest, SyncSucceeds) {
  AlignedBuf buf(4 * kKiB);
  FillPattern(buf, 3);
  ASSERT_TRUE(Run(Op::kWrite, 0, buf).ok());
  Status st = engine_->Execute(MakeRequest(Op::kSync, file_.fd(), 0, nullptr, 0));
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_P(IoEngineTest, ZeroLengthCompletesOk) {
  Status st = engine_->Execute(MakeRequest(Op::kRead, file_.fd(), 0, nullptr, 0));
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_P(IoEngineTest, CallbackRunsOnAnEngineThread) {
  AlignedBuf buf(4 * kKiB);
  std::promise<std::thread::id> where;
  Request req = MakeRequest(Op::kWrite, file_.fd(), 0, buf.data(), buf.size());
  req.done = [&](Status) { where.set_value(std::this_thread::get_id()); };
  engine_->Submit(std::move(req));
  EXPECT_NE(where.get_future().get(), std::this_thread::get_id());
}

TEST_P(IoEngineTest, DestructorWaitsForRequestsSubmittedByCallbacks) {
  AlignedBuf buf(4 * kKiB);
  ASSERT_TRUE(Run(Op::kWrite, 0, buf).ok());
  std::atomic<int> calls{0};
  Request second = MakeRequest(Op::kRead, file_.fd(), 0, buf.data(), buf.size());
  second.done = [&](Status st) {
    EXPECT_TRUE(st.ok()) << st.ToString();
    calls.fetch_add(1);
  };
  Request first = MakeRequest(Op::kRead, file_.fd(), 0, buf.data(), buf.size());
  IoEngine* engine = engine_.get();
  first.done = [&, engine](Status st) {
    EXPECT_TRUE(st.ok()) << st.ToString();
    calls.fetch_add(1);
    engine->Submit(std::move(second));
  };
  engine_->Submit(std::move(first));
  engine_.reset();
  EXPECT_EQ(calls.load(), 2);
}

TEST_P(IoEngineTest, IdleEngineReportsNothingOutstandingAndDestroysCleanly) {
  EXPECT_EQ(engine_->outstanding(), 0u);
  AlignedBuf buf(4 * kKiB);
  ASSERT_TRUE(Run(Op::kWrite, 0, buf).ok());
  EXPECT_TRUE(test::WaitIdle(*engine_));
  engine_.reset();
  std::unique_ptr<IoEngine> unused = test::MakeEngineByName(GetParam());
  ASSERT_NE(unused, nullptr);
}

INSTANTIATE_TEST_SUITE_P(Engines, IoEngineTest, ::testing::Values("io_uring", "threadpool"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "io_uring" ? std::string("Uring") : std::string("ThreadPool");
                         });

// io_uring transfers from a pipe stop at whatever the pipe holds, which
// makes partial transfers and a full ring deterministic.
class UringPipeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::pipe(fds_), 0);
    UringOptions options;
    options.queue_depth = 1;
    Result<std::unique_ptr<IoEngine>> engine = MakeUringEngine(options);
    if (!engine.ok()) GTEST_SKIP() << engine.status().ToString();
    engine_ = std::move(engine).value();
  }
  void TearDown() override {
    engine_.reset();
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  void Put(const char* s) { ASSERT_EQ(::write(fds_[1], s, std::strlen(s)), static_cast<ssize_t>(std::strlen(s))); }

  int fds_[2] = {-1, -1};
  std::unique_ptr<IoEngine> engine_;
};

TEST_F(UringPipeTest, PartialReadIsResubmittedForTheRest) {
  char buf[9] = {};
  std::promise<Status> done;
  Request req = MakeRequest(Op::kRead, fds_[0], 0, buf, 8);
  req.done = [&](Status st) { done.set_value(std::move(st)); };
  Put("abcd");
  engine_->Submit(std::move(req));
  std::future<Status> result = done.get_future();
  // The first 4 bytes came back; the rest is still wanted.
  EXPECT_EQ(result.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  EXPECT_EQ(engine_->outstanding(), 1u);
  Put("efgh");
  Status st = result.get();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_STREQ(buf, "abcdefgh");
}

TEST_F(UringPipeTest, EofAfterPartialReadIsShortRead) {
  char buf[8] = {};
  Put("abcd");
  ::close(fds_[1]);
  fds_[1] = -1;
  Status st = engine_->Execute(MakeRequest(Op::kRead, fds_[0], 0, buf, 8));
  EXPECT_EQ(st.code(), Code::kIoError);
  EXPECT_NE(st.message().find("4 of 8 bytes"), std::string::npos) << st.message();
}

TEST_F(UringPipeTest, RequestsBeyondQueueDepthWaitInOrder) {
  constexpr int kRequests = 3;
  char got[kRequests] = {};
  std::vector<int> order;
  std::mutex order_mu;
  std::latch all_done(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    Request req = MakeRequest(Op::kRead, fds_[0], 0, &got[i], 1);
    req.done = [&, i](Status st) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      {
        std::lock_guard<std::mutex> lock(order_mu);
        order.push_back(i);
      }
      all_done.count_down();
    };
    engine_->Submit(std::move(req));
  }
  EXPECT_EQ(engine_->outstanding(), 3u);  // one in the ring (depth 1), two pending
  Put("xyz");
  all_done.wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(std::string(got, kRequests), "xyz");
}

TEST(MakeEngineTest, UringRejectsZeroDepth) {
  UringOptions options;
  options.queue_depth = 0;
  EXPECT_EQ(MakeUringEngine(options).status().code(), Code::kInvalidArgument);
}

TEST(MakeEngineTest, DefaultEngineWorks) {
  std::unique_ptr<IoEngine> engine = MakeDefaultEngine();
  ASSERT_NE(engine, nullptr);
  EXPECT_TRUE(engine->name() == "io_uring" || engine->name() == "threadpool") << engine->name();
  Status st = engine->Execute(MakeRequest(Op::kSync, -1, 0, nullptr, 0));
  EXPECT_EQ(st.code(), Code::kIoError) << st.ToString();
}

TEST(MakeEngineTest, ThreadPoolWithZeroThreadsStillRuns) {
  std::unique_ptr<IoEngine> engine = MakeThreadPoolEngine(0);
  EXPECT_TRUE(engine->Execute(MakeRequest(Op::kRead, -1, 0, nullptr, 0)).ok());
}

}  // namespace
}  // namespace flatkv::io
