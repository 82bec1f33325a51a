// Sampling as llama2.c run.c's sample(): argmax at temperature 0, otherwise
// softmax(logits / temperature) and either multinomial sampling (top_p
// outside (0, 1)) or nucleus sampling (sample_topp), with one xorshift64*
// coin per call. Departures from run.c, all for robustness: the seed is
// mixed (so 0 works), ties in the top-p sort go to the lower index, and
// when the cutoff prunes every token (near-uniform distributions with a
// tiny top_p) or logits are NaN, the pruning is skipped instead of reading
// out of bounds.
#include <algorithm>
#include <cmath>

#include "common/random.h"
#include "model/transformer.h"

namespace flatkv::model {
namespace {

// in: p (n); out: the first index of the largest value (0 when all are NaN)
int Argmax(const float* p, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (p[i] > p[best]) best = i;
  return best;
}

}  // namespace

Sampler::Sampler(int vocab_size, float temperature, float top_p, uint64_t seed)
    : vocab_size_(vocab_size), temperature_(temperature), top_p_(top_p), state_(SplitMix64(seed)) {
  if (state_ == 0) state_ = 0x9E3779B97F4A7C15ull;  // xorshift never leaves 0
}

int Sampler::Sample(std::span<const float> logits) {
  const int n = static_cast<int>(std::min<size_t>(std::max(vocab_size_, 0), logits.size()));
  if (n <= 0) return 0;
  if (!(temperature_ > 0.0f)) return Argmax(logits.data(), n);

  // softmax(logits / temperature), kept with each token's index.
  probs_.resize(n);
  float max = -INFINITY;
  for (int i = 0; i < n; ++i) {
    probs_[i] = {logits[i] / temperature_, i};
    max = std::max(max, probs_[i].first);
  }
  float sum = 0.0f;
  for (auto& [p, i] : probs_) {
    p = std::exp(p - max);
    sum += p;
  }
  for (auto& [p, i] : probs_) p /= sum;

  // The coin: xorshift64*, upper 24 bits of the high word, in [0, 1).
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  const uint32_t r32 = static_cast<uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
  const float coin = static_cast<float>(r32 >> 8) / 16777216.0f;

  if (!(top_p_ > 0.0f && top_p_ < 1.0f) || n == 1) {
    float cdf = 0.0f;
    for (int i = 0; i < n; ++i) {
      cdf += probs_[i].first;
      if (coin < cdf) return i;
    }
    return n - 1;  // rounding left the cdf just under the coin
  }

  // Nucleus: drop tokens that cannot be in it, sort by probability (ties:
  // lower index first), keep the smallest prefix whose mass exceeds top_p.
  const float cutoff = (1.0f - top_p_) / static_cast<float>(n - 1);
  int kept = 0;
  for (int i = 0; i < n; ++i)
    if (probs_[i].first >= cutoff) probs_[kept++] = probs_[i];
  if (kept == 0) {
    // Nothing was moved: keep every token that has a probability.
    for (int i = 0; i < n; ++i)
      if (!std::isnan(probs_[i].first)) probs_[kept++] = probs_[i];
    if (kept == 0) return Argmax(logits.data(), n);
  }
  std::sort(probs_.begin(), probs_.begin() + kept, [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  float cumulative = 0.0f;
  int last = kept - 1;
  for (int i = 0; i < kept; ++i) {
    cumulative += probs_[i].first;
    if (cumulative > top_p_) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (int i = 0; i <= last; ++i) {
    cdf += probs_[i].first;
    if (r < cdf) return probs_[i].second;
  }
  return probs_[last].second;
}

}  // namespace flatkv::model
