// IoEngine: the one injectable interface all file and device I/O goes
// through, so tests can inject EIO, ENOSPC, short reads, corrupted bytes,
// stalls and crashes.
//
// Requests are positional reads, writes and fdatasyncs on raw file
// descriptors. An engine runs them asynchronously and calls each request's
// `done` callback exactly once, from an engine thread, with Ok only when the
// whole length was transferred. The engine does not check alignment: that,
// and checksums, live in the layer above (media/).
//
// Implementations: UringEngine (io_uring through liburing, the default),
// ThreadPoolEngine (blocking pread/pwrite on worker threads, the portable
// fallback) and FaultInjectionEngine (a decorator for tests).
//
// Thread-safety: Submit may be called from any thread concurrently.
// Callbacks must not block for long: they run on the engine's threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "flatkv/status.h"

namespace flatkv::io {

enum class Op : uint8_t { kRead, kWrite, kSync };

struct Request {
  Op op = Op::kRead;
  int fd = -1;
  uint64_t offset = 0;
  void* buf = nullptr;  // destination for reads, source for writes; unused for kSync
  uint64_t len = 0;
  // Called exactly once. Ok means all `len` bytes were transferred. A short
  // transfer is an IoError naming how many bytes came back.
  std::function<void(Status)> done;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // Queues `req`. Never blocks on the device; may block briefly on a lock.
  virtual void Submit(Request req) = 0;
  // "io_uring", "threadpool", "fault(io_uring)".
  virtual std::string_view name() const = 0;
  // Requests submitted and not yet completed (queued plus in flight).
  virtual uint64_t outstanding() const = 0;

  // Submits `req` and blocks until it completes; `req.done` is ignored.
  Status Execute(Request req);
};

struct UringOptions {
  uint32_t queue_depth = 32;  // submission ring entries; requests beyond it wait in a queue
};

// io_uring engine with one completion thread. Fails with NotSupported where
// io_uring_setup is refused (old kernel, seccomp, io_uring_disabled=2).
Result<std::unique_ptr<IoEngine>> MakeUringEngine(const UringOptions& options = {});

// pread/pwrite/fdatasync on `threads` workers; short transfers are retried
// until EOF or an error.
std::unique_ptr<IoEngine> MakeThreadPoolEngine(uint32_t threads = 4);

// io_uring when available, otherwise the thread pool (logged once).
std::unique_ptr<IoEngine> MakeDefaultEngine(uint32_t queue_depth = 32, uint32_t threads = 4);

}  // namespace flatkv::io
