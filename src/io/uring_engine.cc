// UringEngine: the io_uring IoEngine (liburing).
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/log.h"
#include "io/io_engine.h"
#include "io/io_internal.h"
#include "common/mutex.h"

namespace flatkv::io {
namespace {

using internal::kMaxTransferBytes;

// io_uring_setup refuses more entries than this (IORING_MAX_ENTRIES).
constexpr uint32_t kMaxQueueDepth = 32768;
// user_data of the NOP the destructor submits to wake the completion thread.
// Never a request's: those are heap addresses.
constexpr uint64_t kWakeTag = 0;
// CQEs the completion thread takes per lock acquisition.
constexpr unsigned kCqeBatch = 32;

[[noreturn]] void Fatal(const std::string& what, int err) {
  Log(LogLevel::kError, "io_uring engine: " + what + ": " + std::strerror(err) + "; aborting");
  std::abort();
}

// One request from Submit to its callback. While it is in the kernel, its
// address is the SQE's user_data and the kernel's CQE hands it back.
struct UringRequest {
  Request req;
  uint64_t transferred = 0;  // bytes moved so far; reaches req.len on success
};

// IoEngine over one io_uring instance, with one completion thread.
//
// Producers prepare and submit SQEs themselves under mu_ while fewer than
// queue_depth_ requests are in the kernel; beyond that, requests wait in
// pending_ (FIFO) and the completion thread starts them as slots free up.
// The completion thread alone consumes the completion queue (without mu_).
// For each batch of CQEs it takes mu_, resubmits the rest of partial
// transfers and refills the ring from pending_, then runs the finished
// requests' callbacks without mu_ (refilling first keeps the device busy
// while callbacks run).
//
// Invariants, whenever mu_ is free:
//  - in_flight_ <= queue_depth_ (<= the ring's SQ entries; the CQ has twice
//    as many), so io_uring_get_sqe never fails and the CQ cannot overflow;
//  - every prepared SQE has been handed to the kernel (FlushLocked);
//  - pending_ is empty unless in_flight_ == queue_depth_;
//  - outstanding_ = pending_ + in_flight_ + requests whose callback has not
//    yet returned. It drops only after the callback returns, so a request a
//    callback submits keeps the engine busy, and the destructor waits for it.
//
// Thread-safety: Submit and outstanding() from any thread. The destructor
// must not run on the completion thread (i.e. inside a callback).
class UringEngine final : public IoEngine {
 public:
  // Takes over `ring`, which io_uring_queue_init set up with at least
  // `queue_depth` entries. io_uring is a plain handle (fd plus mmap
  // pointers), so it may be copied before first use.
  UringEngine(const io_uring& ring, uint32_t queue_depth)
      : ring_(ring), queue_depth_(queue_depth), completion_thread_([this] { CompletionLoop(); }) {}
  ~UringEngine() override;

  void Submit(Request req) override;
  std::string_view name() const override { return "io_uring"; }
  uint64_t outstanding() const override;

 private:
  struct Cqe {
    uint64_t tag;
    int res;
  };
  struct Finished {
    std::unique_ptr<UringRequest> request;
    Status status;
  };

  void CompletionLoop();
  // Applies one CQE of `r`: returns its final status, or nullopt after
  // resubmitting the rest of a partial transfer.
  std::optional<Status> OnCqeLocked(UringRequest* r, int res) FLATKV_REQUIRES(mu_);
  // Prepares an SQE for what `r` has left to transfer; ownership of `r` moves
  // to the ring.
  void StartLocked(UringRequest* r) FLATKV_REQUIRES(mu_);
  // Hands every prepared SQE to the kernel.
  void FlushLocked() FLATKV_REQUIRES(mu_);

  io_uring ring_;  // SQ side guarded by mu_; CQ side owned by the completion thread
  const uint32_t queue_depth_;
  mutable Mutex mu_;
  CondVar drained_;  // signalled when outstanding_ drops to 0
  uint32_t in_flight_ FLATKV_GUARDED_BY(mu_) = 0;
  std::deque<std::unique_ptr<UringRequest>> pending_ FLATKV_GUARDED_BY(mu_);
  uint64_t outstanding_ FLATKV_GUARDED_BY(mu_) = 0;
  std::thread completion_thread_;  // last: starts after everything above exists
};

UringEngine::~UringEngine() {
  {
    MutexLock lock(&mu_);
    while (outstanding_ > 0) drained_.Wait(&mu_);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // the ring is idle, so there is room
    if (sqe == nullptr) Fatal("no submission queue entry for the shutdown NOP", EBUSY);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, kWakeTag);
    FlushLocked();
  }
  completion_thread_.join();
  io_uring_queue_exit(&ring_);
}

void UringEngine::Submit(Request req) {
  auto r = std::make_unique<UringRequest>();
  r->req = std::move(req);
  MutexLock lock(&mu_);
  ++outstanding_;
  if (in_flight_ < queue_depth_) {  // then pending_ is empty: no overtaking
    StartLocked(r.release());
    FlushLocked();
  } else {
    pending_.push_back(std::move(r));
  }
}

uint64_t UringEngine::outstanding() const {
  MutexLock lock(&mu_);
  return outstanding_;
}

void UringEngine::StartLocked(UringRequest* r) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) Fatal("submission queue full with " + std::to_string(in_flight_) + " in flight", EBUSY);
  const Request& q = r->req;
  const uint64_t offset = q.offset + r->transferred;
  const auto len = static_cast<unsigned>(std::min(q.len - r->transferred, kMaxTransferBytes));
  char* buf = static_cast<char*>(q.buf) + r->transferred;
  switch (q.op) {
    case Op::kRead: io_uring_prep_read(sqe, q.fd, buf, len, offset); break;
    case Op::kWrite: io_uring_prep_write(sqe, q.fd, buf, len, offset); break;
    case Op::kSync: io_uring_prep_fsync(sqe, q.fd, IORING_FSYNC_DATASYNC); break;
  }
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uintptr_t>(r));
  ++in_flight_;
}

