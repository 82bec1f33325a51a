// Test helpers for io/ tests (scratch directories come from testing/test_util.h): 4096-aligned buffers,
// byte patterns, and the engines under test by name.
// Thread-safety: none beyond what each helper says.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "io/io_engine.h"
#include "io/posix_file.h"
#include "testing/test_util.h"

namespace flatkv::io::test {

// `len` zeroed bytes aligned to 4096, as O_DIRECT needs.
class AlignedBuf {
 public:
  explicit AlignedBuf(uint64_t len) : len_(len), data_(static_cast<uint8_t*>(std::aligned_alloc(4096, Capacity(len)))) {
    std::memset(data_.get(), 0, Capacity(len));
  }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return len_; }

 private:
  static uint64_t Capacity(uint64_t len) { return (len + 4095) / 4096 * 4096 + (len == 0 ? 4096 : 0); }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  uint64_t len_;
  std::unique_ptr<uint8_t, Free> data_;
};

// Byte `i` of the pattern numbered `seed`: different for every seed and
// every position within a 4 KiB page, so misplaced pages are caught.
inline uint8_t PatternByte(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>((x >> 29) ^ (x >> 47));
}
inline void FillPattern(AlignedBuf& buf, uint64_t seed) {
  for (uint64_t i = 0; i < buf.size(); ++i) buf.data()[i] = PatternByte(seed, i);
}
// Index of the first of `len` bytes that differs from pattern `seed` taken
// from position `start` on, or -1.
inline int64_t FirstMismatch(const uint8_t* data, uint64_t len, uint64_t seed, uint64_t start = 0) {
  for (uint64_t i = 0; i < len; ++i) {
    if (data[i] != PatternByte(seed, start + i)) return static_cast<int64_t>(i);
  }
  return -1;
}

inline Request MakeRequest(Op op, int fd, uint64_t offset, void* buf, uint64_t len) {
  Request r;
  r.op = op;
  r.fd = fd;
  r.offset = offset;
  r.buf = buf;
  r.len = len;
  return r;
}

// Waits until `engine` has nothing outstanding. A request counts until its
// callback has returned, so a caller woken by the callback (Execute) may
// still see it for a moment.
inline bool WaitIdle(const IoEngine& engine) {
  for (int i = 0; i < 5000; ++i) {
    if (engine.outstanding() == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// "io_uring" or "threadpool"; null when io_uring is refused on this machine.
inline std::unique_ptr<IoEngine> MakeEngineByName(const std::string& name, uint32_t queue_depth = 8,
                                                  uint32_t threads = 4) {
  if (name == "threadpool") return MakeThreadPoolEngine(threads);
  UringOptions options;
  options.queue_depth = queue_depth;
  Result<std::unique_ptr<IoEngine>> engine = MakeUringEngine(options);
  return engine.ok() ? std::move(engine).value() : nullptr;
}

}  // namespace flatkv::io::test
