// AlignedBuffer: an owned, aligned, pre-faulted byte buffer.
//
// Memory on this platform is expensive to touch for the first time (see
// shared/MACHINE.md: a first-touch fault costs more than the disk read), so
// buffers are faulted in once at allocation and then reused, never freed on
// the hot path. Large buffers are 2 MiB aligned and ask for transparent huge
// pages. Thread-safety: none; owner's responsibility.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace flatkv {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocates `bytes` (rounded up to `alignment`) and touches every page.
  // data() is null when the allocation failed.
  explicit AlignedBuffer(uint64_t bytes, uint64_t alignment = 4096);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::span<std::byte> span() { return {data_, static_cast<size_t>(size_)}; }

 private:
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

inline constexpr uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline constexpr uint64_t RoundDown(uint64_t v, uint64_t a) { return v / a * a; }

}  // namespace flatkv
