// The remote tier as a medium of the store, against the live local cluster
// (ctest's RedisCluster fixture): two stores with their own SSD directories
// stand for two nodes sharing the cluster. What node A puts is published in
// the background; node B, which never saw it, restores it from the cluster
// layer by layer, through the window and into caller memory, bit for bit;
// a local prefix and a remote rest make one restore; corrupted objects are
// misses, never wrong bytes; a full publish buffer drops, never blocks.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "flatkv/remote.h"
#include "flatkv/store.h"
#include "remote/cluster_client.h"
#include "remote/cluster_test_util.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

// A prefix of its own per test and run, so runs never see each other's objects.
std::string FreshPrefix(const std::string& name) {
  return "fkvt-" + name + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

StoreOptions NodeOptions(const std::string& dir, const std::string& prefix) {
  StoreOptions o = SmallOptions(dir, 8, 64);
  o.remote.seeds = remote::cluster_testing::LocalClusterSeeds();
  o.remote.prefix = prefix;
  o.remote.object_bytes = 2 * 16384;  // two blocks' slices per object: several objects per layer
  return o;
}

// Waits until `store` has published everything it queued.
void AwaitPublished(Store& store) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (store.Stats().remote.publish_queued_blocks > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(store.Stats().remote.publish_queued_blocks, 0u) << "publishing did not finish";
}

// A restore straight into caller memory (a RestoreTarget, block-major as the
// put's data); returns the valid blocks, their bytes in *out.
uint32_t RestoreIntoCaller(Store& store, const std::vector<BlockKey>& keys, std::vector<std::byte>* out) {
  const uint32_t layers = store.options().shape.layers;
  const uint64_t lb = store.BlockLayerBytes(), bb = store.BlockBytes();
  std::vector<std::byte> dst(keys.size() * bb, std::byte{0xEE});
  RestoreTarget target;
  target.destination = [&](uint32_t l, uint32_t b) { return dst.data() + b * bb + l * lb; };
  auto r = store.StartRestore(keys, target);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return 0;
  for (uint32_t l = 0; l < layers; ++l) {
    auto view = r.value()->WaitLayer(l);
    EXPECT_TRUE(view.ok()) << view.status().ToString();
    if (!view.ok()) return 0;
    r.value()->ReleaseLayer(l);
  }
  const uint32_t valid = r.value()->Finish();
  out->assign(dst.begin(), dst.begin() + valid * bb);
  return valid;
}

class RemoteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegisterRemoteMedium();  // this test composes its stores itself
    if (remote::cluster_testing::LocalClusterSeeds().empty()) GTEST_SKIP() << "no local cluster (run through ctest)";
    prefix_ = FreshPrefix(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  std::unique_ptr<Store> Node(const std::string& name, const std::function<void(StoreOptions&)>& edit = {}) {
    StoreOptions o = NodeOptions(dir_.Sub(name), prefix_);
    if (edit) edit(o);
    auto s = Store::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  // Node A puts `keys` (chain `chain`) as session 1 and publishes them; returns their data.
  std::vector<std::byte> PutAndPublish(Store& a, const std::vector<BlockKey>& keys, uint64_t chain) {
    std::vector<std::byte> data = Payload(a, keys.size(), chain);
    EXPECT_TRUE(a.Put(1, keys, data).ok());
    AwaitPublished(a);
    return data;
  }
  TempDir dir_;
  std::string prefix_;
};

TEST_F(RemoteStoreTest, ABlockPutOnOneNodeIsRestoredOnAnotherBitForBit) {
  auto a = Node("a"), b = Node("b");
  ASSERT_TRUE(a && b);
  const auto keys = ChainKeys(1, 7);
  const auto data = PutAndPublish(*a, keys, 1);
  EXPECT_EQ(a->Stats().remote.published_blocks, 7u);
  EXPECT_EQ(b->Match(keys), 0u) << "node B holds nothing locally";
  // Through the window, layer by layer.
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*b, keys, &got), 7u);
  EXPECT_TRUE(got == data) << "the remote blocks' bytes differ";
  // Straight into caller memory (a RestoreTarget).
  got.clear();
  EXPECT_EQ(RestoreIntoCaller(*b, keys, &got), 7u);
  EXPECT_TRUE(got == data);
  const RemoteStats rs = b->Stats().remote;
  EXPECT_EQ(rs.hit_blocks, 14u);
  EXPECT_EQ(rs.restored_blocks, 14u);
  EXPECT_GT(rs.bytes_read, 14u * a->BlockBytes());
  EXPECT_EQ(rs.stale_objects + rs.missing_objects, 0u);
}

