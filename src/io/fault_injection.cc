#include "io/fault_injection.h"

#include <cassert>
#include <functional>
#include <utility>

#include "io/io_internal.h"

namespace flatkv::io {
namespace {

bool Applies(Fault fault, Op op) {
  switch (fault) {
    case Fault::kError: return true;
    case Fault::kShortRead:
    case Fault::kCorrupt: return op == Op::kRead;
    case Fault::kTornWrite:
    case Fault::kDropWrite: return op == Op::kWrite;
  }
  return false;
}

// Bytes a torn write of `len` bytes keeps: the first half, kept 4096-aligned
// for O_DIRECT files when there is a whole block to keep.
uint64_t TornLength(uint64_t len) {
  const uint64_t half = len / 2;
  return len >= 8192 ? half / 4096 * 4096 : half;
}

}  // namespace

FaultInjectionEngine::FaultInjectionEngine(std::shared_ptr<IoEngine> base) : base_(std::move(base)) {
  assert(base_ != nullptr);
}

FaultInjectionEngine::~FaultInjectionEngine() {
  OpenGate();  // held requests still get their one callback
  MutexLock lock(&mu_);
  while (outstanding_ > 0) drained_.Wait(&mu_);
}

void FaultInjectionEngine::Submit(Request req) {
  {
    MutexLock lock(&mu_);
    ++outstanding_;
    if (gate_closed_ && (!gate_only_ || *gate_only_ == req.op)) {
      held_.push_back(std::move(req));
      return;
    }
  }
  Dispatch(std::move(req));
}

uint64_t FaultInjectionEngine::outstanding() const {
  MutexLock lock(&mu_);
  return outstanding_;
}

void FaultInjectionEngine::AddRule(const FaultRule& rule) {
  assert(Applies(rule.fault, rule.op) && "fault does not apply to this op; the rule would never fire");
  MutexLock lock(&mu_);
  rules_.push_back(rule);
  seen_.push_back(0);
}

void FaultInjectionEngine::ClearRules() {
  MutexLock lock(&mu_);
  rules_.clear();
  seen_.clear();
}

void FaultInjectionEngine::CloseGate(std::optional<Op> only) {
  MutexLock lock(&mu_);
  gate_closed_ = true;
  gate_only_ = only;
}

void FaultInjectionEngine::OpenGate() {
  std::vector<Request> released;
  {
    MutexLock lock(&mu_);
    gate_closed_ = false;
    released.swap(held_);
  }
  for (Request& req : released) Dispatch(std::move(req));
}

uint64_t FaultInjectionEngine::held() const {
  MutexLock lock(&mu_);
  return held_.size();
}

uint64_t FaultInjectionEngine::faults_fired() const {
  MutexLock lock(&mu_);
  return fired_;
}

bool FaultInjectionEngine::Match(const Request& req, FaultRule* fired) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < rules_.size(); ++i) {
    const FaultRule& rule = rules_[i];
    if (rule.op != req.op || (rule.fd != -1 && rule.fd != req.fd) || !Applies(rule.fault, rule.op)) continue;
    const uint64_t seen = seen_[i]++;
    if (seen < rule.skip || seen - rule.skip >= rule.count) continue;
    *fired = rule;
    ++fired_;
    return true;
  }
  return false;
}

void FaultInjectionEngine::Finished() {
  MutexLock lock(&mu_);
  if (--outstanding_ == 0) drained_.SignalAll();
}

void FaultInjectionEngine::Dispatch(Request req) {
  // `finish(status)` is the one way a request ends: the caller's callback,
  // then the bookkeeping. The callback's captures are dropped before
  // Finished() so that nothing of the caller's outlives the drain.
  std::function<void(Status)> finish = [this, done = std::move(req.done)](Status status) mutable {
    done(std::move(status));
    done = nullptr;
    Finished();
  };
  req.done = nullptr;  // moved from above; copies of `req` below carry no callback
  FaultRule rule;
  if (!Match(req, &rule)) {
    req.done = std::move(finish);
    base_->Submit(std::move(req));
    return;
  }

  // A request that must not touch the device still completes on an engine
  // thread: a zero-length read of fd -1 makes the round trip.
  auto complete_without_io = [&](Status status) {
    Request noop;
    noop.done = [finish = std::move(finish), status = std::move(status)](Status) mutable { finish(std::move(status)); };
    base_->Submit(std::move(noop));
  };
  switch (rule.fault) {
    case Fault::kError:
      complete_without_io(
          Status::FromErrno(rule.err, internal::DescribeTransfer("injected", req.op, req.fd, req.offset, req.len)));
      return;
    case Fault::kDropWrite:
      complete_without_io(Status::Ok());
      return;
    case Fault::kShortRead: {
      Request shape = req;
      req.done = [finish = std::move(finish), shape](Status status) mutable {
        finish(status.ok() ? internal::ShortTransfer(shape, shape.len / 2) : std::move(status));
      };
      break;
    }
    case Fault::kCorrupt:
      req.done = [finish = std::move(finish), buf = static_cast<unsigned char*>(req.buf),
                  len = req.len](Status status) mutable {
        if (status.ok() && len > 0) buf[len / 2] ^= 0xFF;
        finish(std::move(status));
      };
      break;
    case Fault::kTornWrite:
      req.len = TornLength(req.len);
      req.done = std::move(finish);
      break;
  }
  base_->Submit(std::move(req));
}

}  // namespace flatkv::io
