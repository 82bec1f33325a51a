// The C API's chunk calls (capi_chunks.cc): chunk keys equal the engine's,
// chunk rows survive the store, re-rotated keys are bit for bit a prefill's
// (reference model, chunks stored by the engine and found through the C API),
// the NeoX style is the interleaved one on permuted elements, and every bad
// argument is refused by name without losing what is stored.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "codec/dtype.h"
#include "engine/engine.h"
#include "flatkv/flatkv.h"
#include "model/rope.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using ::flatkv::testing::ModelDataDir;
using ::flatkv::testing::TempDir;

// Fails the test with the status message; frees it.
#define C_OK(expr)                                                               \
  do {                                                                           \
    flatkv_status* st_ = (expr);                                                 \
    const std::string msg_ = flatkv_status_message(st_);                         \
    flatkv_status_destroy(st_);                                                  \
    ASSERT_EQ(st_, nullptr) << #expr << ": " << msg_;                            \
  } while (0)

// The error's message when `st` is an INVALID_ARGUMENT, else a description of what it was.
std::string InvalidMessage(flatkv_status* st) {
  std::string out = st == nullptr ? "OK" : flatkv_status_message(st);
  if (st != nullptr && flatkv_status_code(st) != FLATKV_INVALID_ARGUMENT) out = std::string("code ") +
      flatkv_code_name(flatkv_status_code(st)) + ": " + out;
  flatkv_status_destroy(st);
  return out;
}

struct StoreDeleter {
  void operator()(flatkv_store* s) const { flatkv_store_destroy(s); }
};
struct NsDeleter {
  void operator()(flatkv_namespace* n) const { flatkv_namespace_destroy(n); }
};
using StorePtr = std::unique_ptr<flatkv_store, StoreDeleter>;
using NsPtr = std::unique_ptr<flatkv_namespace, NsDeleter>;

NsPtr Namespace(const char* fingerprint) {
  flatkv_namespace* ns = nullptr;
  flatkv_status_destroy(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, fingerprint, "", "", &ns));
  return NsPtr(ns);
}

// An embedded DRAM store of `shape` (a preset name) or an MHA/MLA shape.
StorePtr OpenDram(void (*shape)(flatkv_options*), uint32_t block_tokens) {
  flatkv_options* o = flatkv_options_create();
  shape(o);
  flatkv_status_destroy(flatkv_options_set_block_tokens(o, block_tokens));
  flatkv_status_destroy(flatkv_options_set_dram_capacity(o, 64ull << 20));
  flatkv_store* s = nullptr;
  flatkv_status* st = flatkv_store_open(o, &s);
  EXPECT_EQ(st, nullptr) << flatkv_status_message(st);
  flatkv_status_destroy(st);
  flatkv_options_destroy(o);
  return StorePtr(s);
}

void MhaF16(flatkv_options* o) { flatkv_status_destroy(flatkv_options_set_shape_mha(o, 3, 2, 16, FLATKV_DTYPE_F16)); }
void MlaBf16(flatkv_options* o) { flatkv_status_destroy(flatkv_options_set_shape_mla(o, 2, 24, 8, FLATKV_DTYPE_BF16)); }

std::vector<uint32_t> Tokens(size_t n, uint32_t salt) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = 3 + static_cast<uint32_t>((i * 37 + salt * 101 + i * i) % 509);
  return t;
}

std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> b(n);
  // Random 16-bit halves that are finite f16 and bf16 values: exponents kept small.
  for (size_t i = 0; i + 1 < n; i += 2) {
    const uint16_t v = static_cast<uint16_t>((rng() & 0x83ff) | 0x3800);
    std::memcpy(&b[i], &v, 2);
  }
  return b;
}

