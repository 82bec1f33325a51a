// The C API's put hints reach the store's placement policy, in this process
// and through a daemon: a recording policy is slipped into the options
// behind the opaque handle (the C++ side of flatkv_options).
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "capi/capi_internal.h"
#include "capi/capi_test_util.h"
#include "flatkv/flatkv.h"
#include "flatkv/placement.h"
#include "service/test_server.h"

namespace flatkv {
namespace {

using capi_testing::Err;

// DefaultPlacement that remembers the hint of every extent it placed.
class RecordingPlacement final : public PlacementPolicy {
 public:
  Placement Choose(const PlacementContext& ctx) const override {
    std::lock_guard<std::mutex> lock(mu_);
    hints_.push_back(ctx.hint);
    return DefaultPlacement().Choose(ctx);
  }
  std::string_view name() const override { return "recording"; }
  std::vector<PutHint> hints() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hints_;
  }

 private:
  mutable std::mutex mu_;
  mutable std::vector<PutHint> hints_;
};

// One table of flags and the hint each must arrive as.
struct FlagHint {
  uint32_t flags;
  PutHint hint;
};
constexpr FlagHint kFlagHints[] = {
    {0, PutHint::kAuto},
    {FLATKV_PUT_ONE_SHOT, PutHint::kOneShot},
    {FLATKV_PUT_HOT, PutHint::kHot},
};

// Puts one block per row, each in a session of its own (so each makes a new
// extent), and expects the policy to have seen the row's hint for it.
void PutEveryHint(flatkv_store* s, const RecordingPlacement& policy) {
  const uint64_t bb = flatkv_store_block_bytes(s);
  std::vector<std::byte> data(bb, std::byte{3});
  uint64_t session = 100;
  for (const FlagHint& row : kFlagHints) {
    const size_t before = policy.hints().size();
    const flatkv_key key{session * 7919, session};
    ASSERT_EQ(Err(flatkv_store_put(s, session++, &key, 1, data.data(), bb, row.flags)), "");
    const auto hints = policy.hints();
    ASSERT_GT(hints.size(), before) << "flags " << row.flags << " placed no extent";
    EXPECT_EQ(hints.back(), row.hint) << "flags " << row.flags;
  }
}

TEST(CapiOptionsTest, PutHintsReachTheEmbeddedStore) {
  flatkv::testing::TempDir dir;
  auto policy = std::make_shared<RecordingPlacement>();
  flatkv_options* o = flatkv_options_create();
  ASSERT_EQ(Err(flatkv_options_set_shape_preset(o, "stories260k")), "");
  ASSERT_EQ(Err(flatkv_options_set_block_tokens(o, 16)), "");
  ASSERT_EQ(Err(flatkv_options_set_dram_capacity(o, 8u << 20)), "");
  ASSERT_EQ(Err(flatkv_options_add_ssd_dir(o, (dir.path() + "/ssd").c_str(), 64u << 20)), "");
  ASSERT_EQ(Err(flatkv_options_set_segment_bytes(o, 8u << 20)), "");
  o->store.placement = policy;
  flatkv_store* s = nullptr;
  ASSERT_EQ(Err(flatkv_store_open(o, &s)), "");
  flatkv_options_destroy(o);
  PutEveryHint(s, *policy);
  flatkv_store_destroy(s);
}

TEST(CapiOptionsTest, PutHintsCrossTheWireToTheDaemonsStore) {
  flatkv::testing::TempDir dir;
  auto policy = std::make_shared<RecordingPlacement>();
  service::ServerConfig config = service::testing::SmallServerConfig(dir.path());
  config.store.placement = policy;
  auto server = service::testing::StartServer(config);
  ASSERT_NE(server, nullptr);
  flatkv_options* o = flatkv_options_create();
  ASSERT_EQ(Err(flatkv_options_set_server(o, server->unix_address().c_str(), service::testing::kTokenA)), "");
  flatkv_store* s = nullptr;
  ASSERT_EQ(Err(flatkv_store_open(o, &s)), "");
  flatkv_options_destroy(o);
  PutEveryHint(s, *policy);
  flatkv_store_destroy(s);
  EXPECT_TRUE(server->Stop().ok());
}

}  // namespace
}  // namespace flatkv
