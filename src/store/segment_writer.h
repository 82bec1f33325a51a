// SegmentWriter: the SSD half of a Put, shared by raw and coded writes.
// Callers stage each layer's run of slices in a recycled window buffer
// (Stage), fill it, and Submit one aligned write; at most one wave of
// staging (64 MiB) is in flight: a full wave is waited for and its buffer
// reused. Finish waits for every write, fdatasyncs the touched files when
// sync_writes is set, and returns the first error.
// Thread-safety: one Put's writer, used by one thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "store/latch.h"
#include "store/store_impl.h"

namespace flatkv {

class SegmentWriter {
 public:
  static constexpr uint64_t kWaveBytes = 64ull << 20;  // staging bytes in flight per Put

  explicit SegmentWriter(StoreImpl& store) : store_(store) {}
  ~SegmentWriter() { (void)Finish(); }

  // Room for `bytes` of staging. When the wave is full, waits for it first
  // and grows the buffer to max(bytes, min(want, kWaveBytes)) if smaller.
  Result<std::byte*> Stage(uint64_t bytes, uint64_t want) {
    if (staged_ + bytes > staging_.size()) {
      FLATKV_RETURN_IF_ERROR(latch_.Wait());
      staged_ = 0;
      const uint64_t size = std::max(bytes, std::min(want, kWaveBytes));
      if (staging_.size() < size) {
        if (staging_.size() > 0) store_.ReleaseWindow(std::move(staging_));
        staging_ = store_.AcquireWindow(size);
      }
    }
    std::byte* dst = staging_.data() + staged_;
    staged_ += bytes;
    return dst;
  }

  // Writes `bytes` staged at `src` to `fd` at `offset`, asynchronously.
  void Submit(int fd, uint64_t offset, const std::byte* src, uint64_t bytes) {
    if (std::find(synced_.begin(), synced_.end(), fd) == synced_.end()) synced_.push_back(fd);
    latch_.Add();
    io::IoEngine* engine = store_.engine();
    Counters& counters = store_.counters();
    engine->Submit({io::Op::kWrite, fd, offset, const_cast<std::byte*>(src), bytes,
                    [this, &counters, offset](Status s) {
                      if (!s.ok()) counters.io_errors++;
                      latch_.Done(s.WithContext("write segment at offset " + std::to_string(offset)));
                    }});
    counters.ssd.NoteDepth(engine->outstanding());
  }

  // Waits for every write (also after an earlier error), then syncs.
  Status Finish() {
    Status status = latch_.Wait();
    if (status.ok() && store_.options().sync_writes)
      for (int fd : synced_) {
        status = store_.engine()->Execute({io::Op::kSync, fd, 0, nullptr, 0, nullptr});
        if (!status.ok()) break;
      }
    synced_.clear();
    if (staging_.size() > 0) store_.ReleaseWindow(std::move(staging_));
    return status;
  }

 private:
  StoreImpl& store_;
  AlignedBuffer staging_;
  uint64_t staged_ = 0;
  Latch latch_;
  std::vector<int> synced_;
};

}  // namespace flatkv