void UringEngine::FlushLocked() {
  while (io_uring_sq_ready(&ring_) > 0) {
    int rc = io_uring_submit(&ring_);
    if (rc > 0) continue;
    // Transient: the kernel could not allocate, or was interrupted. The SQEs
    // stay queued and are offered again.
    if (rc == 0 || rc == -EAGAIN || rc == -EBUSY || rc == -EINTR || rc == -ENOMEM) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    // Anything else means the ring itself is broken; requests on it would
    // never complete, so fail loudly rather than hang.
    Fatal("io_uring_submit", -rc);
  }
}

std::optional<Status> UringEngine::OnCqeLocked(UringRequest* r, int res) {
  const Request& q = r->req;
  if (res == -EINTR) {
    StartLocked(r);
    return std::nullopt;
  }
  if (res < 0) {
    return Status::FromErrno(-res, internal::DescribeTransfer("io_uring", q.op, q.fd, q.offset + r->transferred,
                                                              q.len - r->transferred));
  }
  if (q.op == Op::kSync) return Status::Ok();
  r->transferred += static_cast<uint64_t>(res);
  if (r->transferred >= q.len) return Status::Ok();
  if (res == 0) return internal::ShortTransfer(q, r->transferred);
  StartLocked(r);  // partial transfer: go again for the rest
  return std::nullopt;
}

void UringEngine::CompletionLoop() {
  std::vector<Finished> finished;
  for (;;) {
    io_uring_cqe* first = nullptr;
    int rc = io_uring_wait_cqe(&ring_, &first);
    if (rc == -EINTR) continue;
    if (rc < 0) Fatal("io_uring_wait_cqe", -rc);

    io_uring_cqe* cqes[kCqeBatch];
    Cqe batch[kCqeBatch];
    const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, kCqeBatch);
    for (unsigned i = 0; i < n; ++i) batch[i] = {cqes[i]->user_data, cqes[i]->res};
    io_uring_cq_advance(&ring_, n);

    bool stop = false;
    {
      // Taking mu_ before touching a request also orders this thread after
      // the submitter's writes to it (the kernel hand-off is invisible to
      // ThreadSanitizer).
      MutexLock lock(&mu_);
      for (unsigned i = 0; i < n; ++i) {
        if (batch[i].tag == kWakeTag) {
          stop = true;  // sent only once nothing is outstanding
          continue;
        }
        --in_flight_;
        auto* r = reinterpret_cast<UringRequest*>(batch[i].tag);
        std::optional<Status> status = OnCqeLocked(r, batch[i].res);
        if (status) finished.push_back({std::unique_ptr<UringRequest>(r), std::move(*status)});
      }
      while (in_flight_ < queue_depth_ && !pending_.empty()) {
        StartLocked(pending_.front().release());
        pending_.pop_front();
      }
      FlushLocked();
    }
    if (stop) return;
    if (finished.empty()) continue;

    for (Finished& f : finished) f.request->req.done(std::move(f.status));
    const uint64_t count = finished.size();
    finished.clear();  // drop the callbacks' captures before anyone is told we are drained
    MutexLock lock(&mu_);
    outstanding_ -= count;
    if (outstanding_ == 0) drained_.SignalAll();
  }
}

}  // namespace

Result<std::unique_ptr<IoEngine>> MakeUringEngine(const UringOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > kMaxQueueDepth) {
    return Status::InvalidArgument("io_uring queue_depth " + std::to_string(options.queue_depth) +
                                   " is outside 1.." + std::to_string(kMaxQueueDepth));
  }
  io_uring ring;
  int rc = io_uring_queue_init(options.queue_depth, &ring, 0);
  if (rc < 0) {
    return Status::NotSupported("io_uring_queue_init(" + std::to_string(options.queue_depth) +
                                "): " + std::strerror(-rc));
  }
  return std::unique_ptr<IoEngine>(std::make_unique<UringEngine>(ring, options.queue_depth));
}

}  // namespace flatkv::io
