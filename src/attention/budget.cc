#include "attention/budget.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

namespace flatkv::attention {
namespace {

// Score order: larger first, NaN as the smallest, ties to the later token.
bool Before(float a, uint32_t ia, float b, uint32_t ib) {
  if (std::isnan(a)) a = -INFINITY;
  if (std::isnan(b)) b = -INFINITY;
  return a != b ? a > b : ia > ib;
}

std::vector<uint32_t> EvenCounts(uint64_t total, int heads, uint32_t cap) {
  std::vector<double> w(heads, 1.0);
  std::vector<uint32_t> floors(heads, 0), caps(heads, cap);
  return Distribute(total, w, floors, caps);
}

std::vector<std::vector<uint32_t>> SelectCounts(const HeadScores& s, std::span<const uint32_t> counts) {
  std::vector<std::vector<uint32_t>> out(s.n_kv_heads);
  for (int h = 0; h < s.n_kv_heads; ++h) out[h] = TopK(s.head(h), s.n_tokens, counts[h]);
  return out;
}

std::vector<std::vector<uint32_t>> AdaKvLayer(const HeadScores& s, uint32_t k, double alpha) {
  const int heads = s.n_kv_heads;
  const uint32_t n = s.n_tokens;
  const uint32_t safeguard = std::min<uint32_t>(n, static_cast<uint32_t>(std::floor(alpha * k)));
  std::vector<std::vector<uint32_t>> out(heads);
  std::vector<uint8_t> taken(static_cast<size_t>(heads) * n, 0);
  for (int h = 0; h < heads; ++h) {
    out[h] = TopK(s.head(h), n, safeguard);
    for (uint32_t t : out[h]) taken[static_cast<size_t>(h) * n + t] = 1;
  }
  // One top-k over every head's remaining tokens.
  uint64_t rest = uint64_t{k} * heads - uint64_t{safeguard} * heads;
  std::vector<uint64_t> pool;  // h * n + t
  pool.reserve(static_cast<size_t>(heads) * n);
  for (uint64_t i = 0; i < taken.size(); ++i)
    if (!taken[i]) pool.push_back(i);
  rest = std::min<uint64_t>(rest, pool.size());
  auto key = [&](uint64_t i) {
    const float v = s.s[i];
    return std::make_tuple(std::isnan(v) ? -INFINITY : v, i % n, i);
  };
  if (rest < pool.size())
    std::nth_element(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(rest), pool.end(),
                     [&](uint64_t a, uint64_t b) { return key(a) > key(b); });
  for (uint64_t j = 0; j < rest; ++j) out[pool[j] / n].push_back(static_cast<uint32_t>(pool[j] % n));
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

std::vector<uint32_t> ChampionCounts(const HeadScores& s, uint32_t k, const BudgetOptions& o) {
  const int heads = s.n_kv_heads;
  const uint32_t n = s.n_tokens;
  std::vector<double> weights(heads);
  std::vector<uint32_t> floors(heads), caps(heads, n);
  const uint32_t floor = std::min<uint32_t>(n, static_cast<uint32_t>(std::ceil(o.champion_floor * k)));
  for (int h = 0; h < heads; ++h) {
    // Max of the head's normalised finite scores (forced keeps excluded).
    double sum = 0, max = 0;
    for (uint32_t t = 0; t < n; ++t) {
      const float v = s.head(h)[t];
      if (std::isfinite(v) && v > 0) {
        sum += v;
        max = std::max<double>(max, v);
      }
    }
    floors[h] = floor;
    const double peak = sum > 0 ? max / sum : 1.0;
    const bool abnormal = sum <= 0 || peak > o.champion_abnormal_max;
    weights[h] = abnormal ? 0.0 : 1.0 / std::max(peak, 1e-6);
    if (abnormal) caps[h] = floor;
  }
  const uint64_t total = uint64_t{k} * heads;
  // If every head is abnormal (or caps bind), the layer budget goes evenly.
  uint64_t cap_sum = 0;
  for (uint32_t c : caps) cap_sum += c;
  if (cap_sum < total) std::fill(caps.begin(), caps.end(), n);
  if (std::all_of(weights.begin(), weights.end(), [](double w) { return w == 0; }))
    std::fill(weights.begin(), weights.end(), 1.0);
  return Distribute(total, weights, floors, caps);
}

std::vector<std::vector<uint32_t>> DuoLayer(const HeadScores& s, uint32_t k, const BudgetOptions& o) {
  const int heads = s.n_kv_heads;
  const uint32_t n = s.n_tokens;
  // Sink-ness: share of a head's finite score mass on the first tokens.
  std::vector<std::pair<double, int>> sink(heads);
  for (int h = 0; h < heads; ++h) {
    double all = 0, first = 0;
    for (uint32_t t = 0; t < n; ++t) {
      const float v = s.head(h)[t];
      if (!std::isfinite(v) || v <= 0) continue;
      all += v;
      if (t < o.duo_sinks) first += v;
    }
    sink[h] = {all > 0 ? first / all : 1.0, h};
  }
  std::sort(sink.begin(), sink.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  const int streaming = static_cast<int>(std::floor(o.duo_fraction * heads));
  uint32_t keep_stream = std::min({k, n, std::max(o.duo_recent, o.duo_sinks)});
  // When the retrieval heads cannot take the rest (they hold every token),
  // the streaming heads keep more recent tokens, so the budget is spent.
  const uint64_t layer = uint64_t{k} * heads, retrieval_cap = uint64_t{n} * (heads - streaming);
  if (streaming > 0 && layer > retrieval_cap + uint64_t{keep_stream} * streaming)
    keep_stream = static_cast<uint32_t>((layer - retrieval_cap + streaming - 1) / streaming);
  const uint32_t sinks = std::min(o.duo_sinks, keep_stream);
  std::vector<std::vector<uint32_t>> out(heads);
  for (int i = 0; i < streaming; ++i) {
    auto& v = out[sink[i].second];
    for (uint32_t t = 0; t < sinks; ++t) v.push_back(t);
    for (uint32_t t = std::max(sinks, n - (keep_stream - sinks)); t < n; ++t) v.push_back(t);
  }
  const std::vector<double> w(heads - streaming, 1.0);
  const std::vector<uint32_t> floors(heads - streaming, 0), caps(heads - streaming, n);
  const uint64_t rest = layer - uint64_t{keep_stream} * streaming;
  const std::vector<uint32_t> counts = Distribute(rest, w, floors, caps);
  for (int i = streaming; i < heads; ++i) out[sink[i].second] = TopK(s.head(sink[i].second), n, counts[i - streaming]);
  return out;
}

}  // namespace

std::string AllocatorName(Allocator a) {
  switch (a) {
    case Allocator::kUniform: return "uniform";
    case Allocator::kPyramid: return "pyramid";
    case Allocator::kAdaKv: return "adakv";
    case Allocator::kChampion: return "champion";
    case Allocator::kDuo: return "duo";
  }
  return "?";
}

Result<Allocator> ParseAllocator(const std::string& name) {
  for (Allocator a : {Allocator::kUniform, Allocator::kPyramid, Allocator::kAdaKv, Allocator::kChampion, Allocator::kDuo})
    if (AllocatorName(a) == name) return a;
  return Status::InvalidArgument("allocator '" + name + "' (expected uniform, pyramid, adakv, champion or duo)");
}

uint32_t KeepPerHead(uint32_t n_tokens, double ratio) {
  const auto k = static_cast<uint32_t>(std::floor(static_cast<double>(n_tokens) * (1.0 - ratio) + 1e-9));
  return std::clamp<uint32_t>(k, std::min<uint32_t>(1, n_tokens), n_tokens);
}

std::vector<uint32_t> TopK(const float* scores, uint32_t n, uint32_t count) {
  count = std::min(count, n);
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  if (count < n)
    std::nth_element(idx.begin(), idx.begin() + count, idx.end(),
                     [&](uint32_t a, uint32_t b) { return Before(scores[a], a, scores[b], b); });
  idx.resize(count);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<uint32_t> Distribute(uint64_t total, std::span<const double> weights, std::span<const uint32_t> floors,
                                 std::span<const uint32_t> caps) {
  const size_t m = weights.size();
  std::vector<uint32_t> out(m);
  uint64_t used = 0;
  for (size_t i = 0; i < m; ++i) used += (out[i] = std::min(floors[i], caps[i]));
  // Water-filling: share what is left in proportion to the weights among the
  // entries below their caps, until nothing is left or all are capped.
  std::vector<double> exact(m);
  while (used < total) {
    double wsum = 0;
    for (size_t i = 0; i < m; ++i)
      if (out[i] < caps[i]) wsum += std::max(weights[i], 0.0);
    const uint64_t left = total - used;
    if (wsum <= 0) {  // no weight left: even shares among the uncapped
      size_t open = 0;
      for (size_t i = 0; i < m; ++i) open += out[i] < caps[i];
      if (open == 0) break;
      for (size_t i = 0; i < m && used < total; ++i)
        if (out[i] < caps[i]) {
          const uint64_t add = std::min<uint64_t>({caps[i] - out[i], (left + open - 1) / open, total - used});
          out[i] += static_cast<uint32_t>(add);
          used += add;
        }
      continue;
    }
    bool capped = false;
    uint64_t given = 0;
    std::vector<std::pair<double, size_t>> rem;
    for (size_t i = 0; i < m; ++i) {
      if (out[i] >= caps[i]) continue;
      const double share = static_cast<double>(left) * std::max(weights[i], 0.0) / wsum;
      const auto whole = static_cast<uint64_t>(std::floor(share));
      const uint64_t add = std::min<uint64_t>(whole, caps[i] - out[i]);
      if (add < whole) capped = true;
      out[i] += static_cast<uint32_t>(add);
      given += add;
      if (out[i] < caps[i]) rem.push_back({share - std::floor(share), i});
    }
    used += given;
    if (capped) continue;  // redistribute what the capped entries could not take
    // Largest remainders take the last units.
    std::sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    for (size_t j = 0; j < rem.size() && used < total; ++j) {
      ++out[rem[j].second];
      ++used;
    }
    if (given == 0 && rem.empty()) break;
  }
  return out;
}

Result<Selection> Allocate(Allocator a, std::span<const HeadScores> scores, const BudgetOptions& o) {
  if (!(o.ratio >= 0 && o.ratio < 1))
    return Status::InvalidArgument("budget: ratio " + std::to_string(o.ratio) + " (expected the fraction removed, in [0, 1))");
  if (scores.empty()) return Status::InvalidArgument("budget: no layers");
  const int heads = scores[0].n_kv_heads;
  const uint32_t n = scores[0].n_tokens;
  for (size_t l = 0; l < scores.size(); ++l)
    if (scores[l].n_kv_heads != heads || scores[l].n_tokens != n ||
        scores[l].s.size() != static_cast<size_t>(heads) * n)
      return Status::InvalidArgument("budget: layer " + std::to_string(l) + " scores have another shape");
  const uint32_t k = KeepPerHead(n, o.ratio);
  const int layers = static_cast<int>(scores.size());
  Selection sel(layers);
  if (a == Allocator::kPyramid) {
    if (!(o.pyramid_beta >= 1)) return Status::InvalidArgument("budget: pyramid beta " + std::to_string(o.pyramid_beta));
    // kvpress's get_layer_budget works from the unrounded mean n * (1 - ratio).
    const double window = o.pyramid_window, mean = window > 0 ? n * (1.0 - o.ratio) : k;
    double min_num = mean / o.pyramid_beta, max_num = 2.0 * mean - min_num;
    if (window > 0 && max_num >= n - window) {
      max_num = n - window;
      min_num = 2.0 * mean - max_num;
    }
    if (window > 0 && !(n >= max_num && max_num >= min_num && min_num >= window)) {
      a = Allocator::kUniform;  // kvpress's fallback: uniform budgets, below
    } else {
      std::vector<double> w(layers);
      std::vector<uint32_t> floors(layers, std::min<uint32_t>(n, 1) * heads), caps(layers, n * static_cast<uint32_t>(heads));
      for (int l = 0; l < layers; ++l)
        w[l] = layers == 1 ? k : max_num - (max_num - min_num) * l / (layers - 1);
      const std::vector<uint32_t> per_layer = Distribute(uint64_t{k} * heads * layers, w, floors, caps);
      for (int l = 0; l < layers; ++l) sel[l] = SelectCounts(scores[l], EvenCounts(per_layer[l], heads, n));
      return sel;
    }
  }
  for (int l = 0; l < layers; ++l) {
    switch (a) {
      case Allocator::kUniform: {
        const std::vector<uint32_t> counts(heads, k);
        sel[l] = SelectCounts(scores[l], counts);
        break;
      }
      case Allocator::kAdaKv:
        if (!(o.ada_alpha >= 0 && o.ada_alpha <= 1))
          return Status::InvalidArgument("budget: ada alpha " + std::to_string(o.ada_alpha) + " (expected [0, 1])");
        sel[l] = AdaKvLayer(scores[l], k, o.ada_alpha);
        break;
      case Allocator::kChampion:
        if (!(o.champion_floor >= 0 && o.champion_floor <= 1))
          return Status::InvalidArgument("budget: champion floor " + std::to_string(o.champion_floor));
        sel[l] = SelectCounts(scores[l], ChampionCounts(scores[l], k, o));
        break;
      case Allocator::kDuo:
        if (!(o.duo_fraction >= 0 && o.duo_fraction <= 1))
          return Status::InvalidArgument("budget: duo fraction " + std::to_string(o.duo_fraction));
        sel[l] = DuoLayer(scores[l], k, o);
        break;
      case Allocator::kPyramid: break;
    }
  }
  return sel;
}

}  // namespace flatkv::attention
