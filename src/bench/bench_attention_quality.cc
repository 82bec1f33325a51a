// The quality half of `flatkv bench attention` (bench_attention.h): selectors
// on stories260K over a short story, the model's own domain.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "attention/compact.h"
#include "model/transformer.h"
#include "bench/bench_attention.h"

namespace flatkv::tools {
namespace {

// An original story in the TinyStories style (the checkpoint's training domain).
constexpr const char* kStory =
    "Once upon a time, there was a little girl named Lily. She lived in a small house near a big forest with her "
    "mom, her dad and her dog Max. Every morning Lily and Max went to the garden to look at the flowers. One day "
    "Lily saw a red ball under a tree. She wanted to play with it, but the ball was stuck in a hole. Lily pulled "
    "and pulled, but the ball did not move. Max came to help. He dug with his paws and the ball rolled out. Lily "
    "was very happy. She said, \"Thank you, Max! You are a good dog.\" They played with the ball all day. When the "
    "sun went down, mom called them home for dinner. Lily told mom about the red ball and the hole under the tree. "
    "Mom smiled and said, \"You and Max are a good team.\" The next day it rained. Lily was sad because she could "
    "not go to the garden. She sat by the window and looked at the rain. Then she had an idea. She took her "
    "crayons and drew a picture of the garden, the tree, the red ball and Max. Dad saw the picture and said it "
    "was beautiful. He put it on the wall. When the rain stopped, Lily and Max ran outside. The grass was wet "
    "and the flowers were bright. Under the tree they found a little bird. The bird was cold and could not fly. "
    "Lily was careful. She put the bird in a box with a soft towel. Mom gave the bird some water. The next "
    "morning the bird was strong again. It sang a happy song and flew up into the tree. Lily waved and said, "
    "\"Goodbye, little bird!\" Max barked. From that day, the bird sang for Lily every morning, and Lily always "
    "remembered to be kind to the animals in the forest. One morning Tom, the boy from the next house, came to "
    "play. Tom had a blue kite. Lily and Tom ran to the hill with the kite and Max ran after them. The wind was "
    "strong and the kite flew high in the sky. Lily laughed and Tom laughed too. Then the kite got stuck in the "
    "big tree, next to the little bird. The bird looked at the kite. Lily said, \"Do not worry, Tom. Max helped "
    "me with the ball. We can get the kite.\" They shook the branch gently and the kite fell down. Tom said "
    "thank you, and they shared the red ball and the blue kite all afternoon.";

struct Method {
  std::string scorer;
  attention::Allocator allocator;
};

// Runs `tokens` through a fresh transformer from position 0, recording every
// query [layer][pos][h][d]; returns the cache and, for positions >= from,
// the logits [pos - from][vocab].
struct DenseRun {
  std::unique_ptr<model::KvCache> cache;
  std::vector<float> q;  // [layer][pos][h][d]
  std::vector<std::vector<float>> logits;
};

DenseRun RunDense(const model::Model& m, std::span<const int> tokens, uint32_t from) {
  const model::Config& c = m.config;
  const size_t n = tokens.size(), qd = static_cast<size_t>(c.n_heads) * c.head_size();
  DenseRun r;
  r.cache = std::make_unique<model::KvCache>(c, 64, static_cast<uint32_t>(n));
  r.q.resize(c.n_layers * n * qd);
  model::Transformer tf(m);
  tf.set_query_sink([&](int layer, uint32_t pos, const float* q) {
    std::copy_n(q, qd, r.q.data() + (layer * n + pos) * qd);
  });
  std::vector<float> logits(c.vocab_size);
  tf.Forward(tokens.first(from), 0, *r.cache, logits.data());
  for (size_t p = from; p < n; ++p) {
    tf.Forward(tokens.subspan(p, 1), static_cast<uint32_t>(p), *r.cache, logits.data());
    r.logits.push_back(logits);
  }
  return r;
}

// Queries [h][j][d] of positions `pos` of layer l from a [layer][pos][h][d] capture.
std::vector<float> Gather(const model::Config& c, const std::vector<float>& q, size_t n, int l,
                          const std::vector<uint32_t>& pos) {
  const int hs = c.head_size();
  std::vector<float> out(static_cast<size_t>(c.n_heads) * pos.size() * hs);
  for (int h = 0; h < c.n_heads; ++h)
    for (size_t j = 0; j < pos.size(); ++j)
      std::copy_n(q.data() + ((l * n + pos[j]) * c.n_heads + h) * hs, hs, out.data() + (h * pos.size() + j) * hs);
  return out;
}

double LogSoftmaxAt(const std::vector<float>& logits, int target, std::vector<double>* probs) {
  double max = logits[0];
  for (float v : logits) max = std::max<double>(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(v - max);
  if (probs) {
    probs->resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) (*probs)[i] = std::exp(logits[i] - max) / sum;
  }
  return logits[target] - max - std::log(sum);
}

}  // namespace

std::unique_ptr<attention::Scorer> MakeScorer(const std::string& name) {
  if (name == "streaming") return attention::MakeStreamingScorer(4);
  if (name == "h2o") return attention::MakeH2oScorer(0.1);
  if (name == "snapkv") return attention::MakeSnapKvScorer(32, 7);
  if (name == "snapkv_kvpress")
    return attention::MakeSnapKvScorer(KvpressDefaults::kWindow, KvpressDefaults::kKernel, attention::Pool::kAvg);
  if (name == "agentkv") return attention::MakeAgentKvScorer(true, 7);
  return attention::MakeRehearsalScorer(7);
}

Result<std::vector<SelectorRow>> RunSelectorQuality(const model::Model& m, const QualitySetup& setup,
                                                    uint32_t* text_tokens) {
  const model::Config& c = m.config;
  if (!m.tokenizer) return Status::InvalidArgument("bench attention: the model has no tokenizer");
  FLATKV_ASSIGN_OR_RETURN(std::vector<int> text, m.tokenizer->Encode(kStory, true));
  const uint32_t P = setup.prompt_tokens, T = setup.continuation_tokens;
  if (text.size() < size_t{P} + T)
    return Status::InvalidArgument("bench attention: the story has " + std::to_string(text.size()) +
                                   " tokens, need " + std::to_string(P + T));
  text.resize(P + T);
  *text_tokens = P + T;
  const size_t n = text.size();
  const int hs = c.head_size(), group = c.n_heads / c.n_kv_heads;
  DenseRun dense = RunDense(m, text, P);

  // Rehearsal probes: a question quoting 24 tokens from the middle of the
  // prompt, asked after it; its queries score the cache (no future tokens).
  std::vector<int> quoted(text.begin(), text.begin() + P);
  quoted.insert(quoted.end(), text.begin() + P / 2, text.begin() + P / 2 + 24);
  DenseRun probe_run = RunDense(m, quoted, static_cast<uint32_t>(quoted.size()));
  std::vector<uint32_t> probe_pos(24);
  for (uint32_t j = 0; j < 24; ++j) probe_pos[j] = P + j;
  // AgentKV phases: "think", "act", "tool" buffers of 16 queries at the ends
  // of the prompt's first, second and third thirds (the recent window is the last).
  std::vector<std::vector<uint32_t>> phase_pos(3);
  for (int ph = 0; ph < 3; ++ph)
    for (uint32_t j = 0; j < 16; ++j) phase_pos[ph].push_back((ph + 1) * P / 3 - 16 + j - (ph == 2 ? 32 : 0));
  std::vector<std::vector<float>> probe_q(c.n_layers), phase_q(c.n_layers * 3);
  std::vector<float> prompt_q(static_cast<size_t>(c.n_layers) * c.n_heads * P * hs);  // [layer][h][t][d]
  std::vector<uint32_t> all_prompt(P);
  for (uint32_t t = 0; t < P; ++t) all_prompt[t] = t;
  for (int l = 0; l < c.n_layers; ++l) {
    probe_q[l] = Gather(c, probe_run.q, quoted.size(), l, probe_pos);
    for (int ph = 0; ph < 3; ++ph) phase_q[l * 3 + ph] = Gather(c, dense.q, n, l, phase_pos[ph]);
    const auto g = Gather(c, dense.q, n, l, all_prompt);
    std::copy(g.begin(), g.end(), prompt_q.begin() + static_cast<size_t>(l) * c.n_heads * P * hs);
  }
  const std::vector<uint32_t> sees_all(24, UINT32_MAX);

  const std::vector<Method> methods = {
      {"streaming", attention::Allocator::kUniform}, {"h2o", attention::Allocator::kUniform},
      {"snapkv", attention::Allocator::kUniform},    {"snapkv", attention::Allocator::kPyramid},
      {"snapkv", attention::Allocator::kAdaKv},      {"snapkv", attention::Allocator::kChampion},
      {"snapkv", attention::Allocator::kDuo},
      {"agentkv", attention::Allocator::kUniform},   {"agentkv", attention::Allocator::kAdaKv},
      {"rehearsal", attention::Allocator::kUniform}, {"rehearsal", attention::Allocator::kAdaKv},
      {"rehearsal", attention::Allocator::kChampion}};
  std::vector<SelectorRow> rows;
  std::vector<double> a(n), probs_d, probs_c;
  std::vector<float> logits(c.vocab_size);
  for (double budget : setup.budgets)
    for (const Method& me : methods) {
      auto scorer = MakeScorer(me.scorer);
      attention::CompactOptions co;
      co.scorer = scorer.get();
      co.allocator = me.allocator;
      co.budget.ratio = budget;
      co.phases.resize(c.n_layers);
      co.probes.resize(c.n_layers);
      for (int l = 0; l < c.n_layers; ++l) {
        for (int ph = 0; ph < 3; ++ph) co.phases[l].push_back({phase_q[l * 3 + ph], phase_pos[ph]});
        co.probes[l] = {probe_q[l], sees_all};
      }
      FLATKV_ASSIGN_OR_RETURN(attention::CompactedKv ckv, attention::ScoreAndCompact(*dense.cache, c, P, prompt_q, co));
      SelectorRow row;
      row.name = me.scorer + "+" + attention::AllocatorName(me.allocator);
      row.budget = budget;
      // Attention level: the dense run's continuation queries over all keys
      // versus over the kept prompt keys plus the continuation.
      double mass = 0, err = 0;
      uint64_t count = 0;
      std::vector<uint8_t> kept(P);
      for (int l = 0; l < c.n_layers; ++l)
        for (int h = 0; h < c.n_heads; ++h) {
          const auto& head = ckv.at(l, h / group);
          std::fill(kept.begin(), kept.end(), 0);
          for (uint32_t p : head.pos) kept[p] = 1;
          for (uint32_t p = P; p < n; ++p) {
            const float* q = dense.q.data() + ((l * n + p) * c.n_heads + h) * hs;
            double max = -INFINITY;
            for (uint32_t t = 0; t <= p; ++t) {
              const float* k = dense.cache->k(l, t) + (h / group) * hs;
              double dot = 0;
              for (int j = 0; j < hs; ++j) dot += double(q[j]) * k[j];
              a[t] = dot / std::sqrt(double(hs));
              max = std::max(max, a[t]);
            }
            double z = 0, zk = 0, zp = 0, zpk = 0;
            std::vector<double> of(hs, 0.0), ok(hs, 0.0);
            for (uint32_t t = 0; t <= p; ++t) {
              a[t] = std::exp(a[t] - max);
              const bool keep = t >= P || kept[t];
              z += a[t];
              if (keep) zk += a[t];
              if (t < P) {
                zp += a[t];
                if (keep) zpk += a[t];
              }
              const float* v = dense.cache->v(l, t) + (h / group) * hs;
              for (int j = 0; j < hs; ++j) {
                of[j] += a[t] * v[j];
                if (keep) ok[j] += a[t] * v[j];
              }
            }
            double num = 0, den = 0;
            for (int j = 0; j < hs; ++j) {
              num += (ok[j] / zk - of[j] / z) * (ok[j] / zk - of[j] / z);
              den += (of[j] / z) * (of[j] / z);
            }
            mass += zp > 0 ? zpk / zp : 1.0;
            err += std::sqrt(num / std::max(den, 1e-30));
            ++count;
          }
        }
      row.retained_mass = mass / count;
      row.attn_err = err / count;
      // Model level: teacher-force the continuation from the compacted KV.
      model::Transformer tf(m);
      tf.set_attention_hook(attention::CompactedAttention(ckv, c));
      model::KvCache cache(c, 64, static_cast<uint32_t>(n));
      double kl = 0, nll_c = 0, nll_d = 0;
      for (uint32_t i = 0; i + 1 < T; ++i) {
        tf.Forward(std::span<const int>(text).subspan(P + i, 1), P + i, cache, logits.data());
        const int target = text[P + i + 1];
        nll_c -= LogSoftmaxAt(logits, target, &probs_c);
        nll_d -= LogSoftmaxAt(dense.logits[i], target, &probs_d);
        for (size_t v = 0; v < probs_d.size(); ++v)
          if (probs_d[v] > 0) kl += probs_d[v] * (std::log(probs_d[v]) - std::log(std::max(probs_c[v], 1e-300)));
      }
      row.kl = kl / (T - 1);
      row.ppl = std::exp(nll_c / (T - 1));
      row.ppl_dense = std::exp(nll_d / (T - 1));
      rows.push_back(row);
    }
  return rows;
}

}  // namespace flatkv::tools
