// FaultInjectionEngine: wraps another IoEngine and makes chosen requests
// fail, come back short, deliver corrupted bytes, or stall behind a gate.
// Used by tests to prove that every failure ends in a clean miss or a clean
// error and never in wrong data.
//
// Rules apply to requests whose fd matches (or any fd when fd == -1) and
// whose op matches. Each rule fires for `count` matching requests after
// skipping `skip` of them (count == UINT64_MAX: forever). Rules are tried in
// the order they were added; every rule a request matches counts it until
// one fires, and the rules after that one do not see it. kShortRead and
// kCorrupt apply to reads, kTornWrite and kDropWrite to writes, kError to
// every op; a rule pairing a fault with another op never matches.
//
// kError and kDropWrite complete through a zero-length read on fd -1 in the
// base engine, so that `done` still runs on an engine thread. kCorrupt
// flips (XOR 0xFF) the byte at len / 2. kTornWrite writes len / 2 bytes,
// rounded down to a multiple of 4096 when len >= 8192 (O_DIRECT). Errors
// from the base engine pass through unaltered. The destructor opens the gate
// and waits until nothing is outstanding.
//
// Thread-safety: all methods may be called concurrently with Submit; the
// destructor must not run inside a callback.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "io/io_engine.h"
#include "common/mutex.h"

namespace flatkv::io {

enum class Fault : uint8_t {
  kError,      // complete with Status::FromErrno(err) without touching the device
  kShortRead,  // perform the read, then report a short transfer (half the bytes)
  kCorrupt,    // perform the read, then flip a byte in the returned buffer; report Ok
  kTornWrite,  // write only the first half of the bytes, then report Ok (as a crash would)
  kDropWrite,  // report Ok without writing anything (lost write)
};

struct FaultRule {
  Fault fault = Fault::kError;
  Op op = Op::kRead;
  int fd = -1;      // -1 matches every fd
  int err = 5;      // errno for kError (EIO=5, ENOSPC=28)
  uint64_t skip = 0;
  uint64_t count = std::numeric_limits<uint64_t>::max();
};

class FaultInjectionEngine final : public IoEngine {
 public:
  explicit FaultInjectionEngine(std::shared_ptr<IoEngine> base);
  ~FaultInjectionEngine() override;

  void Submit(Request req) override;
  std::string_view name() const override { return "fault"; }
  uint64_t outstanding() const override;

  void AddRule(const FaultRule& rule);
  void ClearRules();
  // While closed, requests are held (not passed to the base engine) until
  // OpenGate(). Used to saturate a queue deterministically. With `only`,
  // just requests of that op are held (kSync: hold the fdatasyncs).
  void CloseGate(std::optional<Op> only = std::nullopt);
  void OpenGate();
  // Requests currently held behind the gate.
  uint64_t held() const;
  // Requests that matched a rule so far.
  uint64_t faults_fired() const;

 private:
  // Finds the rule that fires for `req`, consuming one firing, and copies it
  // to `*fired`; false if none fires.
  bool Match(const Request& req, FaultRule* fired) FLATKV_EXCLUDES(mu_);
  // Passes `req` to the base engine, altered by the rule that fires for it.
  void Dispatch(Request req) FLATKV_EXCLUDES(mu_);
  // Called once per request, after its callback returned.
  void Finished() FLATKV_EXCLUDES(mu_);

  std::shared_ptr<IoEngine> base_;
  mutable Mutex mu_;
  CondVar drained_;  // signalled when outstanding_ drops to 0
  std::vector<FaultRule> rules_ FLATKV_GUARDED_BY(mu_);
  std::vector<uint64_t> seen_ FLATKV_GUARDED_BY(mu_);  // per rule: matching requests seen
  bool gate_closed_ FLATKV_GUARDED_BY(mu_) = false;
  std::optional<Op> gate_only_ FLATKV_GUARDED_BY(mu_);
  std::vector<Request> held_ FLATKV_GUARDED_BY(mu_);
  uint64_t fired_ FLATKV_GUARDED_BY(mu_) = 0;
  uint64_t outstanding_ FLATKV_GUARDED_BY(mu_) = 0;  // held + passed to base_, until the callback returns
};

}  // namespace flatkv::io
