#include "remote/remote_tier.h"

#include <algorithm>
#include <cstring>

#include "common/checksum.h"

namespace flatkv::remote {
namespace {

void Put32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
void Put64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }
void PutKey(std::string* s, const BlockKey& k) {
  Put64(s, k.lo);
  Put64(s, k.hi);
}
uint32_t Get32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t Get64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
BlockKey GetKey(const char* p) { return {Get64(p), Get64(p + 8)}; }

constexpr size_t kIndexValueBytes = 24;  // object first key (16), object blocks (4), position (4)

std::string EncodeIndexValue(const RemoteRef& r) {
  std::string v;
  PutKey(&v, r.object_first);
  Put32(&v, r.object_blocks);
  Put32(&v, r.position);
  return v;
}

bool DecodeIndexValue(const std::string& v, RemoteRef* r) {
  if (v.size() != kIndexValueBytes) return false;
  r->object_first = GetKey(v.data());
  r->object_blocks = Get32(v.data() + 16);
  r->position = Get32(v.data() + 20);
  return r->object_blocks > 0 && r->position < r->object_blocks;
}

}  // namespace

std::string EncodeObjectHeader(const ObjectHeader& h) {
  std::string s;
  s.reserve(kObjectHeaderBytes);
  Put32(&s, kObjectMagic);
  s.append(reinterpret_cast<const char*>(&kObjectVersion), 2);
  const uint16_t header_bytes = kObjectHeaderBytes;
  s.append(reinterpret_cast<const char*>(&header_bytes), 2);
  Put32(&s, h.layer);
  Put32(&s, h.blocks);
  Put64(&s, h.block_layer_bytes);
  PutKey(&s, h.ns);
  PutKey(&s, h.first_key);
  PutKey(&s, h.last_key);
  Put64(&s, h.payload_checksum);
  Put64(&s, 0);                                  // reserved, zero
  Put64(&s, BlockChecksum(s.data(), s.size()));  // the header's own checksum, over bytes 0..87
  return s;
}

Result<ObjectHeader> DecodeObjectHeader(std::string_view b) {
  if (b.size() < kObjectHeaderBytes) return Status::Corruption("remote object shorter than its header");
  if (Get32(b.data()) != kObjectMagic) return Status::Corruption("remote object: bad magic");
  uint16_t version, header_bytes;
  std::memcpy(&version, b.data() + 4, 2);
  std::memcpy(&header_bytes, b.data() + 6, 2);
  if (version != kObjectVersion)
    return Status::NotSupported("remote object version " + std::to_string(version) + " (this build reads " +
                                std::to_string(kObjectVersion) + ")");
  if (header_bytes != kObjectHeaderBytes) return Status::Corruption("remote object: header size " + std::to_string(header_bytes));
  if (Get64(b.data() + 88) != BlockChecksum(b.data(), 88)) return Status::Corruption("remote object: header checksum");
  ObjectHeader h;
  h.layer = Get32(b.data() + 8);
  h.blocks = Get32(b.data() + 12);
  h.block_layer_bytes = Get64(b.data() + 16);
  h.ns = GetKey(b.data() + 24);
  h.first_key = GetKey(b.data() + 40);
  h.last_key = GetKey(b.data() + 56);
  h.payload_checksum = Get64(b.data() + 72);
  if (h.blocks == 0 || b.size() != kObjectHeaderBytes + uint64_t{h.blocks} * h.block_layer_bytes)
    return Status::Corruption("remote object: " + std::to_string(b.size()) + " bytes for " + std::to_string(h.blocks) +
                              " blocks of " + std::to_string(h.block_layer_bytes));
  if (BlockChecksum(b.data() + kObjectHeaderBytes, b.size() - kObjectHeaderBytes) != h.payload_checksum)
    return Status::Corruption("remote object: payload checksum");
  return h;
}