TEST(CapiChunksTest, ChunkKeysAreTheEnginesAndNeverChainKeys) {
  NsPtr ns = Namespace("model-a");
  const auto tokens = Tokens(40, 1);
  flatkv_key keys[4];
  uint64_t n = 0;
  C_OK(flatkv_namespace_chunk_keys(ns.get(), tokens.data(), 40, 16, keys, 4, &n));
  EXPECT_EQ(n, 3u);  // 16 + 16 + a partial block of 8
  KeyHasher hasher;
  const BlockKey digest = hasher.NamespaceDigest({"model-a", "", ""});
  const auto want = hasher.ChunkKeys(digest, tokens, 16);
  ASSERT_EQ(want.size(), 3u);
  for (int b = 0; b < 3; ++b) EXPECT_TRUE(keys[b].lo == want[b].lo && keys[b].hi == want[b].hi) << b;
  EXPECT_EQ(flatkv_chunk_session(keys[0]), engine::Engine::ChunkSession(want[0]));
  flatkv_key chain[2];
  C_OK(flatkv_namespace_keys(ns.get(), nullptr, tokens.data(), 40, 16, chain, 2, &n));
  EXPECT_FALSE(chain[0].lo == keys[0].lo && chain[0].hi == keys[0].hi);
  EXPECT_NE(InvalidMessage(flatkv_namespace_chunk_keys(ns.get(), tokens.data(), 40, 16, keys, 2, &n)).find("keys holds 2"),
            std::string::npos);
  EXPECT_NE(InvalidMessage(flatkv_namespace_chunk_keys(ns.get(), tokens.data(), 0, 16, keys, 4, &n)).find("empty"),
            std::string::npos);
}

// Chunk rows in, chunk rows out: without RoPE the bytes come back as put,
// in f16 MHA and bf16 MLA, full and partial trailing blocks.
TEST(CapiChunksTest, ChunkRowsRoundTripAndLookupCountsTokens) {
  for (auto shape : {MhaF16, MlaBf16}) {
    StorePtr s = OpenDram(shape, 16);
    ASSERT_NE(s, nullptr);
    NsPtr ns = Namespace("m");
    const uint32_t layers = flatkv_store_layers(s.get());
    const uint64_t tlb = flatkv_store_token_layer_bytes(s.get());
    EXPECT_EQ(tlb * 16, flatkv_store_block_layer_bytes(s.get()));
    const auto prompt = Tokens(120, 7);
    const flatkv_chunk chunks[3] = {{10, 37}, {47, 32}, {90, 30}};
    for (int c = 0; c < 2; ++c) {  // chunk 2 is never stored
      const uint64_t n = chunks[c].length;
      const auto rows = RandomBytes(layers * n * tlb, 100 + c);
      C_OK(flatkv_store_put_chunk(s.get(), ns.get(), prompt.data() + chunks[c].begin, n, rows.data(), rows.size(), 0));
      std::vector<std::byte> back(rows.size(), std::byte{0x5a});
      uint64_t restored = 0;
      C_OK(flatkv_store_restore_chunk(s.get(), ns.get(), prompt.data() + chunks[c].begin, n, nullptr, 500, back.data(),
                                      back.size(), &restored));
      EXPECT_EQ(restored, n);
      EXPECT_EQ(0, std::memcmp(back.data(), rows.data(), rows.size())) << "chunk " << c;
    }
    uint64_t cached[3] = {9, 9, 9};
    C_OK(flatkv_store_lookup_chunks(s.get(), ns.get(), prompt.data(), prompt.size(), chunks, 3, cached));
    EXPECT_EQ(cached[0], 37u);
    EXPECT_EQ(cached[1], 32u);
    EXPECT_EQ(cached[2], 0u);
    // The same tokens elsewhere in another prompt are the same chunk.
    std::vector<uint32_t> other(5, 1);
    other.insert(other.end(), prompt.begin() + 47, prompt.begin() + 79);
    const flatkv_chunk moved = {5, 32};
    C_OK(flatkv_store_lookup_chunks(s.get(), ns.get(), other.data(), other.size(), &moved, 1, cached));
    EXPECT_EQ(cached[0], 32u);
    // Another namespace sees none of it.
    NsPtr other_ns = Namespace("m2");
    C_OK(flatkv_store_lookup_chunks(s.get(), other_ns.get(), prompt.data(), prompt.size(), chunks, 1, cached));
    EXPECT_EQ(cached[0], 0u);
    uint64_t restored = 7;
    std::vector<std::byte> miss(layers * 30 * tlb);
    C_OK(flatkv_store_restore_chunk(s.get(), ns.get(), prompt.data() + 90, 30, nullptr, 0, miss.data(), miss.size(),
                                    &restored));
    EXPECT_EQ(restored, 0u);
  }
}

