#include "eval/protocol.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/random.h"

namespace flatkv::eval {
namespace {

constexpr uint32_t kPrefillChunk = 512;

// log-softmax of one logits row, in double.
void LogSoftmax(const float* logits, int n, std::vector<float>& out) {
  double mx = -1e300, sum = 0;
  for (int i = 0; i < n; ++i) mx = std::max(mx, double(logits[i]));
  for (int i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  out.resize(n);
  for (int i = 0; i < n; ++i) out[i] = float(double(logits[i]) - lse);
}

int ArgMax(const float* row, int n) { return int(std::max_element(row, row + n) - row); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const double at = p * double(v.size() - 1);
  const size_t i = size_t(at);
  return i + 1 < v.size() ? v[i] + (at - double(i)) * (v[i + 1] - v[i]) : v[i];
}

}  // namespace

double PromptResult::ppl() const { return scored ? std::exp(nll / scored) : std::nan(""); }
double PromptResult::ppl_full() const { return scored ? std::exp(nll_full / scored) : std::nan(""); }
double PromptResult::ppl_delta() const { return scored ? std::expm1((nll - nll_full) / scored) : std::nan(""); }
double PromptResult::greedy_agreement() const { return greedy_tokens ? double(greedy_common) / greedy_tokens : std::nan(""); }
double PromptResult::kl() const { return scored ? kl_sum / scored : std::nan(""); }
bool PromptResult::context_helps() const {
  return filter_scored > 0 && filter_nll_context / filter_scored <= filter_nll_none / filter_scored + std::log(0.9);
}

void CopyPositions(const model::KvCache& from, model::KvCache& to, uint32_t n) {
  const int kv = from.kv_dim();
  for (int l = 0; l < from.layers(); ++l)
    for (uint32_t p = 0; p < n; ++p) {
      std::memcpy(to.k(l, p), from.k(l, p), sizeof(float) * kv);
      std::memcpy(to.v(l, p), from.v(l, p), sizeof(float) * kv);
    }
}

PromptEvaluator::PromptEvaluator(const model::Model& model, const Prompt& prompt, const ProtocolOptions& options)
    : model_(model),
      prompt_(prompt),
      options_(options),
      tf_(model, model::TransformerOptions{.threads = options.threads, .simd = std::nullopt}),
      exact_(model.config, options.block_tokens,
             uint32_t(prompt.context.size() +
                      std::max<size_t>({prompt.continuation.size(), options.greedy_tokens + prompt.question.size(),
                                        prompt.question.size() + options.answer_tokens}) +
                      1)),
      work_(model.config, options.block_tokens, exact_.max_positions()) {}

Result<std::unique_ptr<PromptEvaluator>> PromptEvaluator::Create(const model::Model& model, const Prompt& prompt,
                                                                 const ProtocolOptions& options,
                                                                 const model::KvCache* exact_context) {
  if (prompt.context.size() < 2) return Status::InvalidArgument("eval prompt " + prompt.id + ": context under 2 tokens");
  if (prompt.continuation.size() == 1)
    return Status::InvalidArgument("eval prompt " + prompt.id + ": a continuation needs at least 2 tokens");
  if (prompt.kind == PromptKind::kRetrieval && (prompt.question.empty() || prompt.answer.empty()))
    return Status::InvalidArgument("eval prompt " + prompt.id + ": a retrieval prompt needs a question and an answer");
  const size_t need = prompt.context.size() + std::max(prompt.continuation.size(), prompt.question.size() + options.greedy_tokens);
  if (model.config.seq_len > 0 && need > size_t(model.config.seq_len))
    return Status::InvalidArgument("eval prompt " + prompt.id + ": " + std::to_string(need) +
                                   " positions exceed the model's context of " + std::to_string(model.config.seq_len));
  for (const auto* part : {&prompt.context, &prompt.continuation, &prompt.question})
    for (int t : *part)
      if (t < 0 || t >= model.config.vocab_size)
        return Status::InvalidArgument("eval prompt " + prompt.id + ": token " + std::to_string(t) +
                                       " outside the vocabulary of " + std::to_string(model.config.vocab_size));
  std::unique_ptr<PromptEvaluator> e(new PromptEvaluator(model, prompt, options));
  if (exact_context != nullptr &&
      (exact_context->max_positions() < prompt.context.size() || exact_context->layers() != model.config.n_layers ||
       exact_context->kv_dim() != model.config.kv_dim()))
    return Status::InvalidArgument("eval prompt " + prompt.id + ": the given exact cache does not hold its context");
  FLATKV_RETURN_IF_ERROR(e->Init(exact_context));
  return e;
}

std::vector<float> PromptEvaluator::Pass(model::KvCache& cache, uint32_t pos0, std::span<const int> tokens) {
  const int dim = model_.config.dim, vocab = model_.config.vocab_size;
  const uint32_t n = uint32_t(tokens.size());
  std::vector<float> x(uint64_t(n) * dim), logits(uint64_t(n) * vocab);
  tf_.Embed(tokens, x.data());
  for (int l = 0; l < model_.config.n_layers; ++l) tf_.Layer(l, pos0, n, x.data(), cache);
  tf_.Logits(x.data(), logits.data(), int(n));
  return logits;
}

std::vector<int> PromptEvaluator::Greedy(model::KvCache& cache, uint32_t pos0, std::vector<int> feed, uint32_t n) {
  const int vocab = model_.config.vocab_size;
  std::vector<int> out;
  while (out.size() < n) {
    const std::vector<float> logits = Pass(cache, pos0, feed);
    pos0 += uint32_t(feed.size());
    out.push_back(ArgMax(logits.data() + (feed.size() - 1) * vocab, vocab));
    feed = {out.back()};
  }
  return out;
}

bool PromptEvaluator::AnswerFound(const std::vector<int>& tokens) const {
  std::string text;
  int prev = -1;
  for (int t : tokens) text += model_.tokenizer ? model_.tokenizer->Decode(prev, t) : std::to_string(t) + " ", prev = t;
  return text.find(prompt_.answer) != std::string::npos;
}

Status PromptEvaluator::Init(const model::KvCache* exact_context) {
  const uint32_t C = uint32_t(prompt_.context.size());
  const auto t0 = std::chrono::steady_clock::now();
  if (exact_context != nullptr) CopyPositions(*exact_context, exact_, C);
  if (options_.query_sink) tf_.set_query_sink(options_.query_sink);
  for (uint32_t p = 0; exact_context == nullptr && p < C; p += kPrefillChunk) {
    const uint32_t n = std::min(kPrefillChunk, C - p);
    std::vector<float> x(uint64_t(n) * model_.config.dim);
    tf_.Embed(std::span(prompt_.context).subspan(p, n), x.data());
    for (int l = 0; l < model_.config.n_layers; ++l) tf_.Layer(l, p, n, x.data(), exact_);
  }
  prefill_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  tf_.set_query_sink(nullptr);
  // The greedy reference: after the context, or after the question.
  CopyPositions(exact_, work_, C);
  std::vector<int> feed = {prompt_.context.back()};
  feed.insert(feed.end(), prompt_.question.begin(), prompt_.question.end());
  greedy_ref_ = Greedy(work_, C - 1, feed, options_.greedy_tokens);
  reference_.id = prompt_.id;
  reference_.kind = prompt_.kind;
  reference_.context_tokens = C;
  FLATKV_RETURN_IF_ERROR(Measure(work_, reference_, /*reference=*/true));
  // The filter: continuation[1..] with no context.
  if (prompt_.continuation.size() >= 2) {
    const int vocab = model_.config.vocab_size;
    const auto& c = prompt_.continuation;
    const std::vector<float> logits = Pass(work_, 0, std::span(c).first(c.size() - 1));
    std::vector<float> lp;
    for (size_t i = 0; i + 1 < c.size(); ++i) {
      LogSoftmax(logits.data() + i * vocab, vocab, lp);
      reference_.filter_nll_none -= lp[c[i + 1]];
    }
  }
  return Status::Ok();
}

Status PromptEvaluator::Measure(model::KvCache& cache, PromptResult& r, bool reference) {
  const uint32_t C = uint32_t(prompt_.context.size());
  const int vocab = model_.config.vocab_size;
  std::vector<float> lp;
  const auto& cont = prompt_.continuation;
  if (!cont.empty()) {
    std::vector<int> feed = {prompt_.context.back()};
    feed.insert(feed.end(), cont.begin(), cont.end() - 1);
    const std::vector<float> logits = Pass(cache, C - 1, feed);
    if (reference) ref_logp_.resize(cont.size());
    r.scored = uint32_t(cont.size());
    for (size_t i = 0; i < cont.size(); ++i) {
      LogSoftmax(logits.data() + i * vocab, vocab, lp);
      r.nll -= lp[cont[i]];
      if (i >= 1) r.filter_nll_context -= lp[cont[i]], ++r.filter_scored;
      if (reference) {
        ref_logp_[i] = lp;
      } else {
        double kl = 0;
        const std::vector<float>& ref = ref_logp_[i];
        for (int v = 0; v < vocab; ++v) kl += std::exp(double(ref[v])) * (double(ref[v]) - lp[v]);
        r.kl_sum += std::max(0.0, kl);
      }
    }
    r.nll_full = reference ? r.nll : reference_.nll_full;
  }
  // Greedy agreement: the reference's greedy tokens teacher-forced.
  std::vector<int> feed = {prompt_.context.back()};
  feed.insert(feed.end(), prompt_.question.begin(), prompt_.question.end());
  const size_t q = feed.size();
  feed.insert(feed.end(), greedy_ref_.begin(), greedy_ref_.end() - 1);
  const std::vector<float> logits = Pass(cache, C - 1, feed);
  r.greedy_tokens = uint32_t(greedy_ref_.size());
  r.greedy_common = 0;
  while (r.greedy_common < r.greedy_tokens &&
         ArgMax(logits.data() + (q - 1 + r.greedy_common) * uint64_t(vocab), vocab) == greedy_ref_[r.greedy_common])
    ++r.greedy_common;
  if (prompt_.kind == PromptKind::kRetrieval) {
    // The answer: what a greedy decode gives; equal to the reference's
    // tokens over the common prefix, decoded for real past it.
    std::vector<int> answer;
    const uint32_t n = options_.answer_tokens;
    if (r.greedy_common >= n) {
      answer.assign(greedy_ref_.begin(), greedy_ref_.begin() + n);
    } else {
      std::vector<int> f = {prompt_.context.back()};
      f.insert(f.end(), prompt_.question.begin(), prompt_.question.end());
      answer = Greedy(cache, C - 1, f, n);
    }
    r.retrieval_correct = AnswerFound(answer) ? 1 : 0;
    r.answer_text.clear();
    int prev = -1;
    for (int t : answer) r.answer_text += model_.tokenizer ? model_.tokenizer->Decode(prev, t) : "", prev = t;
  }
  return Status::Ok();
}

Result<PromptResult> PromptEvaluator::Evaluate(const KvTransform& transform, const TransformerSetup& setup) {
  const uint32_t C = uint32_t(prompt_.context.size());
  CopyPositions(exact_, work_, C);
  if (transform) FLATKV_RETURN_IF_ERROR(transform(work_, C));
  if (setup) setup(tf_);
  PromptResult r;
  r.id = prompt_.id;
  r.kind = prompt_.kind;
  r.context_tokens = C;
  r.filter_nll_none = reference_.filter_nll_none;
  Status st = Measure(work_, r, /*reference=*/false);
  if (setup) tf_.set_attention_hook(nullptr), tf_.set_query_sink(nullptr), tf_.set_key_sink(nullptr);
  FLATKV_RETURN_IF_ERROR(st);
  // The filter is the exact cache's: a transform does not move a prompt in or out.
  r.filter_nll_context = reference_.filter_nll_context;
  r.filter_scored = reference_.filter_scored;
  return r;
}

// ---- pooling ----

double PooledPplDelta(std::span<const PromptResult* const> results) {
  double d = 0, n = 0;
  for (const PromptResult* r : results)
    if (r->scored > 0 && r->context_helps()) d += r->nll - r->nll_full, n += r->scored;
  return n > 0 ? std::expm1(d / n) : std::nan("");
}

Interval BootstrapInterval(size_t n, const std::function<double(std::span<const size_t>)>& stat, int resamples,
                           uint64_t seed) {
  if (n == 0) return {std::nan(""), std::nan("")};
  std::vector<double> vals;
  std::vector<size_t> idx(n);
  uint64_t s = seed;
  for (int b = 0; b < resamples; ++b) {
    for (size_t i = 0; i < n; ++i) idx[i] = size_t((s = SplitMix64(s)) % n);
    const double v = stat(idx);
    if (!std::isnan(v)) vals.push_back(v);
  }
  return {Percentile(vals, 0.025), Percentile(vals, 0.975)};
}

Summary Summarize(const std::vector<PromptResult>& results) {
  Summary s;
  s.prompts = uint32_t(results.size());
  std::vector<const PromptResult*> all;
  double kl = 0, kl_n = 0, greedy = 0, retr = 0;
  for (const PromptResult& r : results) {
    all.push_back(&r);
    greedy += r.greedy_agreement();
    if (r.scored > 0) {
      if (r.context_helps()) {
        ++s.ppl_prompts;
        kl += r.kl_sum, kl_n += r.scored;
      } else {
        ++s.ppl_filtered_out;
      }
    }
    if (r.retrieval_correct >= 0) ++s.retrieval_prompts, retr += r.retrieval_correct;
  }
  s.ppl_delta = PooledPplDelta(all);
  s.kl = kl_n > 0 ? kl / kl_n : std::nan("");
  s.greedy_agreement = results.empty() ? std::nan("") : greedy / double(results.size());
  s.retrieval_accuracy = s.retrieval_prompts ? retr / s.retrieval_prompts : std::nan("");
  const Interval p = BootstrapInterval(results.size(), [&](std::span<const size_t> idx) {
    std::vector<const PromptResult*> pick;
    for (size_t i : idx) pick.push_back(&results[i]);
    return PooledPplDelta(pick);
  });
  s.ppl_delta_lo = p.lo, s.ppl_delta_hi = p.hi;
  const Interval g = BootstrapInterval(results.size(), [&](std::span<const size_t> idx) {
    double sum = 0;
    for (size_t i : idx) sum += results[i].greedy_agreement();
    return sum / double(idx.size());
  });
  s.greedy_lo = g.lo, s.greedy_hi = g.hi;
  std::vector<size_t> retr_idx;
  for (size_t i = 0; i < results.size(); ++i)
    if (results[i].retrieval_correct >= 0) retr_idx.push_back(i);
  const Interval a = BootstrapInterval(retr_idx.size(), [&](std::span<const size_t> idx) {
    double sum = 0;
    for (size_t i : idx) sum += results[retr_idx[i]].retrieval_correct;
    return sum / double(idx.size());
  });
  s.retrieval_lo = a.lo, s.retrieval_hi = a.hi;
  return s;
}

}  // namespace flatkv::eval
