// ThreadPoolEngine: the portable IoEngine (blocking pread/pwrite/fdatasync).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "io/io_engine.h"
#include "io/io_internal.h"
#include "common/mutex.h"

namespace flatkv::io {
namespace {

using internal::kMaxTransferBytes;

Status Failed(const Request& req, uint64_t transferred, int err) {
  return Status::FromErrno(err, internal::DescribeTransfer("threadpool", req.op, req.fd, req.offset + transferred,
                                                           req.len - transferred));
}

// Runs `req` to completion on the calling thread: loops on partial
// transfers, retries EINTR, and reports EOF before `len` as a short read.
Status Perform(const Request& req) {
  if (req.op == Op::kSync) {
    while (::fdatasync(req.fd) != 0) {
      if (errno != EINTR) return Failed(req, 0, errno);
    }
    return Status::Ok();
  }
  auto* buf = static_cast<char*>(req.buf);
  uint64_t done = 0;
  while (done < req.len) {
    const size_t chunk = std::min(req.len - done, kMaxTransferBytes);
    const auto offset = static_cast<off_t>(req.offset + done);
    const ssize_t n = req.op == Op::kRead ? ::pread(req.fd, buf + done, chunk, offset)
                                          : ::pwrite(req.fd, buf + done, chunk, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Failed(req, done, errno);
    }
    if (n == 0) return internal::ShortTransfer(req, done);  // EOF (or a device that takes no more)
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// IoEngine running each request synchronously on one of N worker threads
// that share one FIFO queue.
//
// Invariants, whenever mu_ is free: outstanding_ = queue_.size() + requests
// a worker has taken whose callback has not yet returned; stopping_ is set
// only once outstanding_ is 0. outstanding_ drops after the callback
// returns, so a request a callback submits keeps the engine busy and the
// destructor waits for it.
//
// Thread-safety: Submit and outstanding() from any thread. The destructor
// must not run on a worker thread (i.e. inside a callback).
class ThreadPoolEngine final : public IoEngine {
 public:
  explicit ThreadPoolEngine(uint32_t threads) {
    workers_.reserve(threads);
    for (uint32_t i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~ThreadPoolEngine() override;

  void Submit(Request req) override;
  std::string_view name() const override { return "threadpool"; }
  uint64_t outstanding() const override;

 private:
  void WorkerLoop();

  mutable Mutex mu_;
  CondVar work_;     // signalled when queue_ grows or stopping_ is set
  CondVar drained_;  // signalled when outstanding_ drops to 0
  std::deque<Request> queue_ FLATKV_GUARDED_BY(mu_);
  uint64_t outstanding_ FLATKV_GUARDED_BY(mu_) = 0;
  bool stopping_ FLATKV_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // last: they start after everything above exists
};

ThreadPoolEngine::~ThreadPoolEngine() {
  {
    MutexLock lock(&mu_);
    while (outstanding_ > 0) drained_.Wait(&mu_);
    stopping_ = true;
    work_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPoolEngine::Submit(Request req) {
  MutexLock lock(&mu_);
  ++outstanding_;
  queue_.push_back(std::move(req));
  work_.Signal();
}

uint64_t ThreadPoolEngine::outstanding() const {
  MutexLock lock(&mu_);
  return outstanding_;
}

void ThreadPoolEngine::WorkerLoop() {
  for (;;) {
    Request req;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping_
      req = std::move(queue_.front());
      queue_.pop_front();
    }
    req.done(Perform(req));
    req = Request();  // drop the callback's captures before anyone is told we are drained
    MutexLock lock(&mu_);
    if (--outstanding_ == 0) drained_.SignalAll();
  }
}

}  // namespace

std::unique_ptr<IoEngine> MakeThreadPoolEngine(uint32_t threads) {
  return std::make_unique<ThreadPoolEngine>(std::max<uint32_t>(threads, 1));
}

}  // namespace flatkv::io