Result<std::unique_ptr<RemoteTier>> RemoteTier::Open(const RemoteTierOptions& options, uint32_t layers,
                                                     uint64_t block_layer_bytes) {
  if (layers == 0 || block_layer_bytes == 0) return Status::InvalidArgument("remote tier: empty KV shape");
  if (options.prefix.empty() || options.prefix.find_first_of("{}: ") != std::string::npos)
    return Status::InvalidArgument("remote tier: prefix '" + options.prefix +
                                   "' must be non-empty without '{', '}', ':' or spaces (no hash tags: objects spread over the shards)");
  if (options.object_bytes == 0)
    return Status::InvalidArgument("remote tier: object_bytes must be positive");
  if (options.max_inflight == 0) return Status::InvalidArgument("remote tier: max_inflight must be positive");
  auto cluster = ClusterClient::Connect(options.cluster);
  if (!cluster.ok()) return cluster.status();
  std::unique_ptr<RemoteTier> t(new RemoteTier());
  t->options_ = options;
  t->cluster_ = std::move(cluster).value();
  t->layers_ = layers;
  t->block_layer_bytes_ = block_layer_bytes;
  t->per_object_ = uint32_t(std::max<uint64_t>(1, options.object_bytes / block_layer_bytes));
  return t;
}

std::string RemoteTier::ObjectName(const BlockKey& first, uint32_t blocks, uint32_t layer) const {
  return options_.prefix + ":o:" + first.ToHex() + ":" + std::to_string(blocks) + ":" + std::to_string(layer);
}

std::string RemoteTier::IndexName(const BlockKey& key) const { return options_.prefix + ":i:" + key.ToHex(); }

Status RemoteTier::Publish(const BlockKey& ns, std::span<const BlockKey> keys,
                           const std::function<const std::byte*(uint32_t, uint32_t)>& slice,
                           std::vector<PublishedPiece>* written) {
  if (keys.empty()) return Status::Ok();
  // Which blocks are indexed already (published by this or another node).
  std::vector<std::string> index_names;
  for (const auto& k : keys) index_names.push_back(IndexName(k));
  std::vector<std::vector<std::string_view>> exists;
  for (const auto& n : index_names) exists.push_back({"EXISTS", n});
  auto present = cluster_->Pipeline(exists);
  std::vector<std::pair<uint32_t, uint32_t>> pieces;  // (first block, blocks) of unpublished runs, cut to objects
  for (uint32_t b = 0; b < keys.size();) {
    if (!present[b].ok()) return present[b].status();
    if (present[b]->integer > 0) {
      ++stats_.blocks_already_published;
      ++b;
      continue;
    }
    uint32_t e = b;
    while (e < keys.size() && e - b < per_object_ && present[e].ok() && present[e]->integer == 0) ++e;
    pieces.push_back({b, e - b});
    b = e;
  }
  const std::string ttl = std::to_string(options_.ttl_seconds);
  // Objects, a bounded batch at a time.
  struct Pending {
    std::string name, value;
  };
  std::vector<Pending> batch;
  auto flush = [&]() -> Status {
    std::vector<std::vector<std::string_view>> cmds;
    for (const auto& p : batch) {
      if (options_.ttl_seconds) cmds.push_back({"SET", p.name, p.value, "NX", "EX", ttl});
      else cmds.push_back({"SET", p.name, p.value, "NX"});
    }
    auto res = cluster_->Pipeline(cmds);
    for (size_t i = 0; i < res.size(); ++i) {
      if (!res[i].ok()) return Status::IoError("remote tier: writing " + batch[i].name + ": " + res[i].status().message());
      ++stats_.objects_written;
      stats_.bytes_written += batch[i].value.size();
    }
    batch.clear();
    return Status::Ok();
  };
  for (uint32_t l = 0; l < layers_; ++l) {
    for (const auto& [first, n] : pieces) {
      ObjectHeader h;
      h.layer = l;
      h.blocks = n;
      h.block_layer_bytes = block_layer_bytes_;
      h.ns = ns;
      h.first_key = keys[first];
      h.last_key = keys[first + n - 1];
      std::string payload;
      payload.reserve(n * block_layer_bytes_);
      for (uint32_t j = 0; j < n; ++j)
        payload.append(reinterpret_cast<const char*>(slice(l, first + j)), block_layer_bytes_);
      h.payload_checksum = BlockChecksum(payload.data(), payload.size());
      Pending p{ObjectName(h.first_key, n, l), EncodeObjectHeader(h)};
      p.value += payload;
      batch.push_back(std::move(p));
      if (batch.size() >= options_.max_inflight)
        if (Status st = flush(); !st.ok()) return st;
    }
  }
  if (Status st = flush(); !st.ok()) return st;
  // Index entries only once every layer's object is stored.
  std::vector<std::string> values;
  std::vector<uint32_t> blocks;
  for (const auto& [first, n] : pieces)
    for (uint32_t j = 0; j < n; ++j) {
      values.push_back(EncodeIndexValue({keys[first], n, j}));
      blocks.push_back(first + j);
    }
  std::vector<std::vector<std::string_view>> sets;
  for (size_t i = 0; i < values.size(); ++i) {
    if (options_.ttl_seconds) sets.push_back({"SET", index_names[blocks[i]], values[i], "EX", ttl});
    else sets.push_back({"SET", index_names[blocks[i]], values[i]});
  }
  auto res = cluster_->Pipeline(sets);
  for (size_t i = 0; i < res.size(); ++i)
    if (!res[i].ok()) return Status::IoError("remote tier: indexing: " + res[i].status().message());
  stats_.blocks_published += values.size();
  if (written) {
    for (const auto& [first, n] : pieces) {
      PublishedPiece p;
      p.blocks = n;
      for (uint32_t l = 0; l < layers_; ++l) {
        p.names.push_back(ObjectName(keys[first], n, l));
        p.bytes += p.names.back().size() + kObjectHeaderBytes + uint64_t{n} * block_layer_bytes_;
      }
      for (uint32_t j = 0; j < n; ++j) {
        p.names.push_back(index_names[first + j]);
        p.bytes += p.names.back().size() + kIndexValueBytes;
      }
      written->push_back(std::move(p));
    }
  }
  return Status::Ok();
}

