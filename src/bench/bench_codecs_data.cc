#include "bench/bench_codecs_data.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "codec/dtype.h"
#include "codec/synthetic_kv.h"

namespace flatkv::tools {

uint32_t Blocks(const Dataset& d) { return (d.tokens + d.block_tokens - 1) / d.block_tokens; }

SliceLayout SliceOf(const Dataset& d, uint32_t layer, uint32_t b) {
  SliceLayout l;
  l.shape = d.shape;
  l.tokens = std::min(d.block_tokens, d.tokens - b * d.block_tokens);
  l.layer = layer;
  l.first_position = b * d.block_tokens;
  return l;
}

std::vector<std::byte> SliceBytes(const Dataset& d, uint32_t layer, uint32_t b) {
  const SliceLayout l = SliceOf(d, layer, b);
  const uint64_t row = uint64_t(d.shape.kv_heads) * d.shape.head_dim;
  std::vector<float> f(l.Elements());
  std::memcpy(f.data(), d.k[layer].data() + uint64_t(b) * d.block_tokens * row, l.tokens * row * 4);
  std::memcpy(f.data() + l.tokens * row, d.v[layer].data() + uint64_t(b) * d.block_tokens * row, l.tokens * row * 4);
  std::vector<std::byte> out(l.Bytes());
  codec::FromFloat(d.shape.dtype, f.data(), out.data(), f.size());
  return out;
}

namespace {

// Causal attention of query (t, h) over keys 0..t: out (dim), scores (t+1).
void Attend(const Dataset& d, const float* q, const std::vector<float>& k, const std::vector<float>& v, uint32_t t,
            uint32_t kvh, float* out, std::vector<double>& scores) {
  const uint32_t dim = d.shape.head_dim, kv_heads = d.shape.kv_heads;
  scores.resize(t + 1);
  double mx = -1e300;
  const double inv = 1.0 / std::sqrt(double(dim));
  for (uint32_t j = 0; j <= t; ++j) {
    const float* kr = k.data() + (uint64_t(j) * kv_heads + kvh) * dim;
    double s = 0;
    for (uint32_t c = 0; c < dim; ++c) s += double(q[c]) * kr[c];
    scores[j] = s * inv;
    mx = std::max(mx, scores[j]);
  }
  std::vector<double> acc(dim, 0.0);
  double sum = 0;
  for (uint32_t j = 0; j <= t; ++j) {
    const double p = std::exp(scores[j] - mx);
    sum += p;
    const float* vr = v.data() + (uint64_t(j) * kv_heads + kvh) * dim;
    for (uint32_t c = 0; c < dim; ++c) acc[c] += p * vr[c];
  }
  for (uint32_t c = 0; c < dim; ++c) out[c] = float(acc[c] / sum);
}

}  // namespace

Result<Quality> EvalCodec(const Dataset& d, const Codec& codec, uint32_t recent_tokens,
                          std::vector<std::vector<float>>* decoded_k, std::vector<std::vector<float>>* decoded_v) {
  Quality q;
  CodecContext ctx;
  const uint64_t row = uint64_t(d.shape.kv_heads) * d.shape.head_dim;
  double err2 = 0, ref2 = 0;
  double o_err2 = 0, o_ref2 = 0, s_err2 = 0, s_ref2 = 0;
  uint64_t s_count = 0;
  std::vector<float> o1(d.shape.head_dim), o2(d.shape.head_dim);
  std::vector<double> sc1, sc2;
  for (uint32_t l = 0; l < d.layers; ++l) {
    std::vector<float> k2(d.k[l].size()), v2(d.v[l].size());
    for (uint32_t b = 0; b < Blocks(d); ++b) {
      const SliceLayout sl = SliceOf(d, l, b);
      const std::vector<std::byte> in = SliceBytes(d, l, b);
      std::vector<std::byte> out(sl.Bytes());
      if (b * d.block_tokens >= d.tokens - std::min(d.tokens, recent_tokens) && recent_tokens > 0) {
        out = in;
        q.encoded_bytes += in.size();
      } else {
        std::vector<std::byte> enc(codec.MaxEncodedSize(sl));
        FLATKV_ASSIGN_OR_RETURN(const size_t n, codec.Encode(ctx, sl, in, enc));
        q.encoded_bytes += n;
        FLATKV_RETURN_IF_ERROR(DecodeSlice(ctx, sl, std::span(enc).first(n), out));
      }
      std::vector<float> f(sl.Elements());
      codec::ToFloat(d.shape.dtype, out.data(), f.data(), f.size());
      std::memcpy(k2.data() + uint64_t(b) * d.block_tokens * row, f.data(), sl.tokens * row * 4);
      std::memcpy(v2.data() + uint64_t(b) * d.block_tokens * row, f.data() + sl.tokens * row, sl.tokens * row * 4);
      q.elements += sl.Elements();
    }
    for (int part = 0; part < 2; ++part) {
      const auto& a = part ? d.v[l] : d.k[l];
      const auto& bb = part ? v2 : k2;
      for (size_t i = 0; i < a.size(); ++i) {
        const double e = double(a[i]) - bb[i];
        if (std::isfinite(e)) q.max_abs_err = std::max(q.max_abs_err, std::fabs(e));
        err2 += e * e;
        ref2 += double(a[i]) * a[i];
      }
    }
    const uint32_t group = d.q_heads / d.shape.kv_heads;
    for (uint32_t t : d.query_positions)
      for (uint32_t h = 0; h < d.q_heads; ++h) {
        const float* qv = d.q[l].data() + (uint64_t(t) * d.q_heads + h) * d.shape.head_dim;
        Attend(d, qv, d.k[l], d.v[l], t, h / group, o1.data(), sc1);
        Attend(d, qv, k2, v2, t, h / group, o2.data(), sc2);
        for (uint32_t c = 0; c < d.shape.head_dim; ++c) {
          o_err2 += double(o1[c] - o2[c]) * (o1[c] - o2[c]);
          o_ref2 += double(o1[c]) * o1[c];
        }
        for (uint32_t j = 0; j <= t; ++j) {
          s_err2 += (sc1[j] - sc2[j]) * (sc1[j] - sc2[j]);
          s_ref2 += sc1[j] * sc1[j];
        }
        s_count += t + 1;
      }
    if (decoded_k) decoded_k->push_back(std::move(k2));
    if (decoded_v) decoded_v->push_back(std::move(v2));
  }
  q.bits_per_element = 8.0 * double(q.encoded_bytes) / double(q.elements);
  q.rel_mse = err2 / std::max(ref2, 1e-300);
  q.attn_output_rel_err = std::sqrt(o_err2 / std::max(o_ref2, 1e-300));
  q.attn_score_rmse = std::sqrt(s_err2 / std::max<double>(1, s_count));
  q.attn_score_rel = std::sqrt(s_err2 / std::max(s_ref2, 1e-300));
  return q;
}

Dataset SyntheticLlamaDataset(uint32_t tokens, uint32_t layers, DType dtype) {
  Dataset d;
  d.name = "synthetic-llama3.1-8b";
  d.shape = KvShape::Mha(layers, 8, 128, dtype);
  d.layers = layers;
  d.tokens = tokens;
  d.q_heads = 32;
  d.rope_theta = codec::kSyntheticRopeTheta;
  const uint64_t row = 8 * 128;
  for (uint32_t l = 0; l < layers; ++l) {
    SliceLayout sl;
    sl.shape = d.shape;
    sl.shape.dtype = DType::kF32;
    sl.tokens = tokens;
    sl.layer = l;
    sl.first_position = 0;
    std::vector<std::byte> b(sl.Bytes());
    codec::FillSyntheticKv(sl, 1234, b);
    std::vector<float> f(sl.Elements());
    std::memcpy(f.data(), b.data(), b.size());
    for (float& x : f) x = codec::RoundToDType(dtype, x);
    d.k.emplace_back(f.begin(), f.begin() + tokens * row);
    d.v.emplace_back(f.begin() + tokens * row, f.end());
    std::vector<float> q(uint64_t(tokens) * 32 * 128);
    codec::FillSyntheticQueries(sl, 32, 1234, q);
    d.q.push_back(std::move(q));
  }
  for (uint32_t i = 0; i < 48; ++i) d.query_positions.push_back(tokens - 1 - i * (tokens / 48));
  return d;
}

Result<Dataset> ReadKvDump(const std::string& path, DType dtype) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("--kv " + path + ": cannot open");
  char magic[8];
  uint32_t h[8];
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(h), sizeof h);
  if (!in || std::memcmp(magic, "FKVDUMP1", 8) != 0) return Status::Corruption("--kv " + path + ": not a dump-kv file");
  const uint32_t version = h[0], layers = h[1], heads = h[2], kv_heads = h[3], hs = h[4], n = h[5], dt = h[6];
  if (version != 1 || dt != 1) return Status::Corruption("--kv " + path + ": unsupported version or dtype");
  if (!layers || !heads || !kv_heads || !hs || !n || heads % kv_heads || layers > 1024 || heads > 4096 || hs > 4096 ||
      n > (1u << 20))
    return Status::Corruption("--kv " + path + ": implausible sizes");
  Dataset d;
  d.name = "dump:" + path;
  d.shape = KvShape::Mha(layers, kv_heads, hs, dtype);
  d.layers = layers;
  d.tokens = n;
  d.q_heads = heads;
  d.tokens_ids.resize(n);
  in.read(reinterpret_cast<char*>(d.tokens_ids.data()), 4 * n);
  auto read_block = [&](uint32_t nh, std::vector<float>& out, bool round) -> bool {
    std::vector<float> raw(uint64_t(nh) * n * hs);
    in.read(reinterpret_cast<char*>(raw.data()), raw.size() * 4);
    out.assign(raw.size(), 0);
    for (uint32_t hh = 0; hh < nh; ++hh)  // [h][t][d] -> [t][h][d]
      for (uint32_t t = 0; t < n; ++t)
        for (uint32_t c = 0; c < hs; ++c) {
          const float x = raw[(uint64_t(hh) * n + t) * hs + c];
          out[(uint64_t(t) * nh + hh) * hs + c] = round ? codec::RoundToDType(dtype, x) : x;
        }
    return bool(in);
  };
  for (uint32_t l = 0; l < layers; ++l) {
    d.q.emplace_back();
    d.k.emplace_back();
    d.v.emplace_back();
    if (!read_block(heads, d.q.back(), false) || !read_block(kv_heads, d.k.back(), true) ||
        !read_block(kv_heads, d.v.back(), true))
      return Status::Corruption("--kv " + path + ": truncated at layer " + std::to_string(l));
  }
  for (uint32_t t = 0; t < n; ++t) d.query_positions.push_back(t);
  return d;
}

}  // namespace flatkv::tools
