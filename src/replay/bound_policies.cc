// The bounds a replay compares against: "infinite" (nothing is ever
// evicted), "infinite-lw" (the same, streamed by layer at the node's links:
// the lower bound on TTFT) and "belady" (offline optimal block eviction at
// the total capacity dram_bytes + ssd_bytes). All report every hit as
// served from DRAM; infinite and belady bound the hit rate, infinite-lw
// also the restore cost (docs/baselines.md).
//
// Thread-safety: none; driven by one simulator thread.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "replay/baselines.h"

namespace flatkv::replay {
namespace {

void ReportDramHits(uint32_t hit, uint64_t block_bytes, LookupResult* r) {
  r->hit_blocks = hit;
  r->dram_blocks = hit;
  r->dram_bytes_read = uint64_t{hit} * block_bytes;
  r->dram_requests = hit > 0 ? 1 : 0;
}

class InfinitePolicy final : public CachePolicy {
 public:
  InfinitePolicy(uint64_t block_bytes, bool layerwise) : bb_(block_bytes), layerwise_(layerwise) {}
  std::string_view name() const override { return layerwise_ ? "infinite-lw" : "infinite"; }
  bool layerwise() const override { return layerwise_; }
  bool hidden_loads() const override { return layerwise_; }  // the bound: no step waits for a load

  LookupResult Lookup(const Request& req, uint32_t /*instance*/, double /*now*/) override {
    uint32_t hit = 0;
    while (hit < req.blocks.size() && set_.count(req.blocks[hit])) ++hit;
    LookupResult r;
    ReportDramHits(hit, bb_, &r);
    return r;
  }

  InsertResult Insert(const Request& req, uint32_t /*instance*/, uint32_t hit_blocks, double /*now*/) override {
    InsertResult w;
    for (size_t i = hit_blocks; i < req.blocks.size(); ++i)
      if (set_.insert(req.blocks[i]).second) w.dram_bytes_written += bb_;
    return w;
  }

  PolicyStats Stats() const override {
    PolicyStats s;
    s.dram_used_bytes = set_.size() * bb_;  // unbounded by design
    return s;
  }

 private:
  const uint64_t bb_;
  const bool layerwise_;
  std::unordered_set<uint64_t> set_;
};

// Belady's MIN with bypass, at block granularity: on a miss the block is
// admitted only if the cache has room or the cached block used farthest in
// the future is used later than it; that block is evicted. "Future" is the
// trace's arrival order: next_[p] is the position of the next access to the
// block accessed at position p (positions number every block of every
// request in order). The simulator may look requests up slightly out of
// arrival order (per-instance queues), so a block's next use only ever moves
// forward. Memory: 4 bytes per block access, plus the cache.
class BeladyPolicy final : public CachePolicy {
 public:
  BeladyPolicy(const PolicyConfig& c, std::vector<uint64_t> base, std::vector<uint32_t> next)
      : bb_(c.block_bytes),
        dram_cap_(c.dram_bytes),
        cap_blocks_((c.dram_bytes + c.ssd_bytes) / c.block_bytes),
        trace_(c.trace),
        base_(std::move(base)),
        next_(std::move(next)) {}

  std::string_view name() const override { return "belady"; }

  LookupResult Lookup(const Request& req, uint32_t /*instance*/, double /*now*/) override {
    const size_t r = IndexOf(req);
    uint32_t hit = 0;
    while (hit < req.blocks.size() && cache_.count(req.blocks[hit])) ++hit;
    if (r != kUnknown) {
      for (size_t j = 0; j < req.blocks.size(); ++j) {
        auto it = cache_.find(req.blocks[j]);
        if (it == cache_.end()) continue;
        const uint32_t nu = next_[base_[r] + j];
        if (nu > it->second) {
          it->second = nu;
          heap_.push({nu, it->first});
        }
      }
      Compact();
    }
    LookupResult res;
    ReportDramHits(hit, bb_, &res);
    return res;
  }

  InsertResult Insert(const Request& req, uint32_t /*instance*/, uint32_t hit_blocks, double /*now*/) override {
    InsertResult w;
    const size_t r = IndexOf(req);
    if (r == kUnknown) return w;  // no future knowledge of this request: admit nothing
    for (size_t j = hit_blocks; j < req.blocks.size(); ++j) {
      const uint64_t id = req.blocks[j];
      if (cache_.count(id)) continue;
      const uint32_t nu = next_[base_[r] + j];
      if (nu == kNever || cap_blocks_ == 0) continue;  // never used again: bypass
      if (cache_.size() >= cap_blocks_) {
        const auto victim = Farthest();
        if (victim.first <= nu) continue;  // the incoming block is the farthest: bypass
        heap_.pop();
        cache_.erase(victim.second);
        ++evicted_;
      }
      cache_.emplace(id, nu);
      heap_.push({nu, id});
      w.dram_bytes_written += bb_;
    }
    Compact();
    return w;
  }