TEST_F(RemoteStoreTest, ALocalPrefixAndARemoteRestMakeOneRestore) {
  auto a = Node("a"), b = Node("b");
  ASSERT_TRUE(a && b);
  const auto keys = ChainKeys(2, 10);
  const auto data = PutAndPublish(*a, keys, 2);
  // Node B computed the first 3 blocks itself.
  const uint64_t bb = a->BlockBytes();
  ASSERT_TRUE(b->Put(9, std::span(keys).first(3), std::span(data).first(3 * bb)).ok());
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*b, keys, &got), 10u);
  EXPECT_TRUE(got == data);
  EXPECT_EQ(b->Stats().remote.hit_blocks, 7u) << "only the blocks B lacks come from the cluster";
  AwaitPublished(*b);
  EXPECT_EQ(b->Stats().remote.already_published_blocks, 3u) << "B's put found its blocks published by A";
}

TEST_F(RemoteStoreTest, ACorruptedObjectIsAMissNeverWrongBytes) {
  auto a = Node("a"), b = Node("b");
  ASSERT_TRUE(a && b);
  const auto keys = ChainKeys(3, 6);
  const auto data = PutAndPublish(*a, keys, 3);
  // Flip a payload byte of layer 2's object holding blocks 2-3, behind flatkv's back.
  remote::ClusterOptions co;
  co.seeds = remote::cluster_testing::LocalClusterSeeds();
  auto cluster = remote::ClusterClient::Connect(co);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  const std::string name = prefix_ + ":o:" + keys[2].ToHex() + ":2:2";
  auto v = (*cluster)->Command({"GET", name});
  ASSERT_TRUE(v.ok() && v->type == remote::RespValue::kString) << "object " << name << " not found";
  std::string bad = v->str;
  bad[bad.size() - 7] ^= 0x5A;
  ASSERT_TRUE((*cluster)->Command({"SET", name, bad}).ok());
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*b, keys, &got), 2u) << "the prefix ends where the corrupt object begins";
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin()));
  EXPECT_EQ(b->Stats().remote.stale_objects, 1u);
}

TEST_F(RemoteStoreTest, AFullPublishBufferDropsAndNeverBlocksAPut) {
  auto a = Node("a", [](StoreOptions& o) { o.remote.publish_buffer_bytes = 1; });
  ASSERT_TRUE(a);
  const auto keys = ChainKeys(4, 3);
  ASSERT_TRUE(a->Put(1, keys, Payload(*a, 3, 4)).ok());
  EXPECT_EQ(a->Stats().remote.publish_dropped_blocks, 3u);
  EXPECT_EQ(a->Stats().remote.published_blocks, 0u);
  EXPECT_EQ(a->Match(keys), 3u) << "the blocks are stored locally all the same";
}

// Of a put that does not fit the publish buffer, the leading blocks that do
// are published (a chain is reused from its start), and another node
// restores just those.
TEST_F(RemoteStoreTest, APutLargerThanThePublishBufferPublishesTheBlocksThatFit) {
  uint64_t block_bytes = 0;
  auto a = Node("a", [&](StoreOptions& o) {
    block_bytes = o.shape.BytesPerToken() * o.block_tokens;
    o.remote.publish_buffer_bytes = 2 * block_bytes + block_bytes / 2;
  });
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->BlockBytes(), block_bytes);
  const auto keys = ChainKeys(7, 5);
  const auto data = Payload(*a, 5, 7);
  ASSERT_TRUE(a->Put(1, keys, data).ok());
  EXPECT_EQ(a->Stats().remote.publish_dropped_blocks, 3u);
  AwaitPublished(*a);
  EXPECT_EQ(a->Stats().remote.published_blocks, 2u);
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*b, keys, &got), 2u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin()));
}

