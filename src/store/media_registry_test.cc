// The media past the index register where a store is composed
// (store/media_registry.cc): options for a medium no one registered fail at
// Open naming it and its component; a registered one opens once per store,
// in registration order.
#include <gtest/gtest.h>

#include <atomic>

#include "flatkv/store.h"
#include "store/source.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using testing::SmallOptions;
using testing::TempDir;

// Restores the registered media when a test ends.
class MediaRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = ReplaceMediaForTest({}); }
  void TearDown() override { ReplaceMediaForTest(std::move(saved_)); }
  std::vector<MediumDescriptor> saved_;
  TempDir dir_;
};

TEST_F(MediaRegistryTest, OptionsForAnUnregisteredMediumFailNamingItAndTheComponentToLink) {
  StoreOptions o = SmallOptions(dir_.path(), 4, 16);
  o.remote.seeds = {"127.0.0.1:1"};
  auto s = Store::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kFailedPrecondition) << s.status().ToString();
  const std::string m = s.status().ToString();
  EXPECT_NE(m.find("medium 'remote'"), std::string::npos) << m;
  EXPECT_NE(m.find("flatkv::remote"), std::string::npos) << m;
  EXPECT_NE(m.find("flatkv_remote"), std::string::npos) << m;
  EXPECT_NE(m.find("RegisterRemoteMedium"), std::string::npos) << m;
}

TEST_F(MediaRegistryTest, WithoutItsOptionsAnUnregisteredMediumIsNotNeeded) {
  StoreOptions o = SmallOptions(dir_.path(), 4, 16);
  auto s = Store::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s.value()->Close().ok());
}

std::atomic<int> opened_a{0}, opened_b{0};
std::vector<std::string>* order = nullptr;

Result<std::unique_ptr<StoreMedium>> OpenA(const MediumContext&) {
  ++opened_a;
  if (order) order->push_back("a");
  return std::unique_ptr<StoreMedium>();  // not configured
}
Result<std::unique_ptr<StoreMedium>> OpenB(const MediumContext&) {
  ++opened_b;
  if (order) order->push_back("b");
  return std::unique_ptr<StoreMedium>();
}

TEST_F(MediaRegistryTest, RegisteredMediaAreAskedOncePerOpenInRegistrationOrder) {
  std::vector<std::string> seen;
  order = &seen;
  RegisterMedium({"test-a", &OpenA});
  RegisterMedium({"test-b", &OpenB});
  RegisterMedium({"test-a", &OpenB});  // a name registered again is left as it was
  opened_a = opened_b = 0;
  auto s = Store::Open(SmallOptions(dir_.path(), 4, 16));
  order = nullptr;
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(opened_a.load(), 1);
  EXPECT_EQ(opened_b.load(), 1);
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(s.value()->Close().ok());
}

}  // namespace
}  // namespace flatkv
