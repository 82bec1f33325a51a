#include "testing/test_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <random>

#include "codec/dtype.h"
#include "common/aligned_buffer.h"
#include "io/fault_injection.h"

namespace flatkv::testing {

std::string SharedDataDir() {
  if (const char* env = std::getenv("FLATKV_SHARED_DATA"); env != nullptr && *env != '\0') return env;
  return std::string(FLATKV_SOURCE_DIR) + "/../shared/data";
}

std::string ModelDataDir() {
  if (const char* env = std::getenv("FLATKV_MODEL_DATA"); env != nullptr && *env != '\0') return env;
  return std::string(FLATKV_SOURCE_DIR) + "/data/models";
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

TempDir::TempDir() {
  const char* base = std::getenv("FLATKV_TEST_DIR");
  std::string templ = std::string(base ? base : "/tmp") + "/flatkv-test-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) std::abort();
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

CodedSlice EncodeKvSlice(const Codec& codec, const SliceLayout& layout, std::mt19937& rng, float scale) {
  std::normal_distribution<float> n(0, 1);
  std::vector<float> f(layout.Elements());
  for (float& x : f) x = n(rng) * (rng() % 7 == 0 ? 30.f : 1.f) * scale;
  std::vector<std::byte> raw(layout.Bytes());
  codec::FromFloat(layout.shape.dtype, f.data(), raw.data(), f.size());
  CodecContext ctx;
  CodedSlice out;
  out.encoded.resize(codec.MaxEncodedSize(layout));
  auto size = codec.Encode(ctx, layout, raw, out.encoded);
  EXPECT_TRUE(size.ok()) << size.status().ToString();
  if (!size.ok()) return {};
  out.encoded.resize(*size);
  out.decoded.resize(layout.Bytes());
  const Status s = DecodeSlice(ctx, layout, out.encoded, out.decoded);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return {};
  return out;
}

std::vector<std::byte> Payload(const Store& store, size_t blocks, uint64_t seed) {
  std::vector<std::byte> out(blocks * store.BlockBytes());
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  for (size_t i = 0; i + 8 <= out.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  return out;
}

std::vector<BlockKey> ChainKeys(uint64_t chain_id, size_t blocks, uint32_t block_tokens) {
  KeyHasher hasher;
  std::vector<uint32_t> tokens(blocks * block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((chain_id * 7919 + i * 31) % 512);
  return hasher.ChainKeys(hasher.NamespaceDigest({"test-model", "", std::to_string(chain_id)}), tokens, block_tokens);
}

StoreOptions SmallOptions(const std::string& ssd_dir, uint64_t dram_extents, uint64_t ssd_extents) {
  StoreOptions o;
  o.shape = KvShape::Mha(5, 4, 8, DType::kF32);  // 16 KiB per block and layer at 64 tokens
  o.block_tokens = 64;
  o.dram_extent_layer_bytes = 64 << 10;          // 4 blocks per DRAM extent
  o.ssd_extent_layer_bytes = 64 << 10;           // 4 blocks per SSD extent
  const uint64_t extent = kSmallExtentBytes;
  o.dram_capacity_bytes = dram_extents * extent;
  if (!ssd_dir.empty()) {
    o.ssd_dirs = {ssd_dir};
    o.ssd_capacity_bytes = ssd_extents * extent;
    o.segment_bytes = 4 * extent;
  }
  o.session_dram_share_bytes = 2 * extent;
  return o;
}

StoreOptions SsdOnlyOptions(const std::string& ssd_dir, uint64_t ssd_extents) {
  StoreOptions o = SmallOptions(ssd_dir, 0, ssd_extents);
  o.dram_capacity_bytes = 0;
  return o;
}

std::shared_ptr<io::FaultInjectionEngine> InjectFaults(StoreOptions* options) {
  auto engine = std::make_shared<io::FaultInjectionEngine>(std::shared_ptr<io::IoEngine>(io::MakeThreadPoolEngine(2)));
  options->ssd_engine = engine;
  return engine;
}

std::unique_ptr<Store> OpenStore(const StoreOptions& options) {
  auto s = Store::Open(options);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

void OnBothTiers(const TempDir& dir, uint64_t dram_extents, uint64_t ssd_extents,
                 const std::function<void(Store& store, bool ssd)>& test) {
  for (bool ssd : {true, false}) {
    auto store = OpenStore(SmallOptions(ssd ? dir.Sub("ssd") : "", dram_extents, ssd_extents));
    if (store) test(*store, ssd);
    store.reset();
    std::filesystem::remove_all(dir.Sub("ssd"));
  }
}

uint64_t HeldExtents(Store& store) {
  const StoreStats st = store.Stats();
  return st.ssd.extents + st.dram.extents;
}

uint32_t ManifestVersion(const std::string& dir) {
  std::ifstream f(dir + "/MANIFEST", std::ios::binary);
  char b[12] = {};
  f.read(b, sizeof b);
  uint32_t v;
  std::memcpy(&v, b + 8, 4);
  return v;
}

void PutUntilKilled(const StoreOptions& options, const std::string& progress, uint64_t min_done, uint32_t linger_us,
                    const std::function<Status(Store&, uint64_t chain)>& put, std::vector<uint64_t>* done) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto s = Store::Open(options);
    if (!s.ok()) ::_exit(2);
    Store& store = *s.value();
    int fd = ::open(progress.c_str(), O_CREAT | O_WRONLY | O_APPEND, 0644);
    for (uint64_t chain = 1;; ++chain) {
      if (!put(store, chain).ok()) ::_exit(3);
      // Put returned: the chain must survive.
      if (::write(fd, &chain, sizeof(chain)) != sizeof(chain)) ::_exit(4);
    }
  }
  // Let it write for a while, then kill it mid-put.
  for (int i = 0; i < 200; ++i) {
    ::usleep(10000);
    if (std::filesystem::exists(progress) && std::filesystem::file_size(progress) >= 8 * min_done) break;
  }
  ::usleep(linger_us);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with " << WEXITSTATUS(status);
  done->clear();
  FILE* f = std::fopen(progress.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  uint64_t c;
  while (std::fread(&c, sizeof(c), 1, f) == 1) done->push_back(c);
  std::fclose(f);
}

size_t KilledChainBlocks(uint64_t chain) { return 1 + chain % 7; }

Status PutKilledChain(Store& store, uint64_t chain) {
  const size_t blocks = KilledChainBlocks(chain);
  return store.Put(chain % 5, ChainKeys(chain, blocks), Payload(store, blocks, chain));
}

void KillDuringPuts(const StoreOptions& options, const std::string& progress, std::vector<uint64_t>* done,
                    std::unique_ptr<Store>* reopened) {
  ASSERT_NO_FATAL_FAILURE(PutUntilKilled(options, progress, 40, 20000, PutKilledChain, done));
  ASSERT_GT(done->size(), 5u);
  *reopened = OpenStore(options);
  ASSERT_TRUE(*reopened);
}

Status PutChain(Store& store, SessionId session, uint64_t chain, size_t blocks, PutResult* result, PutOptions po) {
  if (result != nullptr) po.result = result;
  return store.Put(session, ChainKeys(chain, blocks), Payload(store, blocks, chain), po);
}

::testing::AssertionResult RestoresChain(Store& store, uint64_t chain, size_t blocks) {
  std::vector<std::byte> got;
  const uint32_t n = RestoreAll(store, ChainKeys(chain, blocks), &got);
  if (n != blocks) return ::testing::AssertionFailure() << "chain " << chain << ": " << n << " of " << blocks << " blocks";
  if (got != Payload(store, blocks, chain)) return ::testing::AssertionFailure() << "chain " << chain << ": other bytes";
  return ::testing::AssertionSuccess();
}

void ExpectChain(Store& store, uint64_t chain, size_t blocks) {
  std::vector<std::byte> got;
  ASSERT_EQ(RestoreAll(store, ChainKeys(chain, blocks), &got), blocks) << "chain " << chain;
  ASSERT_TRUE(got == Payload(store, blocks, chain)) << "chain " << chain;
}

uint32_t RestoreAll(Store& store, const std::vector<BlockKey>& keys, std::vector<std::byte>* out) {
  auto r = store.StartRestore(keys);
  if (!r.ok()) return 0;
  Restore& restore = *r.value();
  const uint32_t layers = store.options().shape.layers;
  const uint64_t lb = store.BlockLayerBytes();
  if (out) out->assign(uint64_t{restore.hit_blocks()} * store.BlockBytes(), std::byte{0});
  for (uint32_t l = 0; l < layers; ++l) {
    auto view = restore.WaitLayer(l);
    if (!view.ok()) return 0;
    if (out)
      for (uint32_t b = 0; b < view->blocks; ++b)
        std::memcpy(out->data() + b * store.BlockBytes() + l * lb, view->data.data() + b * lb, lb);
    restore.ReleaseLayer(l);
  }
  uint32_t valid = restore.Finish();
  if (out) out->resize(uint64_t{valid} * store.BlockBytes());
  return valid;
}

uint32_t RestoreInto(Store& store, const std::vector<BlockKey>& keys, bool block_major, std::vector<std::byte>* out) {
  const uint32_t layers = store.options().shape.layers;
  const uint64_t lb = store.BlockLayerBytes(), bb = store.BlockBytes();
  // Room for every key, as the daemon and the C API give it: a put running
  // beside this one can lengthen the hit between a Match and the restore.
  const uint32_t n = static_cast<uint32_t>(keys.size());
  AlignedBuffer dst(std::max<uint64_t>(1, uint64_t{n} * bb), 4096);
  auto at = [&](uint32_t l, uint32_t b) { return block_major ? b * bb + l * lb : (uint64_t{l} * n + b) * lb; };
  RestoreTarget target;
  target.destination = [&](uint32_t l, uint32_t b) { return dst.data() + at(l, b); };
  auto r = store.StartRestore(keys, target);
  if (!r.ok()) return 0;
  for (uint32_t l = 0; l < layers; ++l) {
    auto view = r.value()->WaitLayer(l);
    if (!view.ok() || !view->data.empty()) return 0;
    r.value()->ReleaseLayer(l);
  }
  const uint32_t valid = r.value()->Finish();
  out->assign(uint64_t{valid} * bb, std::byte{0});
  for (uint32_t b = 0; b < valid; ++b)
    for (uint32_t l = 0; l < layers; ++l) std::memcpy(out->data() + b * bb + l * lb, dst.data() + at(l, b), lb);
  return valid;
}

}  // namespace flatkv::testing
