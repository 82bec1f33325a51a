// Store::Prefetch: restores of SSD-only prefixes that one thread finishes
// in the background, re-admitting their blocks into DRAM copies
// (docs/architecture.md, "Prefetch").
#include "store/store_impl.h"

namespace flatkv {

Result<uint32_t> StoreImpl::Prefetch(std::span<const BlockKey> chain) {
  uint32_t hit = 0;
  bool on_ssd_only = false;  // a hit block has no DRAM copy to serve it
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("prefetch: store is closed");
    uint32_t slot = 0;
    for (const BlockKey& key : chain) {
      const Extent* e = FindBlock(key, &slot);
      if (e == nullptr) break;
      ++hit;
      if (e->medium == Medium::kSsd && !(e->has_copy && e->in_copy(slot))) on_ssd_only = true;
    }
  }
  if (!on_ssd_only || options_.dram_capacity_bytes == 0) return hit;
  {
    MutexLock lock(&prefetch_mu_);
    if (prefetch_stop_) return hit;
    if (prefetch_running_ + prefetch_queue_.size() >= kMaxPrefetches) {
      counters_.prefetch_skipped++;
      return hit;
    }
    ++prefetch_running_;  // a place, held while the restore starts
  }
  auto started = StartRestoreImpl(chain.first(hit), {}, /*readmit=*/true);
  std::unique_ptr<Restore> unqueued;  // destroyed (waiting for its I/O) outside the lock
  {
    MutexLock lock(&prefetch_mu_);
    --prefetch_running_;
    if (!started.ok()) return started.status();
    if (prefetch_stop_) {
      unqueued = std::move(started).value();
    } else {
      counters_.prefetches++;
      prefetch_queue_.push_back(std::move(started).value());
      if (!prefetch_thread_.joinable()) prefetch_thread_ = std::thread([this] { RunPrefetches(); });
      prefetch_cv_.Signal();
    }
  }
  return hit;
}

void StoreImpl::RunPrefetches() {
  for (;;) {
    std::unique_ptr<Restore> r;
    {
      MutexLock lock(&prefetch_mu_);
      while (prefetch_queue_.empty() && !prefetch_stop_) prefetch_cv_.Wait(&prefetch_mu_);
      if (prefetch_queue_.empty()) return;  // stopped, and every queued one finished
      r = std::move(prefetch_queue_.front());
      prefetch_queue_.pop_front();
      ++prefetch_running_;
    }
    r->Finish();  // every layer read; the SSD blocks land in their DRAM copies
    r.reset();
    counters_.prefetches_done++;
    MutexLock lock(&prefetch_mu_);
    --prefetch_running_;
  }
}

void StoreImpl::StopPrefetches() {
  std::thread thread;
  {
    MutexLock lock(&prefetch_mu_);
    prefetch_stop_ = true;
    prefetch_cv_.SignalAll();
    thread = std::move(prefetch_thread_);
  }
  if (thread.joinable()) thread.join();
}

}  // namespace flatkv
