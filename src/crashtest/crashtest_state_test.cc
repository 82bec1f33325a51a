// The crash harness's judgement: the expected-state log survives a torn
// tail, and each contract requires exactly the blocks docs/crashtest.md says.
#include "crashtest/crashtest_state.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>

#include "testing/test_util.h"

namespace flatkv::tools::crashtest {
namespace {

BlockKey K(uint64_t n) { return ContinueChain({}, 77, 0, static_cast<uint32_t>(n)).back(); }

Record Put(uint64_t session, uint64_t key, bool own) { return {RecordType::kPut, session, K(key), own ? kOwnBit : 0}; }
Record Drop(uint64_t session) { return {RecordType::kDrop, session, {}, 0}; }
Record Reuse(uint64_t session) { return {RecordType::kReuse, session, {}, 0}; }

// Key number -> required, for the expectations of `log` under `c`.
std::map<uint64_t, bool> Required(const std::vector<Record>& log, const Contract& c) {
  std::map<uint64_t, bool> out;
  for (const auto& e : Expectations(log, c))
    for (uint64_t n = 1; n <= 8; ++n)
      if (e.key == K(n)) out[n] = e.required;
  return out;
}

TEST(CrashtestStateTest, ChainsExtendAndPayloadsAreCheckedByteForByte) {
  auto two = ContinueChain({}, 5, 0, 2);
  auto three = ContinueChain(two, 5, 2, 1);
  EXPECT_EQ(three, ContinueChain({}, 5, 0, 3));
  EXPECT_NE(ContinueChain({}, 6, 0, 1)[0], two[0]);
  std::vector<std::byte> block(4096 + 3);
  FillPayload(two[1], block);
  EXPECT_TRUE(PayloadMatches(two[1], block));
  EXPECT_FALSE(PayloadMatches(two[0], block));
  block[4097] ^= std::byte{1};
  EXPECT_FALSE(PayloadMatches(two[1], block));
  // A put's data: the blocks' payloads back to back.
  const std::vector<std::byte> data = Payloads(two, block.size());
  ASSERT_EQ(data.size(), 2 * block.size());
  EXPECT_TRUE(PayloadMatches(two[0], std::span(data.data(), block.size())));
  EXPECT_TRUE(PayloadMatches(two[1], std::span(data.data() + block.size(), block.size())));
}

TEST(CrashtestStateTest, LogReadingStopsAtATornTail) {
  flatkv::testing::TempDir dir;
  const std::string path = dir.Sub("expected.log");
  {
    auto log = ExpectedLog::Open(path);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    ASSERT_TRUE(log->Append(std::vector<Record>{Put(1, 1, true), Put(1, 2, true)}).ok());
    ASSERT_TRUE(log->Append(std::vector<Record>{Drop(1)}).ok());
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  const char torn[17] = "half a record...";
  ASSERT_EQ(::write(fd, torn, 17), 17);  // a write cut short by the kill
  ::close(fd);
  uint64_t ignored = 0;
  auto got = ExpectedLog::ReadAll(path, &ignored);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ(ignored, 17u);
  EXPECT_EQ((*got)[1].key, K(2));
  EXPECT_EQ((*got)[2].type, RecordType::kDrop);
  const LogSummary s = Summarize(*got);
  EXPECT_EQ(s.puts, 2u);
  EXPECT_EQ(s.drops, 1u);
  EXPECT_TRUE(s.live_sessions.empty());
}

TEST(CrashtestStateTest, DefaultContractRequiresEveryAckedBlockOfUndroppedSessions) {
  // Session 1 puts 1, 2; session 2 forks from 1's first block and adds 3;
  // session 3 puts 4; then session 1 is dropped.
  std::vector<Record> log = {Put(1, 1, true), Put(1, 2, true), Put(2, 1, false), Put(2, 3, true), Put(3, 4, true), Drop(1)};
  auto today = Required(log, Contract{});
  // Without reference counting, a drop frees the shared block 1 too.
  EXPECT_EQ(today, (std::map<uint64_t, bool>{{1, false}, {2, false}, {3, true}, {4, true}}));
  auto refcounted = Required(log, Contract{SsdAdmission::kAll, true});
  EXPECT_EQ(refcounted, (std::map<uint64_t, bool>{{1, true}, {2, false}, {3, true}, {4, true}}));
}

TEST(CrashtestStateTest, OnReuseRequiresOnlyOwnBlocksPutAfterTheSessionWasReused) {
  std::vector<Record> log = {Put(1, 1, true), Reuse(1), Put(1, 2, true), Put(2, 2, false), Put(2, 3, true),
                             Reuse(2), Put(2, 4, false)};
  auto req = Required(log, Contract{SsdAdmission::kOnReuse, false});
  // 1: before the reuse; 2: own block of 1 after its reuse; 3: before 2's
  // reuse; 4: after it, but a shared prefix block, not 2's own.
  EXPECT_EQ(req, (std::map<uint64_t, bool>{{1, false}, {2, true}, {3, false}, {4, false}}));
  log.push_back(Drop(1));
  EXPECT_FALSE(Required(log, Contract{SsdAdmission::kOnReuse, false})[2]);
}

}  // namespace
}  // namespace flatkv::tools::crashtest