  PolicyStats Stats() const override {
    PolicyStats s;
    const uint64_t used = cache_.size() * bb_;
    s.dram_used_bytes = std::min(used, dram_cap_);  // occupancy split DRAM first
    s.ssd_used_bytes = used - s.dram_used_bytes;
    s.evicted_blocks = evicted_;
    return s;
  }

  static constexpr uint32_t kNever = std::numeric_limits<uint32_t>::max();

 private:
  static constexpr size_t kUnknown = ~size_t{0};
  using HeapEntry = std::pair<uint32_t, uint64_t>;  // (next use, block); max-heap

  // The request's index in the trace: by address when the simulator passes
  // the trace's own requests, else by (conversation, arrival).
  size_t IndexOf(const Request& req) {
    const auto& rs = trace_->requests;
    if (!rs.empty() && &req >= rs.data() && &req < rs.data() + rs.size()) return size_t(&req - rs.data());
    if (by_key_.empty()) {
      for (size_t i = 0; i < rs.size(); ++i) by_key_.emplace(Key(rs[i]), i);
    }
    auto it = by_key_.find(Key(req));
    if (it == by_key_.end() || rs[it->second].blocks.size() != req.blocks.size()) return kUnknown;
    return it->second;
  }
  static uint64_t Key(const Request& r) {
    uint64_t bits = 0;
    std::memcpy(&bits, &r.arrival_s, sizeof bits);
    return r.conversation * 0x9e3779b97f4a7c15ull ^ (bits + 0x7f4a7c159e3779b9ull);
  }

  // The valid heap top (stale entries are dropped).
  HeapEntry Farthest() {
    while (true) {
      const HeapEntry top = heap_.top();
      auto it = cache_.find(top.second);
      if (it != cache_.end() && it->second == top.first) return top;
      heap_.pop();
    }
  }

  void Compact() {
    if (heap_.size() <= 4 * cache_.size() + 1024) return;
    std::vector<HeapEntry> v;
    v.reserve(cache_.size());
    for (const auto& [id, nu] : cache_) v.push_back({nu, id});
    heap_ = std::priority_queue<HeapEntry>(std::less<HeapEntry>(), std::move(v));
  }

  const uint64_t bb_;
  const uint64_t dram_cap_;
  const uint64_t cap_blocks_;
  const Trace* trace_;
  const std::vector<uint64_t> base_;   // position of each request's first block
  const std::vector<uint32_t> next_;   // next access position per access, kNever if none
  std::unordered_map<uint64_t, uint32_t> cache_;  // block -> its next use
  std::priority_queue<HeapEntry> heap_;
  std::unordered_map<uint64_t, size_t> by_key_;  // built on first use, when requests are copies
  uint64_t evicted_ = 0;
};

}  // namespace

Result<std::unique_ptr<CachePolicy>> MakeInfinitePolicy(const PolicyConfig& config, bool layerwise) {
  if (config.block_bytes == 0) return Status::InvalidArgument("infinite: block_bytes must be > 0");
  return std::unique_ptr<CachePolicy>(new InfinitePolicy(config.block_bytes, layerwise));
}

Result<std::unique_ptr<CachePolicy>> MakeBeladyPolicy(const PolicyConfig& config) {
  if (config.block_bytes == 0) return Status::InvalidArgument("belady: block_bytes must be > 0");
  if (config.trace == nullptr) return Status::InvalidArgument("belady: needs the whole trace (config.trace)");
  const auto& rs = config.trace->requests;
  std::vector<uint64_t> base(rs.size());
  uint64_t total = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    base[i] = total;
    total += rs[i].blocks.size();
  }
  if (total >= BeladyPolicy::kNever)
    return Status::InvalidArgument("belady: trace has " + std::to_string(total) + " block accesses; at most " +
                                   std::to_string(BeladyPolicy::kNever - 1) + " are supported");
  std::vector<uint32_t> next(total, BeladyPolicy::kNever);
  std::unordered_map<uint64_t, uint32_t> seen;  // block -> its next access, scanning backwards
  for (size_t i = rs.size(); i-- > 0;) {
    for (size_t j = rs[i].blocks.size(); j-- > 0;) {
      const uint32_t p = static_cast<uint32_t>(base[i] + j);
      auto [it, fresh] = seen.try_emplace(rs[i].blocks[j], p);
      if (!fresh) {
        next[p] = it->second;
        it->second = p;
      }
    }
  }
  return std::unique_ptr<CachePolicy>(new BeladyPolicy(config, std::move(base), std::move(next)));
}

}  // namespace flatkv::replay
