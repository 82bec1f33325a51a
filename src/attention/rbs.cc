// RBS-Attention's block statistics, mask and prefill hook (attention/rbs.h).
#include "attention/rbs.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "common/thread_pool.h"

namespace flatkv::attention {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Status RbsOptions::Validate() const {
  if (block == 0) return Status::InvalidArgument("rbs: block must be >= 1, got 0");
  if (!(base_mass > 0.0f && base_mass <= 1.0f))
    return Status::InvalidArgument("rbs: base_mass must be in (0, 1], got " + std::to_string(base_mass));
  if (local_blocks == 0) return Status::InvalidArgument("rbs: local_blocks must be >= 1, got 0");
  if (!(rescue_share > 0.0f))
    return Status::InvalidArgument("rbs: rescue_share must be > 0, got " + std::to_string(rescue_share));
  return Status::Ok();
}

void MaskCounts::Add(const MaskCounts& o) {
  causal += o.causal;
  selected += o.selected;
  base += o.base;
  rescued += o.rescued;
  forced += o.forced;
}

double RbsRunStats::rel_error() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : 0; }
double RbsRunStats::speedup() const { return mask_s + sparse_s > 0 ? dense_s / (mask_s + sparse_s) : 0; }

void UpdateKeyBlockStats(const BlockRows& k, uint32_t n_keys, int d, uint32_t block, KeyBlockStats& s) {
  if (s.d != d || s.block != block || n_keys < s.n_keys) s = KeyBlockStats{d, block, 0, {}, {}, {}};
  const uint32_t keep = s.n_keys / block;  // complete blocks never change
  const uint32_t blocks = (n_keys + block - 1) / block;
  s.centroid.resize(uint64_t{blocks} * d);
  s.radius.resize(blocks);
  s.far.resize(uint64_t{blocks} * d);
  for (uint32_t j = keep; j < blocks; ++j) {
    const uint32_t nk = std::min(block, n_keys - j * block);
    float* c = s.centroid.data() + uint64_t{j} * d;
    std::fill(c, c + d, 0.0f);
    for (uint32_t t = 0; t < nk; ++t) {
      const float* row = k.row(j, t);
      for (int x = 0; x < d; ++x) c[x] += row[x];
    }
    const float inv = 1.0f / static_cast<float>(nk);
    for (int x = 0; x < d; ++x) c[x] *= inv;
    float r2 = -1;
    uint32_t far = 0;
    for (uint32_t t = 0; t < nk; ++t) {
      const float* row = k.row(j, t);
      float dist = 0;
      for (int x = 0; x < d; ++x) dist += (row[x] - c[x]) * (row[x] - c[x]);
      if (dist > r2) {
        r2 = dist;
        far = t;
      }
    }
    s.radius[j] = std::sqrt(r2);
    std::copy_n(k.row(j, far), d, s.far.data() + uint64_t{j} * d);
  }
  s.n_keys = n_keys;
}