// A node's own cap on its cluster bytes: past it, what it published first is
// deleted, and another node's restore of it misses cleanly.
TEST_F(RemoteStoreTest, ANodesCapacityDeletesWhatItPublishedFirst) {
  // One 6-block chain is 6 x 5 layers x 16 KiB of payload, about 480 KiB
  // with headers and entries; the cap holds two of them.
  auto a = Node("a", [](StoreOptions& o) { o.remote.capacity_bytes = 1000 << 10; });
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  std::vector<std::vector<BlockKey>> chains;
  std::vector<std::vector<std::byte>> datas;
  for (uint64_t c = 0; c < 4; ++c) {
    chains.push_back(ChainKeys(300 + c, 6));
    datas.push_back(PutAndPublish(*a, chains.back(), 300 + c));
  }
  const RemoteStats rs = a->Stats().remote;
  EXPECT_EQ(rs.capacity_bytes, 1000u << 10);
  EXPECT_LE(rs.held_bytes, rs.capacity_bytes);
  EXPECT_GT(rs.held_bytes, 0u);
  EXPECT_EQ(rs.capacity_deleted_blocks, 12u) << "the two oldest chains went";
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*b, chains[0], &got), 0u) << "the first chain was deleted";
  EXPECT_EQ(RestoreAll(*b, chains[3], &got), 6u);
  EXPECT_TRUE(got == datas[3]);
}

// A write-back: node B puts the blocks it just restored from the cluster.
// They are known to be there, so they take no room in its publish buffer
// (here too small for one block) and are not published again.
TEST_F(RemoteStoreTest, WritingBackWhatTheClusterSuppliedQueuesNothingToPublish) {
  auto a = Node("a");
  auto b = Node("b", [](StoreOptions& o) { o.remote.publish_buffer_bytes = 1; });
  ASSERT_TRUE(a && b);
  const auto keys = ChainKeys(9, 4);
  const auto data = PutAndPublish(*a, keys, 9);
  std::vector<std::byte> got;
  ASSERT_EQ(RestoreAll(*b, keys, &got), 4u);
  ASSERT_TRUE(got == data);
  ASSERT_TRUE(b->Put(1, keys, got).ok());
  const RemoteStats rs = b->Stats().remote;
  EXPECT_EQ(rs.publish_dropped_blocks, 0u) << "the written-back blocks took room in the buffer";
  EXPECT_EQ(rs.already_published_blocks, 4u);
  EXPECT_EQ(rs.published_blocks, 0u);
  EXPECT_EQ(b->Match(keys), 4u) << "stored locally";
}

// The cap counts what an earlier run of the store published (its held log
// beside the SSD data): after a restart, new publishes delete the earlier
// run's oldest pieces first.
TEST_F(RemoteStoreTest, ANodesCapacityCountsWhatItPublishedBeforeARestart) {
  auto cap = [](StoreOptions& o) { o.remote.capacity_bytes = 1000 << 10; };  // two 6-block chains
  std::vector<std::vector<BlockKey>> chains;
  std::vector<std::vector<std::byte>> datas;
  uint64_t held = 0;
  {
    auto a = Node("a", cap);
    ASSERT_TRUE(a);
    for (uint64_t c = 0; c < 2; ++c) {
      chains.push_back(ChainKeys(400 + c, 6));
      datas.push_back(PutAndPublish(*a, chains.back(), 400 + c));
    }
    held = a->Stats().remote.held_bytes;
    EXPECT_GT(held, 0u);
    EXPECT_EQ(a->Stats().remote.capacity_deleted_blocks, 0u);
  }
  auto a = Node("a", cap);  // the same directory: a restart
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->Stats().remote.held_bytes, held) << "the earlier run's objects are not counted";
  for (uint64_t c = 2; c < 4; ++c) {
    chains.push_back(ChainKeys(400 + c, 6));
    datas.push_back(PutAndPublish(*a, chains.back(), 400 + c));
  }
  const RemoteStats rs = a->Stats().remote;
  EXPECT_EQ(rs.capacity_deleted_blocks, 12u) << "the earlier run's two chains went";
  EXPECT_LE(rs.held_bytes, rs.capacity_bytes);
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*b, chains[0], &got), 0u) << "the earlier run's first chain was deleted";
  EXPECT_EQ(RestoreAll(*b, chains[3], &got), 6u);
  EXPECT_TRUE(got == datas[3]);
  EXPECT_EQ(a->Match(chains[0]), 6u) << "deleting from the cluster leaves the local copy";
}

