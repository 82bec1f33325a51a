#include "common/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace flatkv {

AlignedBuffer::AlignedBuffer(uint64_t bytes, uint64_t alignment) {
  if (bytes == 0) return;
  constexpr uint64_t kHuge = 2ull << 20;
  if (bytes >= kHuge && alignment < kHuge) alignment = kHuge;
  uint64_t size = RoundUp(bytes, alignment);
  void* p = std::aligned_alloc(alignment, size);
  if (p == nullptr) return;
  if (size >= kHuge) ::madvise(p, size, MADV_HUGEPAGE);
  std::memset(p, 0, size);  // fault every page in now, not on the hot path
  data_ = static_cast<std::byte*>(p);
  size_ = size;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace flatkv