Result<uint64_t> RemoteTier::Delete(const std::vector<std::string>& names) {
  std::vector<std::vector<std::string_view>> dels;
  for (const auto& n : names) dels.push_back({"DEL", n});
  uint64_t existed = 0;
  for (auto& r : cluster_->Pipeline(dels)) {
    if (!r.ok()) return r.status();
    existed += r->integer > 0;
  }
  return existed;
}

Result<RemoteMatch> RemoteTier::Match(std::span<const BlockKey> chain, uint32_t from) {
  RemoteMatch m;
  m.from = m.blocks = from;
  if (from >= chain.size()) return m;
  std::vector<std::string> names;
  for (const auto& k : chain.subspan(from)) names.push_back(IndexName(k));
  std::vector<std::vector<std::string_view>> gets;
  for (const auto& n : names) gets.push_back({"GET", n});
  auto res = cluster_->Pipeline(gets);
  for (size_t i = 0; i < res.size(); ++i) {
    if (!res[i].ok()) {
      if (i == 0) return res[i].status();
      break;  // a shard failing: the prefix before it still counts
    }
    RemoteRef r;
    if (res[i]->type != RespValue::kString || !DecodeIndexValue(res[i]->str, &r) || r.position > from + i) break;
    m.refs.push_back(r);
  }
  m.blocks = from + uint32_t(m.refs.size());
  return m;
}

