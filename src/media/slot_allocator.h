// SlotAllocator: hands out fixed-size extent slots 0..capacity-1, lowest
// free first (so SSD segments fill in order and unused ones are never
// created). Thread-safety: none; the store's lock guards it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>

namespace flatkv {

class SlotAllocator {
 public:
  explicit SlotAllocator(uint64_t capacity = 0) : capacity_(capacity) {}

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return next_ - free_.size(); }
  uint64_t free() const { return capacity_ - used(); }

  std::optional<uint64_t> Allocate() {
    if (!free_.empty()) {
      uint64_t s = *free_.begin();
      free_.erase(free_.begin());
      return s;
    }
    if (next_ < capacity_) return next_++;
    return std::nullopt;
  }
  // Marks `slot` used (recovery); false if out of range or already used.
  bool Claim(uint64_t slot) {
    if (slot >= capacity_) return false;
    while (next_ <= slot) free_.insert(next_++);
    return free_.erase(slot) == 1;
  }
  void Release(uint64_t slot) { free_.insert(slot); }

 private:
  uint64_t capacity_;
  uint64_t next_ = 0;          // slots >= next_ were never handed out
  std::set<uint64_t> free_;    // released slots below next_
};

}  // namespace flatkv