// kill -9 of a master while node A publishes and node B restores: every
// restore serves right bytes or misses, and once a replica is promoted node
// B restores every chain in full again.
TEST_F(RemoteStoreTest, KillingAMasterUnderRestoreAndPublishLoadNeverServesWrongBytes) {
  auto a = Node("a"), b = Node("b", [](StoreOptions& o) {
    o.remote.timeout = std::chrono::milliseconds(300);
    o.remote.backoff = std::chrono::milliseconds(200);
  });
  ASSERT_TRUE(a && b);
  std::vector<std::vector<BlockKey>> chains;
  std::vector<std::vector<std::byte>> datas;
  for (uint64_t c = 0; c < 6; ++c) {
    chains.push_back(ChainKeys(100 + c, 6));
    datas.push_back(PutAndPublish(*a, chains.back(), 100 + c));
  }
  remote::ClusterOptions co;
  co.seeds = remote::cluster_testing::LocalClusterSeeds();
  auto cluster = remote::ClusterClient::Connect(co);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  // Every object is on its replica before the kill.
  const std::string_view wait[] = {"WAIT", "1", "2000"};
  for (const auto& m : (*cluster)->Masters()) ASSERT_TRUE((*cluster)->CommandAt(m, wait).ok()) << m;
  const std::string victim = (*cluster)->Masters().front();
  const std::string port = victim.substr(victim.rfind(':') + 1);
  pid_t pid = 0;
  std::ifstream(remote::cluster_testing::ClusterDir() + "/" + port + "/redis.pid") >> pid;
  ASSERT_GT(pid, 0);
  std::atomic<bool> stop{false};
  std::thread publisher([&] {  // puts (and so publishes) go on through the failover
    for (uint64_t c = 200; !stop; ++c) {
      const auto keys = ChainKeys(c, 3);
      EXPECT_TRUE(a->Put(2, keys, Payload(*a, 3, c)).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  uint64_t restores = 0, full = 0, wrong = 0;
  // One restore of every chain; true when each came back in full.
  auto round = [&] {
    bool all = true;
    for (size_t c = 0; c < chains.size(); ++c) {
      std::vector<std::byte> got;  // node B keeps nothing it restores (no write-back): each is remote
      const uint32_t n = RestoreAll(*b, chains[c], &got);
      ++restores;
      if (!std::equal(got.begin(), got.end(), datas[c].begin())) ++wrong;
      if (n == chains[c].size()) ++full;
      else all = false;
    }
    return all;
  };
  auto promoted = [&] {  // a fresh map, from whichever node answers first
    auto fresh = remote::ClusterClient::Connect(co);
    if (!fresh.ok()) return false;
    const auto masters = (*fresh)->Masters();
    return masters.size() == 3 && std::find(masters.begin(), masters.end(), victim) == masters.end();
  };
  bool recovered = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < end && !recovered) {
    round();
    recovered = promoted() && round();
  }
  stop = true;
  publisher.join();
  std::printf("failover: %llu restores of 6-block chains, %llu in full, %llu with wrong bytes; node A published %llu blocks, %llu publishes failed\n",
              (unsigned long long)restores, (unsigned long long)full, (unsigned long long)wrong,
              (unsigned long long)a->Stats().remote.published_blocks, (unsigned long long)a->Stats().remote.publish_errors);
  EXPECT_EQ(wrong, 0u) << "of " << restores << " restores";
  EXPECT_TRUE(recovered) << "node B did not restore every chain in full after the failover (" << full << " of "
                         << restores << " restores were)";
  EXPECT_EQ(b->Stats().remote.stale_objects, 0u);
  // The node comes back as a replica, for the tests after this one.
  const std::string cmd = std::string("bash ") + FLATKV_SOURCE_DIR + "/scripts/redis-cluster.sh restart " +
                          remote::cluster_testing::ClusterDir() + " " + port + " >/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST_F(RemoteStoreTest, AnUnreachableClusterIsAnErrorAtOpenNamingTheSeeds) {
  StoreOptions o = NodeOptions(dir_.Sub("x"), prefix_);
  o.remote.seeds = {"127.0.0.1:1"};
  o.remote.timeout = std::chrono::milliseconds(200);
  auto s = Store::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().ToString().find("127.0.0.1:1"), std::string::npos) << s.status().ToString();
}

}  // namespace
}  // namespace flatkv