void SelectBlocks(const float* q, uint64_t q_stride, const uint32_t* pos, uint32_t rows, const KeyBlockStats& st,
                  const RbsOptions& o, float scale, const RbsKernels& kernels, MaskScratch& sc,
                  std::vector<uint32_t>& out, MaskCounts& counts) {
  out.clear();
  if (rows == 0) return;
  const uint32_t nb = pos[rows - 1] / o.block + 1;  // causal key blocks
  const uint32_t diag = nb - 1;
  counts.causal += nb;
  sc.pick.assign(nb, 0);  // bit 1: base, bit 2: rescue, bit 4: forced
  for (uint32_t j = diag + 1 > o.local_blocks ? diag + 1 - o.local_blocks : 0; j <= diag; ++j) sc.pick[j] |= 4;
  if (o.keep_first) sc.pick[0] |= 4;
  if (o.mode == RbsMode::kDense || nb <= 2) {
    for (uint32_t j = 0; j < nb; ++j) out.push_back(j);
    counts.selected += nb;
    counts.forced += nb;
    return;
  }
  const int d = st.d;
  sc.s.resize(nb);
  sc.u.resize(nb);
  sc.mass.assign(nb, 0.0f);
  sc.rescue.assign(nb, -std::numeric_limits<float>::infinity());
  const float log_block = std::log(static_cast<float>(o.block));
  for (uint32_t r = 0; r < rows; ++r) {
    const float* qr = q + r * q_stride;
    kernels.dots(qr, st.centroid.data(), nb, d, scale, sc.s.data());
    const bool rescue = o.mode == RbsMode::kRbs || o.mode == RbsMode::kBaseMatched;
    if (rescue) kernels.dots(qr, st.far.data(), nb, d, scale, sc.u.data());
    float m = -std::numeric_limits<float>::infinity();
    for (uint32_t j = 0; j < nb; ++j) {
      const uint64_t first = uint64_t{j} * o.block;
      sc.s[j] += first + o.block <= st.n_keys ? log_block : std::log(static_cast<float>(st.n_keys - first));
      m = std::max(m, sc.s[j]);
    }
    float z = 0;
    for (uint32_t j = 0; j < nb; ++j) z += (sc.s[j] = std::exp(sc.s[j] - m));  // s now holds exp(s - m)
    const float inv = 1.0f / z, lse = m + std::log(z);
    for (uint32_t j = 0; j < nb; ++j) {
      sc.mass[j] += sc.s[j] * inv;
      if (rescue) sc.rescue[j] = std::max(sc.rescue[j], sc.u[j] - lse);  // log of the outlier's share
    }
  }
  // Base branch: blocks by estimated share, until base_mass is covered.
  sc.order.resize(nb);
  std::iota(sc.order.begin(), sc.order.end(), 0u);
  std::sort(sc.order.begin(), sc.order.end(), [&](uint32_t a, uint32_t b) {
    return sc.mass[a] != sc.mass[b] ? sc.mass[a] > sc.mass[b] : a > b;
  });
  const double target = double(o.base_mass) * double(rows);
  if (o.mode != RbsMode::kBaseMatched) {
    double covered = 0;
    for (uint32_t j : sc.order) {
      if (covered >= target) break;
      sc.pick[j] |= 1;
      covered += sc.mass[j];
    }
  }
  if (o.mode == RbsMode::kRbs || o.mode == RbsMode::kBaseMatched) {
    const float log_share = std::log(o.rescue_share);
    for (uint32_t j = 0; j < nb; ++j)
      if (sc.rescue[j] >= log_share) sc.pick[j] |= 2;
  }
  if (o.mode == RbsMode::kBaseMatched) {
    // The count the full mask takes, here filled by the base branch's order alone.
    double covered = 0;
    uint32_t want = 0;
    for (uint32_t j : sc.order) {
      if (covered >= target) break;
      sc.pick[j] |= 1;
      covered += sc.mass[j];
    }
    for (uint32_t j = 0; j < nb; ++j) want += sc.pick[j] != 0;
    for (uint32_t j = 0; j < nb; ++j) sc.pick[j] &= 4;  // forced only
    uint32_t have = 0;
    for (uint32_t j = 0; j < nb; ++j) have += sc.pick[j] != 0;
    for (uint32_t j : sc.order) {
      if (have >= want) break;
      if (sc.pick[j] == 0) {
        sc.pick[j] |= 1;
        ++have;
      }
    }
  }
  for (uint32_t j = 0; j < nb; ++j) {
    if (sc.pick[j] == 0) continue;
    out.push_back(j);
    ++counts.selected;
    if (sc.pick[j] & 1) {
      ++counts.base;
    } else if (sc.pick[j] & 2) {
      ++counts.rescued;
    } else {
      ++counts.forced;
    }
  }
}

Result<std::unique_ptr<RbsPrefill>> RbsPrefill::Create(const model::Config& c, const RbsOptions& o,
                                                       uint32_t cache_block_tokens, int threads, bool measure_dense,
                                                       SimdLevel simd) {
  if (Status s = o.Validate(); !s.ok()) return s;
  if (cache_block_tokens != o.block)
    return Status::InvalidArgument("rbs: the KV cache's block_tokens (" + std::to_string(cache_block_tokens) +
                                   ") must equal the RBS block (" + std::to_string(o.block) + ")");
  return std::unique_ptr<RbsPrefill>(new RbsPrefill(c, o, threads, measure_dense, simd));
}

RbsPrefill::RbsPrefill(const model::Config& c, const RbsOptions& o, int threads, bool measure_dense, SimdLevel simd)
    : config_(c), options_(o), measure_dense_(measure_dense), kernels_(&RbsKernelsFor(simd)) {
  const int t = threads == 0 ? ThreadPool::HardwareThreads() : std::max(1, threads);
  if (t > 1) pool_ = std::make_unique<ThreadPool>(t);
  threads_.resize(t);
  key_stats_.resize(size_t(c.n_layers) * c.n_kv_heads);
}

RbsPrefill::~RbsPrefill() = default;

model::Transformer::AttentionHook RbsPrefill::Hook() {
  return [this](int layer, uint32_t pos0, uint32_t n, const float* q, const model::KvCache& cache, float* o) {
    Run(layer, pos0, n, q, cache, o);
  };
}