// The property that defines the NeoX style: rotating x NeoX-style equals
// rotating, interleaved-style, x with each pair (f, f + d/2) moved to
// (2f, 2f + 1), bit for bit; partial rotary leaves the rest alone.
TEST(CapiChunksTest, NeoxIsInterleavedOnPermutedPairs) {
  const uint32_t head = 16, heads = 3, rotary = 12, half = rotary / 2;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> x(heads * head);
  for (float& v : x) v = u(rng);
  std::vector<float> perm = x;
  for (uint32_t h = 0; h < heads; ++h)
    for (uint32_t f = 0; f < half; ++f) {
      perm[h * head + 2 * f] = x[h * head + f];
      perm[h * head + 2 * f + 1] = x[h * head + f + half];
    }
  const uint32_t pos = 1234;
  std::vector<float> neox = x;
  model::ApplyRope(neox.data(), 1, neox.size(), 0, heads, head, &pos, {500000.0, rotary, model::RopeStyle::kNeox});
  model::ApplyRope(perm.data(), 1, perm.size(), 0, heads, head, &pos, {500000.0, rotary, model::RopeStyle::kInterleaved});
  for (uint32_t h = 0; h < heads; ++h) {
    for (uint32_t f = 0; f < half; ++f) {
      EXPECT_EQ(neox[h * head + f], perm[h * head + 2 * f]);
      EXPECT_EQ(neox[h * head + f + half], perm[h * head + 2 * f + 1]);
    }
    for (uint32_t e = rotary; e < head; ++e) EXPECT_EQ(neox[h * head + e], x[h * head + e]);
  }
  // And a rotation is a rotation: norms kept, angle pos * theta^0 on the first pair.
  const float a = x[0], b = x[half];
  EXPECT_NEAR(neox[0], a * std::cos(1234.0) - b * std::sin(1234.0), 1e-4);
}

