// The certified sampler: sparse decode attention with a per-head error
// certificate. docs/attention.md derives it; in short, for one query head
// with scores s_i = q . k_i / sqrt(d), weights w_i = exp(s_i - max s) and
// Z = sum w_i, the output is o = N / Z with N = sum w_i v_i.
//
//   1. Read every key (scores are exact, so Z is exact), not every value.
//   2. Exponential race: draw E_i ~ Exp(1) independently (fresh per call,
//      from `seed`; E = -ln U with U a 24-bit uniform, so E is exact in
//      distribution up to that grid); at threshold tau key i is sampled iff w_i / E_i >= tau,
//      i.e. with probability pi_i = 1 - exp(-w_i / tau) (about w_i / tau:
//      sampling in proportion to attention weight), and always when
//      w_i >= cap * tau (pi_i := 1, which bounds every term).
//   3. Horvitz-Thompson: N^ = sum over sampled i of w_i v_i / pi_i is
//      unbiased for N; its error is a sum of independent zero-mean vectors
//      X_i with ||X_i|| <= L = cap * tau * max ||v|| and
//      sum E||X_i||^2 = tau * sum w_i ||v_i||^2 h(w_i / tau) <= sigma^2 =
//      tau * sum_{w_i < cap tau} w_i ||v_i||^2, as h(x) = x / (e^x - 1) <= 1
//      (keys read surely add nothing). Pinelis' Bernstein inequality in a
//      Hilbert space gives P(||N^ - N|| >= t) <= 2 exp(-t^2 / (2 sigma^2 +
//      2 L t / 3)) = delta / levels for the t solved from it.
//   4. tau runs down a geometric grid 1, 1/2, 1/4, ... (levels of it); the
//      head stops at the first level where t (1 + eps) <= eps ||N^||, which
//      on the event ||N^ - N|| < t implies ||N^ - N|| <= eps ||N||: the
//      certified relative error. A union bound over the levels makes the
//      failure probability of any claimed certificate <= delta. If no level
//      certifies, the head falls back to the exact output.
// Speed comes from step 1: V rows are read only for sampled keys.
//
// Thread-safety: the index is read-only after Build; decoding is reentrant.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attention/decode.h"

namespace flatkv::attention {

// Per-token value norms ||v_t|| [kvh][t], kept beside the cache (an engine
// appends one float per token and head as tokens arrive).
struct SamplerIndex {
  std::vector<float> vnorm;
};
[[nodiscard]] Result<SamplerIndex> BuildSamplerIndex(const F16Cache& cache);

struct SamplerOptions {
  double epsilon = 0.05;  // target relative error ||o^ - o|| / ||o||
  double delta = 0.01;    // failure probability of a claimed certificate
  int levels = 24;        // grid levels tau = 2^-l, l < levels (<= 120)
  double cap = 2.0;       // keys with w >= cap * tau are always read
  uint64_t seed = 1;      // noise seed; use a fresh one per decode step
  int force_level = -1;   // >= 0: stop at this level whatever the bound (tests)
  DecodeOptions decode;
};

struct HeadCertificate {
  int level = -1;          // grid level stopped at; -1: exact fallback
  uint32_t sampled = 0;    // value rows read for this head at that level
  double bound = 0;        // certified relative error bound t / (||N^|| - t); 0 when exact
  bool certified = false;  // the stopping rule held (or the exact fallback ran)
};

[[nodiscard]] Status CertifiedDecode(const F16Cache& cache, const SamplerIndex& index, int n_heads,
                                     std::span<const float> q, std::span<float> out, const SamplerOptions& o,
                                     std::vector<HeadCertificate>* certs = nullptr);

// The Bernstein radius t for variance proxy sigma2, bound L and failure
// probability p: the t with 2 exp(-t^2 / (2 sigma2 + 2 L t / 3)) = p.
double BernsteinRadius(double sigma2, double L, double p);

}  // namespace flatkv::attention