void RbsPrefill::Run(int layer, uint32_t pos0, uint32_t n, const float* q, const model::KvCache& cache, float* o) {
  using Clock = std::chrono::steady_clock;
  const model::Config& c = config_;
  const int hs = c.head_size(), group = c.n_heads / c.n_kv_heads, dim = c.dim, kv_dim = c.kv_dim();
  const uint32_t B = options_.block, n_keys = pos0 + n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const uint64_t page = n_keys > B ? uint64_t(cache.k(layer, B) - cache.k(layer, 0)) : 0;
  auto rows_of = [&](const float* base) { return BlockRows{base, page, uint64_t(kv_dim)}; };
  const auto t0 = Clock::now();
  for (int h = 0; h < c.n_kv_heads; ++h)
    UpdateKeyBlockStats(rows_of(cache.k(layer, 0) + h * hs), n_keys, hs, B, key_stats_[size_t(layer) * c.n_kv_heads + h]);
  stats_.mask_s += Seconds(t0, Clock::now());
  // Query blocks: the chunk's rows grouped by pos / B.
  std::vector<uint32_t> starts;
  for (uint32_t t = 0; t < n; ++t)
    if (t == 0 || (pos0 + t) / B != (pos0 + t - 1) / B) starts.push_back(t);
  starts.push_back(n);
  std::vector<uint32_t> pos(n);
  std::iota(pos.begin(), pos.end(), pos0);
  const int qblocks = static_cast<int>(starts.size()) - 1;
  const int tasks = qblocks * c.n_heads;
  auto task = [&](int task_id, int thread) {
    PerThread& pt = threads_[thread];
    const int qb = task_id / c.n_heads, h = task_id % c.n_heads, kvh = h / group;
    const uint32_t r0 = starts[qb], rows = starts[qb + 1] - r0;
    const float* qh = q + uint64_t{r0} * dim + h * hs;
    float* oh = o + uint64_t{r0} * dim + h * hs;
    const KeyBlockStats& ks = key_stats_[size_t(layer) * c.n_kv_heads + kvh];
    const auto a = Clock::now();
    SelectBlocks(qh, dim, pos.data() + r0, rows, ks, options_, scale, *kernels_, pt.mask, pt.blocks, pt.stats.mask);
    const auto b = Clock::now();
    BlockAttendArgs args;
    args.q = qh;
    args.q_stride = dim;
    args.pos = pos.data() + r0;
    args.rows = rows;
    args.d = hs;
    args.scale = scale;
    args.k = rows_of(cache.k(layer, 0) + kvh * hs);
    args.v = rows_of(cache.v(layer, 0) + kvh * hs);
    args.block = B;
    args.blocks = pt.blocks.data();
    args.n_blocks = static_cast<uint32_t>(pt.blocks.size());
    args.o = oh;
    args.o_stride = dim;
    pt.lse.resize(rows);
    args.lse = pt.lse.data();
    kernels_->attend(args, pt.attend);
    const auto e = Clock::now();
    pt.stats.mask_s += Seconds(a, b);
    pt.stats.sparse_s += Seconds(b, e);
    if (!measure_dense_) return;
    const uint32_t nb = pos[r0 + rows - 1] / B + 1;
    pt.all.resize(nb);
    std::iota(pt.all.begin(), pt.all.end(), 0u);
    pt.dense_o.resize(uint64_t{rows} * hs);
    pt.dense_lse.resize(rows);
    args.blocks = pt.all.data();
    args.n_blocks = nb;
    args.o = pt.dense_o.data();
    args.o_stride = hs;
    args.lse = pt.dense_lse.data();
    const auto f = Clock::now();
    kernels_->attend(args, pt.attend);
    pt.stats.dense_s += Seconds(f, Clock::now());
    for (uint32_t r = 0; r < rows; ++r) {
      pt.stats.retention_sum += std::exp(double(pt.lse[r]) - double(pt.dense_lse[r]));
      for (int x = 0; x < hs; ++x) {
        const double ref = pt.dense_o[uint64_t{r} * hs + x], got = oh[uint64_t{r} * dim + x];
        pt.stats.err2 += (got - ref) * (got - ref);
        pt.stats.ref2 += ref * ref;
      }
    }
    pt.stats.rows += rows;
  };
  if (pool_) {
    pool_->ParallelFor(tasks, task);
  } else {
    for (int i = 0; i < tasks; ++i) task(i, 0);
  }
  for (PerThread& pt : threads_) {
    stats_.mask.Add(pt.stats.mask);
    stats_.mask_s += pt.stats.mask_s;
    stats_.sparse_s += pt.stats.sparse_s;
    stats_.dense_s += pt.stats.dense_s;
    stats_.retention_sum += pt.stats.retention_sum;
    stats_.rows += pt.stats.rows;
    stats_.err2 += pt.stats.err2;
    stats_.ref2 += pt.stats.ref2;
    pt.stats = {};
  }
}

}  // namespace flatkv::attention
