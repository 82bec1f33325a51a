// IoEngine::Execute, MakeDefaultEngine and the helpers of io_internal.h.
#include "io/io_engine.h"

#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/log.h"
#include "io/io_internal.h"

namespace flatkv::io {

namespace internal {

const char* OpName(Op op) {
  switch (op) {
    case Op::kRead: return "read";
    case Op::kWrite: return "write";
    case Op::kSync: return "fsync";
  }
  return "unknown op";
}

std::string DescribeTransfer(const char* engine, Op op, int fd, uint64_t offset, uint64_t len) {
  std::string s = std::string(engine) + " " + OpName(op);
  if (op != Op::kSync) s += " at offset " + std::to_string(offset) + " (" + std::to_string(len) + " bytes, fd ";
  else s += " (fd ";
  return s + std::to_string(fd) + ")";
}

Status ShortTransfer(const Request& req, uint64_t transferred) {
  return Status::IoError("short " + std::string(OpName(req.op)) + " at offset " + std::to_string(req.offset) +
                         " of fd " + std::to_string(req.fd) + ": " + std::to_string(transferred) + " of " +
                         std::to_string(req.len) + " bytes transferred");
}

}  // namespace internal

Status IoEngine::Execute(Request req) {
  // Shared with the callback: the engine may still be inside set_value when
  // this thread wakes up and returns.
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> result = promise->get_future();
  req.done = [promise](Status status) { promise->set_value(std::move(status)); };
  Submit(std::move(req));
  return result.get();
}

std::unique_ptr<IoEngine> MakeDefaultEngine(uint32_t queue_depth, uint32_t threads) {
  UringOptions options;
  options.queue_depth = queue_depth;
  Result<std::unique_ptr<IoEngine>> uring = MakeUringEngine(options);
  if (uring.ok()) return std::move(uring).value();

  static std::once_flag warned;
  std::call_once(warned, [&] {
    LogWarning("io_uring unavailable, using " + std::to_string(threads) +
               " pread/pwrite threads instead: " + uring.status().ToString());
  });
  return MakeThreadPoolEngine(threads);
}

}  // namespace flatkv::io
