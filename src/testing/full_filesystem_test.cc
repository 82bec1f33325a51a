// A store on a really full filesystem: a small ext4 image loop-mounted for
// the test (O_DIRECT works there, unlike tmpfs). A put that finds no space
// fails with NoSpace naming it, nothing already stored is lost, and once
// space is freed puts succeed again. Needs root and a loop device: where
// mounting is not possible the tests skip and say why.
// Part of the crash harness's contracts (docs/crashtest.md, "ENOSPC").
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <string>

#include "flatkv/store.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

constexpr uint64_t kImageBytes = 48ull << 20;
constexpr int kMaxPuts = 4000;  // bounds the fill loop: 48 MiB holds about 150 sessions

// Runs `cmd` through the shell; its exit status, with stdout and stderr in `*out`.
int Shell(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) *out += buf;
  return ::pclose(p);
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

class FullFilesystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a loop filesystem needs root (euid " << ::geteuid() << ")";
    image_ = dir_.Sub("fs.img");
    mnt_ = dir_.Sub("mnt");
    std::filesystem::create_directories(mnt_);
    int fd = ::open(image_.c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, kImageBytes), 0);
    ::close(fd);
    std::string out;
    if (Shell("mkfs.ext4 -q -F -m 0 " + image_, &out) != 0) GTEST_SKIP() << "mkfs.ext4 is not usable here: " << out;
    if (Shell("mount -o loop " + image_ + " " + mnt_, &out) != 0) GTEST_SKIP() << "cannot loop-mount an ext4 image here: " << out;
    mounted_ = true;
  }
  void TearDown() override {
    std::string out;
    if (mounted_ && Shell("umount " + mnt_, &out) != 0) ADD_FAILURE() << "umount " << mnt_ << ": " << out;
  }

  StoreOptions Options() const {
    StoreOptions o = SsdOnlyOptions(mnt_ + "/ssd", 4096);  // 1.25 GiB of capacity: far more than the filesystem
    return o;
  }
  uint64_t FreeBytes() const {
    struct statvfs fs {};
    return ::statvfs(mnt_.c_str(), &fs) == 0 ? uint64_t(fs.f_bavail) * fs.f_frsize : 0;
  }

  // Puts 4-block sessions from `*next` on until a put fails; returns that failure.
  Status FillStore(Store& store, uint64_t* next, std::vector<uint64_t>* stored) {
    for (int i = 0; i < kMaxPuts; ++i, ++*next) {
      Status st = store.Put(*next, ChainKeys(*next, 4), Payload(store, 4, *next));
      if (!st.ok()) return st;
      stored->push_back(*next);
    }
    return Status::Ok();
  }

  // Every session in `stored` restores fully and byte for byte.
  void ExpectAllServed(Store& store, const std::vector<uint64_t>& stored, const char* when) {
    for (uint64_t id : stored) {
      std::vector<std::byte> got;
      ASSERT_EQ(RestoreAll(store, ChainKeys(id, 4), &got), 4u) << "session " << id << " lost " << when;
      ASSERT_TRUE(got == Payload(store, 4, id)) << "session " << id << " served wrong bytes " << when;
    }
  }

  TempDir dir_;
  std::string image_, mnt_;
  bool mounted_ = false;
};

TEST_F(FullFilesystemTest, NoSpaceIsAClearErrorLosesNothingAndPassesOnceSpaceIsFreed) {
  // Most of the filesystem taken by another file, as on a shared disk.
  const std::string filler = mnt_ + "/filler";
  {
    int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::posix_fallocate(fd, 0, FreeBytes() - (12ull << 20)), 0);
    ::close(fd);
  }
  auto opened = Store::Open(Options());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;
  uint64_t next = 1;
  std::vector<uint64_t> stored;
  Status full = FillStore(store, &next, &stored);
  ASSERT_FALSE(full.ok()) << kMaxPuts << " puts fitted in a " << kImageBytes << "-byte filesystem";
  EXPECT_EQ(full.code(), Code::kNoSpace) << full.ToString();
  std::fprintf(stderr, "the put that found the filesystem full: %s\n", full.ToString().c_str());
  const std::string msg = Lower(full.ToString());
  EXPECT_TRUE(msg.find("space") != std::string::npos || msg.find("enospc") != std::string::npos)
      << "the error does not say the filesystem is full: " << full.ToString();
  ASSERT_GT(stored.size(), 0u) << "not one put fitted: " << full.ToString();
  EXPECT_EQ(store.Match(ChainKeys(next, 4)), 0u) << "the failed put left blocks behind";
  ExpectAllServed(store, stored, "after ENOSPC");

  // Space freed: puts succeed again, and everything survives a clean reopen.
  ASSERT_EQ(::unlink(filler.c_str()), 0);
  for (int i = 0; i < 8; ++i, ++next) {
    Status st = PutChain(store, next, next, 4);
    ASSERT_TRUE(st.ok()) << "put after freeing space: " << st.ToString();
    stored.push_back(next);
  }
  ExpectAllServed(store, stored, "after freeing space");
  ASSERT_TRUE(store.Close().ok());
  opened->reset();
  auto again = Store::Open(Options());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ExpectAllServed(**again, stored, "after a clean reopen");
}

TEST_F(FullFilesystemTest, ClosingOnAFullFilesystemKeepsEveryBlock) {
  auto opened = Store::Open(Options());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  uint64_t next = 1;
  std::vector<uint64_t> stored;
  Status full = FillStore(**opened, &next, &stored);
  ASSERT_EQ(full.code(), Code::kNoSpace) << full.ToString();
  // Close rewrites the manifest as a compact snapshot, which needs space
  // too: it may fail, but only cleanly, and the old log must still hold.
  Status closed = (*opened)->Close();
  EXPECT_TRUE(closed.ok() || closed.code() == Code::kNoSpace) << closed.ToString();
  opened->reset();
  auto again = Store::Open(Options());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ExpectAllServed(**again, stored, "after closing on a full filesystem");
}

}  // namespace
}  // namespace flatkv