// The point of the API: chunks the reference engine stored (keys before
// RoPE) are found by a C client with the model's namespace and restored at
// their place in a new prompt; layer 0's K and V then equal a prefill of
// that prompt bit for bit (layer 0 depends only on the token and position).
TEST(CapiChunksTest, EngineStoredChunkRestoredAtNewPositionsEqualsAPrefill) {
  auto loaded = model::LoadLlama2c(ModelDataDir() + "/stories260K.bin", ModelDataDir() + "/tok512.bin");
  ASSERT_TRUE(loaded.ok()) << "bundled stories260K not loadable from " << ModelDataDir();
  const model::Model& m = loaded.value();
  TempDir dir;
  std::vector<int> chunk(45);
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = 3 + static_cast<int>((i * 37 + 202 + i * i) % 509);
  {
    StoreOptions o;
    o.shape = engine::Engine::ShapeFor(m.config);
    o.block_tokens = 16;
    o.dram_capacity_bytes = 0;
    o.ssd_dirs = {dir.path()};
    o.ssd_capacity_bytes = 64ull << 20;
    o.segment_bytes = 4ull << 20;
    auto store = Store::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    engine::EngineOptions eo;
    eo.block_tokens = 16;
    auto e = engine::Engine::Create(m, store.value().get(), eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine::BlendPrompt p;
    p.prefix = {1, 50, 60};
    p.chunks = {chunk};
    p.tail = {70, 80};
    engine::BlendOptions bo;
    bo.mode = engine::BlendMode::kNaive;
    bo.score_tokens = 1;
    auto r = e.value().Blend(1, p, bo);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r.value().prefilled_chunk_tokens, 45u);  // computed alone and stored
    ASSERT_TRUE(store.value()->Close().ok());
  }
  flatkv_options* o = flatkv_options_create();
  C_OK(flatkv_options_set_shape_preset(o, "stories260k"));
  C_OK(flatkv_options_set_block_tokens(o, 16));
  C_OK(flatkv_options_set_dram_capacity(o, 0));
  C_OK(flatkv_options_add_ssd_dir(o, dir.path().c_str(), 64ull << 20));
  C_OK(flatkv_options_set_segment_bytes(o, 4ull << 20));
  flatkv_store* raw = nullptr;
  flatkv_status* st = flatkv_store_open(o, &raw);
  flatkv_options_destroy(o);
  ASSERT_EQ(st, nullptr) << flatkv_status_message(st);
  StorePtr s(raw);
  NsPtr ns = Namespace(m.fingerprint.c_str());
  // A new prompt: 70 other tokens, then the chunk.
  std::vector<int> prompt(70);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 5 + static_cast<int>((i * 13) % 400);
  prompt[0] = 1;
  const uint32_t pos0 = static_cast<uint32_t>(prompt.size());
  prompt.insert(prompt.end(), chunk.begin(), chunk.end());
  const std::vector<uint32_t> utokens(prompt.begin(), prompt.end());
  const flatkv_chunk where = {pos0, chunk.size()};
  uint64_t cached = 0;
  C_OK(flatkv_store_lookup_chunks(s.get(), ns.get(), utokens.data(), utokens.size(), &where, 1, &cached));
  ASSERT_EQ(cached, chunk.size());

  const int kv = m.config.kv_dim(), layers = m.config.n_layers;
  const uint64_t n = chunk.size(), tlb = flatkv_store_token_layer_bytes(s.get());
  ASSERT_EQ(tlb, 2u * kv * sizeof(float));
  std::vector<float> rows(layers * n * 2 * kv);
  const flatkv_rope rope = {m.config.rope_theta, 0, FLATKV_ROPE_INTERLEAVED};
  uint64_t restored = 0;
  C_OK(flatkv_store_restore_chunk(s.get(), ns.get(), utokens.data() + pos0, n, &rope, pos0, rows.data(),
                                  rows.size() * sizeof(float), &restored));
  ASSERT_EQ(restored, n);
  model::Transformer t(m);
  model::KvCache cache(m.config, 16, static_cast<uint32_t>(prompt.size()));
  std::vector<float> logits(m.config.vocab_size);
  t.Forward(prompt, 0, cache, logits.data());
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(0, std::memcmp(&rows[i * kv], cache.k(0, pos0 + i), kv * sizeof(float))) << "K of token " << i;
    ASSERT_EQ(0, std::memcmp(&rows[(n + i) * kv], cache.v(0, pos0 + i), kv * sizeof(float))) << "V of token " << i;
  }
  // Without RoPE the keys come back as stored, before RoPE: rotating them
  // here with the model's own rotation gives the same bytes.
  std::vector<float> plain(rows.size());
  C_OK(flatkv_store_restore_chunk(s.get(), ns.get(), utokens.data() + pos0, n, nullptr, 0, plain.data(),
                                  plain.size() * sizeof(float), &restored));
  std::vector<uint32_t> pos(n);
  std::iota(pos.begin(), pos.end(), pos0);
  t.RotateKeys(plain.data(), pos);
  EXPECT_EQ(0, std::memcmp(plain.data(), rows.data(), n * kv * sizeof(float)));
}

