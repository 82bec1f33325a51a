#include "remote/held_log.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "testing/test_util.h"

namespace flatkv::remote {
namespace {

PublishedPiece Piece(uint32_t blocks, uint64_t bytes, std::vector<std::string> names) {
  PublishedPiece p;
  p.blocks = blocks;
  p.bytes = bytes;
  p.names = std::move(names);
  return p;
}

TEST(HeldLogTest, PiecesAndDeletesSurviveAReopenAndATornLineEndsTheLog) {
  flatkv::testing::TempDir dir;
  const std::string path = dir.Sub("remote-held.log");
  std::deque<PublishedPiece> held;
  {
    auto log = HeldLog::Open(path, &held);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    EXPECT_TRUE(held.empty());
    ASSERT_TRUE((*log)->Published(Piece(2, 100, {"fkv:o:aa:2:0", "fkv:i:aa"})).ok());
    ASSERT_TRUE((*log)->Published(Piece(3, 200, {"fkv:o:bb:3:0"})).ok());
    ASSERT_TRUE((*log)->Published(Piece(1, 300, {"fkv:o:cc:1:0"})).ok());
    std::deque<PublishedPiece> now = {Piece(3, 200, {"fkv:o:bb:3:0"}), Piece(1, 300, {"fkv:o:cc:1:0"})};
    ASSERT_TRUE((*log)->Deleted(1, now).ok());
    EXPECT_EQ((*log)->records(), 4u) << "appended: well within the slack";
  }
  {
    auto log = HeldLog::Open(path, &held);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    ASSERT_EQ(held.size(), 2u);
    EXPECT_EQ(held[0].blocks, 3u);
    EXPECT_EQ(held[0].bytes, 200u);
    EXPECT_EQ(held[0].names, std::vector<std::string>{"fkv:o:bb:3:0"});
    EXPECT_EQ(held[1].bytes, 300u);
    ASSERT_TRUE((*log)->Published(Piece(4, 400, {"fkv:o:dd:4:0"})).ok());
  }
  // A torn last line (a crash mid-write) and a flipped byte: the log ends
  // before them.
  std::string text;
  ASSERT_TRUE(flatkv::testing::ReadFile(path, &text));
  text.resize(text.size() - 3);
  {
    std::ofstream out(path, std::ios::trunc);
    out << text;
  }
  auto log = HeldLog::Open(path, &held);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  ASSERT_EQ(held.size(), 2u) << "the torn piece is not counted";
  text.clear();
  ASSERT_TRUE(flatkv::testing::ReadFile(path, &text));
  const size_t at = text.find("fkv:o:cc");
  ASSERT_NE(at, std::string::npos);
  text[at + 6] = 'x';
  {
    std::ofstream out(path, std::ios::trunc);
    out << text;
  }
  log = HeldLog::Open(path, &held);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  ASSERT_EQ(held.size(), 1u) << "a corrupt line ends the log";
  EXPECT_EQ(held[0].bytes, 200u);
}

// Publishing and deleting for long enough rewrites the log from what is
// held: the file stays proportional to the pieces held, and reads back the same.
TEST(HeldLogTest, ALongRunRewritesTheLogFromWhatIsHeld) {
  flatkv::testing::TempDir dir;
  const std::string path = dir.Sub("remote-held.log");
  std::deque<PublishedPiece> held, mine;
  auto log = HeldLog::Open(path, &held);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  uint64_t most = 0;
  for (uint32_t i = 0; i < 5000; ++i) {
    mine.push_back(Piece(1, i, {"fkv:o:" + std::to_string(i) + ":1:0"}));
    ASSERT_TRUE((*log)->Published(mine.back()).ok());
    if (mine.size() > 10) {  // a cap of 10 pieces
      mine.pop_front();
      ASSERT_TRUE((*log)->Deleted(1, mine).ok());
    }
    most = std::max(most, (*log)->records());
  }
  EXPECT_LE(most, 2 * 10 + HeldLog::kSlack + 2) << "the log grew with every record";
  log.value().reset();
  ASSERT_TRUE(HeldLog::Open(path, &held).ok());
  ASSERT_EQ(held.size(), 10u);
  for (size_t k = 0; k < 10; ++k) EXPECT_EQ(held[k].bytes, mine[k].bytes);
}

TEST(HeldLogTest, AnUnwritableDirectoryIsAnErrorNamingThePath) {
  std::deque<PublishedPiece> held;
  auto log = HeldLog::Open("/nonexistent-dir/remote-held.log", &held);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("/nonexistent-dir/remote-held.log"), std::string::npos) << log.status().ToString();
}

}  // namespace
}  // namespace flatkv::remote
