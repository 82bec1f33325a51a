// RangeAllocator: hands out runs of consecutive allocation units 0..capacity-1
// (an extent of n units), best fit, lowest start among equal fits, so SSD
// segments fill in order and unused ones are never created. A run never
// crosses a multiple of `boundary` (a segment file's end; 0: no boundary).
// Units never handed out lie above a frontier and take no memory; freed
// runs are coalesced with free neighbours in the same segment.
// Thread-safety: none; the store's lock guards it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace flatkv {

class RangeAllocator {
 public:
  explicit RangeAllocator(uint64_t capacity = 0, uint64_t boundary = 0)
      : capacity_(capacity), boundary_(boundary ? boundary : capacity) {}

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return next_ - free_below_; }
  uint64_t free() const { return capacity_ - used(); }
  uint64_t runs() const { return runs_; }  // runs handed out and not released

  // The longest run Allocate could hand out now.
  uint64_t largest_free() const {
    uint64_t best = by_len_.empty() ? 0 : by_len_.rbegin()->first;
    if (next_ < capacity_) best = std::max(best, std::min(SegmentEnd(next_), capacity_) - next_);
    if (SegmentEnd(next_) < capacity_) best = std::max(best, std::min(boundary_, capacity_ - SegmentEnd(next_)));
    return best;
  }

  std::optional<uint64_t> Allocate(uint64_t n) {
    if (n == 0 || n > boundary_) return std::nullopt;
    auto fit = by_len_.lower_bound({n, 0});
    if (fit != by_len_.end()) {
      const auto [len, start] = *fit;
      Take(start, len);
      if (len > n) Put(start + n, len - n);
      ++runs_;
      return start;
    }
    uint64_t at = next_;
    if (at / boundary_ != (at + n - 1) / boundary_) at = SegmentEnd(at);  // the rest of this segment stays free
    if (at + n > capacity_) return std::nullopt;
    if (at > next_) Put(next_, at - next_);
    next_ = at + n;
    ++runs_;
    return at;
  }

  // Marks [start, start + n) used (recovery); false if it is out of range,
  // crosses a boundary or overlaps a used unit.
  bool Claim(uint64_t start, uint64_t n) {
    if (n == 0 || start + n > capacity_ || start / boundary_ != (start + n - 1) / boundary_) return false;
    if (start >= next_) {
      for (uint64_t at = next_; at < start;) {  // what lies between stays free, a run per segment
        const uint64_t end = std::min(SegmentEnd(at), start);
        Put(at, end - at);
        at = end;
      }
      next_ = start + n;
      ++runs_;
      return true;
    }
    if (start + n > next_) return false;
    auto it = by_start_.upper_bound(start);
    if (it == by_start_.begin()) return false;
    --it;
    const auto [fs, flen] = *it;
    if (start + n > fs + flen) return false;
    Take(fs, flen);
    if (start > fs) Put(fs, start - fs);
    if (fs + flen > start + n) Put(start + n, fs + flen - start - n);
    ++runs_;
    return true;
  }

  void Release(uint64_t start, uint64_t n) {
    --runs_;
    uint64_t s = start, len = n;
    auto next = by_start_.lower_bound(start + n);
    if (next != by_start_.end() && next->first == start + n && SameSegment(start, next->first)) {
      len += next->second;
      Take(next->first, next->second);
    }
    auto prev = by_start_.lower_bound(start);
    if (prev != by_start_.begin()) {
      --prev;
      if (prev->first + prev->second == start && SameSegment(prev->first, start)) {
        s = prev->first;
        len += prev->second;
        Take(prev->first, prev->second);
      }
    }
    Put(s, len);
  }

 private:
  uint64_t SegmentEnd(uint64_t at) const { return (at / boundary_ + 1) * boundary_; }
  bool SameSegment(uint64_t a, uint64_t b) const { return a / boundary_ == b / boundary_; }
  void Put(uint64_t start, uint64_t len) {
    by_start_[start] = len;
    by_len_.insert({len, start});
    free_below_ += len;
  }
  void Take(uint64_t start, uint64_t len) {
    by_start_.erase(start);
    by_len_.erase({len, start});
    free_below_ -= len;
  }

  uint64_t capacity_;
  uint64_t boundary_;
  uint64_t next_ = 0;        // units >= next_ were never handed out
  uint64_t free_below_ = 0;  // free units below next_
  uint64_t runs_ = 0;
  std::map<uint64_t, uint64_t> by_start_;          // free runs below next_: start -> length
  std::set<std::pair<uint64_t, uint64_t>> by_len_;  // the same, as (length, start)
};

}  // namespace flatkv