TEST(CapiChunksTest, BadArgumentsAreRefusedByNameAndLoseNothing) {
  StorePtr s = OpenDram(MhaF16, 16);
  ASSERT_NE(s, nullptr);
  NsPtr ns = Namespace("m");
  const auto tokens = Tokens(20, 3);
  const uint64_t tlb = flatkv_store_token_layer_bytes(s.get()), bytes = 3 * 20 * tlb;
  const auto rows = RandomBytes(bytes, 9);
  C_OK(flatkv_store_put_chunk(s.get(), ns.get(), tokens.data(), 20, rows.data(), bytes, 0));
  auto has = [&](flatkv_status* st, const char* what) {
    const std::string msg = InvalidMessage(st);
    EXPECT_NE(msg.find(what), std::string::npos) << "message: " << msg;
  };
  has(flatkv_store_put_chunk(s.get(), ns.get(), tokens.data(), 20, rows.data(), bytes - 1, 0), "takes 3 layers x 20 tokens");
  has(flatkv_store_put_chunk(s.get(), ns.get(), tokens.data(), 20, rows.data(), bytes, 3), "placement hints");
  has(flatkv_store_put_chunk(s.get(), nullptr, tokens.data(), 20, rows.data(), bytes, 0), "namespace is NULL");
  has(flatkv_store_put_chunk(s.get(), ns.get(), tokens.data(), 0, rows.data(), 0, 0), "empty");
  std::vector<std::byte> out(bytes);
  uint64_t n = 0;
  auto restore = [&](const flatkv_rope* r, uint64_t pos0, uint64_t dst_bytes) {
    return flatkv_store_restore_chunk(s.get(), ns.get(), tokens.data(), 20, r, pos0, out.data(), dst_bytes, &n);
  };
  const flatkv_rope ok = {10000, 0, FLATKV_ROPE_NEOX};
  has(restore(&ok, 0, bytes - 1), ("tokens needs " + std::to_string(bytes)).c_str());
  flatkv_rope bad = ok;
  bad.theta = 0;
  has(restore(&bad, 0, bytes), "rope.theta");
  bad = ok, bad.theta = NAN;
  has(restore(&bad, 0, bytes), "rope.theta");
  bad = ok, bad.style = 3;
  has(restore(&bad, 0, bytes), "rope.style 3");
  bad = ok, bad.rotary_dim = 7;
  has(restore(&bad, 0, bytes), "rope.rotary_dim is 7");
  bad = ok, bad.rotary_dim = 18;
  has(restore(&bad, 0, bytes), "<= 16 (the head dim)");
  has(restore(&ok, (1ull << 32) - 5, bytes), "exceed 2^32 - 1");
  const flatkv_chunk outside = {10, 11};
  uint64_t cached = 77;
  has(flatkv_store_lookup_chunks(s.get(), ns.get(), tokens.data(), 20, &outside, 1, &cached), "chunk 0 is tokens [10");
  EXPECT_EQ(cached, 77u);
  // Nothing was lost, and a good call still works.
  const flatkv_chunk all = {0, 20};
  C_OK(flatkv_store_lookup_chunks(s.get(), ns.get(), tokens.data(), 20, &all, 1, &cached));
  EXPECT_EQ(cached, 20u);
  C_OK(restore(nullptr, 0, bytes));
  EXPECT_EQ(n, 20u);
  EXPECT_EQ(0, std::memcmp(out.data(), rows.data(), bytes));
  // f16 re-rotation: the float rotation of the stored values, rounded once.
  C_OK(restore(&ok, 321, bytes));
  std::vector<float> k(20 * 32);
  for (size_t i = 0; i < k.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, &rows[2 * i], 2);
    k[i] = codec::HalfToFloat(h);
  }
  std::vector<uint32_t> pos(20);
  std::iota(pos.begin(), pos.end(), 321);
  model::ApplyRope(k.data(), 20, 32, 0, 2, 16, pos.data(), {10000, 16, model::RopeStyle::kNeox});
  for (size_t i = 0; i < k.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, &out[2 * i], 2);
    ASSERT_EQ(got, codec::FloatToHalf(k[i])) << "element " << i;
  }
  EXPECT_EQ(0, std::memcmp(out.data() + 2 * k.size(), rows.data() + 2 * k.size(), bytes / 3 - 2 * k.size()))
      << "V is delivered as stored";
}

}  // namespace
}  // namespace flatkv