Result<uint32_t> RemoteTier::Restore(const BlockKey& ns, std::span<const BlockKey> chain, const RemoteMatch& match,
                                     const std::function<std::byte*(uint32_t, uint32_t)>& destination,
                                     const std::function<bool(uint32_t, uint32_t)>& layer_done) {
  if (match.blocks > chain.size() || match.from > match.blocks || match.refs.size() != match.blocks - match.from)
    return Status::InvalidArgument("remote tier: a match that does not fit the chain");
  const uint32_t from = match.from;
  // Runs: consecutive blocks in one object at consecutive positions.
  struct Run {
    uint32_t start, blocks;
    RemoteRef ref;  // of the run's first block
  };
  std::vector<Run> runs;
  for (uint32_t b = from; b < match.blocks; ++b) {
    const RemoteRef& r = match.refs[b - from];
    if (!runs.empty()) {
      Run& last = runs.back();
      if (last.ref.object_first == r.object_first && last.ref.object_blocks == r.object_blocks &&
          last.ref.position + last.blocks == r.position) {
        ++last.blocks;
        continue;
      }
    }
    runs.push_back({b, 1, r});
  }
  uint32_t valid = match.blocks;
  std::vector<std::string> dead;  // runs whose object is gone or wrong: their index entries go
  struct Request {
    uint32_t layer;
    size_t run;
    std::string name;
  };
  std::vector<Request> requests;
  for (uint32_t l = 0; l < layers_; ++l)
    for (size_t i = 0; i < runs.size(); ++i)
      requests.push_back({l, i, ObjectName(runs[i].ref.object_first, runs[i].ref.object_blocks, l)});
  std::vector<std::vector<std::string_view>> gets;
  for (const Request& q : requests) gets.push_back({"GET", q.name});
  // One object's bytes (in the reader's buffer when streamed): verified
  // against the chain, then its run's slices copied to their destinations.
  auto use = [&](size_t i, std::string_view v) {
    const Request& q = requests[i];
    const Run& run = runs[q.run];
    if (run.start >= valid) return;
    auto h = DecodeObjectHeader(v);
    const uint32_t first_block = run.start - run.ref.position;  // the object's first block in this chain
    bool ok = h.ok() && h->layer == q.layer && h->blocks == run.ref.object_blocks &&
              h->block_layer_bytes == block_layer_bytes_ && h->ns == ns && h->first_key == chain[first_block] &&
              h->first_key == run.ref.object_first;
    if (ok && first_block + h->blocks <= chain.size()) ok = h->last_key == chain[first_block + h->blocks - 1];
    if (!ok) {
      ++stats_.stale_objects;
      valid = run.start;
      dead.push_back(q.name);
      return;
    }
    ++stats_.objects_read;
    stats_.bytes_read += v.size();
    const char* payload = v.data() + kObjectHeaderBytes;
    for (uint32_t j = 0; j < run.blocks && run.start + j < valid; ++j)
      if (std::byte* to = destination(q.layer, run.start + j))
        std::memcpy(to, payload + uint64_t{run.ref.position + j} * block_layer_bytes_, block_layer_bytes_);
  };
  bool go = true;
  // A sliding window of max_inflight objects over all shards: layer l's
  // objects are used while later layers' are still on the way, straight
  // from the client's read buffer.
  cluster_->Stream(
      gets, options_.max_inflight,
      [&](size_t i, Result<RespValue> res) {
        const Request& q = requests[i];
        if (runs[q.run].start < valid) {
          if (!res.ok() || (res->type != RespValue::kString)) {
            if (res.ok()) {
              ++stats_.missing_objects;  // nil: evicted or expired
              dead.push_back(q.name);
            }
            valid = runs[q.run].start;
          } else if (!res->sunk) {
            use(i, res->str);  // redone outside the stream (a redirect or a failover)
          }
        }
        if (layer_done && go && (i + 1 == requests.size() || requests[i + 1].layer != q.layer))
          go = layer_done(q.layer, valid);
        return go && valid > from;
      },
      use);
  // Index entries pointing at objects that are gone: removed, so the next match misses cleanly.
  if (!dead.empty() && valid < match.blocks) {
    std::vector<std::string> names;
    for (uint32_t b = valid; b < match.blocks; ++b) names.push_back(IndexName(chain[b]));
    std::vector<std::vector<std::string_view>> dels;
    for (const auto& n : names) dels.push_back({"DEL", n});
    for (auto& r : cluster_->Pipeline(dels))
      if (r.ok() && r->integer > 0) ++stats_.index_entries_cleaned;
  }
  return valid;
}

}  // namespace flatkv::remote
