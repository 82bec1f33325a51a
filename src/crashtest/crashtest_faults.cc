// `flatkv crashtest --faults`: a short, in-process pass with the store's
// SSD I/O going through a FaultInjectionEngine (src/io/fault_injection.h).
// Contracts checked (docs/crashtest.md, "Fault pass"):
//   - a served block is always right (wrong == 0) whatever the fault;
//   - a failed put names its cause: an injected ENOSPC is NoSpace, an
//     injected EIO an IoError;
//   - write faults on other puts lose nothing already stored;
//   - a failed read (EIO, short read) is a miss the store counts, and drops
//     the blocks it read from the index (counted); a corrupted read is
//     caught by a checksum (counted) and drops only the blocks it hit;
//   - after the faults stop, puts succeed and a reopened store serves every
//     block that was intact before it closed.
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "flatkv/store.h"
#include "io/fault_injection.h"
#include "crashtest/crashtest_cmd.h"
#include "crashtest/crashtest_state.h"
#include "crashtest/crashtest_target.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

using namespace crashtest;

constexpr uint32_t kBaseSessions = 8, kBaseBlocks = 8, kFaultOps = 200, kCorruptReads = 3;

struct Counts {
  uint64_t faults_fired = 0, puts_failed = 0, puts_acked = 0, restores = 0;
  uint64_t wrong = 0, lost = 0, misleading_errors = 0, checksum_failures = 0, post_fault_put_errors = 0;
  uint64_t io_errors = 0, dropped_blocks = 0;
  bool undetected_corruption = false;  // the corrupted-read phase raised no checksum failure
  bool undetected_read_faults = false;  // the failed-read phase raised no I/O error or dropped no block
  std::vector<std::string> notes;
  void Note(const std::string& s) {
    if (notes.size() < 8) notes.push_back(s);
  }
};

std::vector<BlockKey> SessionKeys(uint64_t session, uint32_t blocks) { return ContinueChain({}, session, 0, blocks); }

// Restores `keys`, counts wrong bytes; returns the valid blocks.
uint32_t CheckedRestore(Target& t, const std::vector<BlockKey>& keys, Counts* c) {
  std::vector<std::byte> got;
  auto r = t.Restore(keys, &got);
  ++c->restores;
  if (!r.ok()) return 0;
  for (uint32_t b = 0; b < *r; ++b) {
    if (!PayloadMatches(keys[b], std::span(got.data() + b * t.BlockBytes(), t.BlockBytes()))) {
      ++c->wrong;
      c->Note("wrong bytes served for " + keys[b].ToHex());
    }
  }
  return *r;
}

}  // namespace

int RunFaultPass(const std::string& dir, uint64_t seed, bool json) {
  const std::string root = dir + "/faults";
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  std::filesystem::create_directories(root + "/store", ec);
  if (ec) {
    std::fprintf(stderr, "flatkv crashtest: --dir %s: %s\n", dir.c_str(), ec.message().c_str());
    return kExitUsage;
  }
  auto engine = std::make_shared<io::FaultInjectionEngine>(std::shared_ptr<io::IoEngine>(io::MakeThreadPoolEngine(2)));
  StoreOptions o = MakeStoreOptions(root, 0, 8 * kSegmentBytes, SsdAdmission::kAll);
  // Extents of 4 blocks (1 MiB): the ~100 sessions of the fault phase then
  // fit without evicting anything, so a miss is never capacity's doing.
  o.ssd_extent_layer_bytes = 512 << 10;
  o.ssd_engine = engine;
  auto opened = Store::Open(o);
  if (!opened.ok()) {
    std::fprintf(stderr, "flatkv crashtest: opening %s/store: %s\n", root.c_str(), opened.status().ToString().c_str());
    return kExitFailure;
  }
  std::unique_ptr<Store> store = std::move(opened).value();
  StoreTarget target(store.get());
  const uint64_t bb = store->BlockBytes();
  Counts c;
  std::mt19937_64 rng(seed);

  // Baseline, no faults: every one of these must survive the pass.
  std::vector<std::vector<BlockKey>> base;
  for (uint32_t s = 0; s < kBaseSessions; ++s) {
    base.push_back(SessionKeys(1000 + s, kBaseBlocks));
    Status st = target.Put(1000 + s, base.back(), Payloads(base.back(), bb), 0);
    if (!st.ok()) {
      std::fprintf(stderr, "flatkv crashtest: baseline put without faults failed: %s\n", st.ToString().c_str());
      return kExitFailure;
    }
  }

  // The store warns about every injected failure; they are expected here.
  SetLogLevel(LogLevel::kError);
  // Write faults, one rule per put. Read faults come later: they
  // legitimately drop the blocks they hit.
  struct Kind {
    const char* name;
    io::Fault fault;
    io::Op op;
    int err;
  };
  const Kind kinds[] = {{"write EIO", io::Fault::kError, io::Op::kWrite, EIO},
                        {"write ENOSPC", io::Fault::kError, io::Op::kWrite, ENOSPC},
                        {"torn write", io::Fault::kTornWrite, io::Op::kWrite, 0},
                        {"lost write", io::Fault::kDropWrite, io::Op::kWrite, 0}};
  std::vector<std::vector<BlockKey>> during;  // acknowledged under faults: may be torn, never wrong
  for (uint32_t i = 0; i < kFaultOps; ++i) {
    const Kind& k = kinds[rng() % std::size(kinds)];
    const uint64_t before = engine->faults_fired();
    engine->AddRule({k.fault, k.op, -1, k.err, rng() % 3, 1});
    if (i % 2 == 0) {  // a put under a write fault
      const uint64_t session = 2000 + i;
      auto keys = SessionKeys(session, 1 + rng() % 6);
      Status st = target.Put(session, keys, Payloads(keys, bb), 0);
      const bool fired = engine->faults_fired() > before;
      if (st.ok()) {
        ++c.puts_acked;
        during.push_back(std::move(keys));
      } else {
        ++c.puts_failed;
        const Code want = k.err == ENOSPC ? Code::kNoSpace : Code::kIoError;
        if (fired && k.fault == io::Fault::kError && st.code() != want) {
          ++c.misleading_errors;
          c.Note(std::string(k.name) + " ended in " + st.ToString());
        }
      }
    } else {  // a restore beside it, which the write fault must not touch
      CheckedRestore(target, base[rng() % base.size()], &c);
    }
    engine->ClearRules();
    c.faults_fired += engine->faults_fired() - before;
  }
  // Nothing stored before the faults was lost.
  for (const auto& keys : base) {
    const uint32_t n = CheckedRestore(target, keys, &c);
    if (n < keys.size()) {
      c.lost += keys.size() - n;
      c.Note("baseline block lost after read/write faults: " + keys[n].ToHex());
    }
  }
  for (const auto& keys : during) CheckedRestore(target, keys, &c);

  // Failed reads: never served, counted, and the blocks they read leave the
  // index (so later restores do not read them again).
  const StoreStats before_reads = store->Stats();
  for (size_t s = 0; s < base.size(); ++s) {
    const uint64_t before = engine->faults_fired();
    engine->AddRule({s % 2 ? io::Fault::kShortRead : io::Fault::kError, io::Op::kRead, -1, EIO, rng() % 3, 1});
    CheckedRestore(target, base[s], &c);
    engine->ClearRules();
    c.faults_fired += engine->faults_fired() - before;
  }
  const StoreStats after_reads = store->Stats();
  c.io_errors = after_reads.io_errors - before_reads.io_errors;
  c.dropped_blocks = after_reads.dropped_blocks - before_reads.dropped_blocks;
  if (c.io_errors == 0 || c.dropped_blocks == 0) {
    c.undetected_read_faults = true;
    c.Note("the failed reads raised " + std::to_string(c.io_errors) + " I/O errors and dropped " +
           std::to_string(c.dropped_blocks) + " blocks");
  }

  // Corrupted reads: detected by checksum, never served. Detected means
  // counted: a pass in which they raised no checksum failure has not
  // checked the claim (each flips the middle byte of an SSD read of block data).
  const uint64_t failures_before = store->Stats().checksum_failures;
  engine->AddRule({io::Fault::kCorrupt, io::Op::kRead, -1, 0, 0, kCorruptReads});
  for (const auto& keys : base) CheckedRestore(target, keys, &c);
  engine->ClearRules();
  c.checksum_failures = store->Stats().checksum_failures;
  if (c.checksum_failures == failures_before) {
    c.undetected_corruption = true;
    c.Note("the corrupted reads raised no checksum failure");
  }
  SetLogLevel(LogLevel::kWarning);

  // Faults over: puts work again; then what was intact must survive a reopen.
  std::vector<std::vector<BlockKey>> after;
  for (uint32_t s = 0; s < 4; ++s) {
    after.push_back(SessionKeys(3000 + s, 4));
    Status st = target.Put(3000 + s, after.back(), Payloads(after.back(), bb), 0);
    if (!st.ok()) {
      ++c.post_fault_put_errors;
      c.Note("put after the faults stopped: " + st.ToString());
    }
  }
  std::vector<std::pair<std::vector<BlockKey>, uint32_t>> intact;  // keys, blocks present before the reopen
  for (const auto& set : {&base, &during, &after})
    for (const auto& keys : *set) intact.emplace_back(keys, store->Match(keys));
  Status closed = store->Close();
  store.reset();
  o.ssd_engine = nullptr;
  auto reopened = closed.ok() ? Store::Open(o) : Result<std::unique_ptr<Store>>(closed);
  if (!reopened.ok()) {
    std::fprintf(stderr, "flatkv crashtest: close and reopen after the fault pass: %s\n", reopened.status().ToString().c_str());
    return kExitFailure;
  }
  target.Reset(reopened->get());
  for (const auto& [keys, had] : intact) {
    const uint32_t n = CheckedRestore(target, keys, &c);
    if (n < had) {
      c.lost += had - n;
      c.Note("block lost across a clean reopen: " + keys[n].ToHex());
    }
  }
  if (Status st = (*reopened)->Close(); !st.ok()) c.Note("final close: " + st.ToString());

  const bool passed = c.wrong == 0 && c.lost == 0 && c.misleading_errors == 0 && c.post_fault_put_errors == 0 &&
                      !c.undetected_corruption && !c.undetected_read_faults;
  if (json) {
    nlohmann::json j = {{"mode", "faults"}, {"fault_ops", kFaultOps}, {"faults_fired", c.faults_fired},
                        {"puts_acked", c.puts_acked}, {"puts_failed", c.puts_failed}, {"restores", c.restores},
                        {"wrong", c.wrong}, {"lost", c.lost}, {"misleading_errors", c.misleading_errors},
                        {"checksum_failures", c.checksum_failures}, {"undetected_corruption", c.undetected_corruption},
                        {"read_io_errors", c.io_errors}, {"read_dropped_blocks", c.dropped_blocks},
                        {"undetected_read_faults", c.undetected_read_faults},
                        {"post_fault_put_errors", c.post_fault_put_errors},
                        {"notes", c.notes}, {"passed", passed}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("fault pass: %u operations, %llu faults fired; puts %llu acknowledged, %llu failed; %llu restores; "
                "wrong %llu, lost %llu, misleading errors %llu, checksum failures %llu, failed reads %llu (dropping %llu "
                "blocks), puts failing after the faults %llu: %s\n",
                kFaultOps, (unsigned long long)c.faults_fired, (unsigned long long)c.puts_acked,
                (unsigned long long)c.puts_failed, (unsigned long long)c.restores, (unsigned long long)c.wrong,
                (unsigned long long)c.lost, (unsigned long long)c.misleading_errors,
                (unsigned long long)c.checksum_failures, (unsigned long long)c.io_errors,
                (unsigned long long)c.dropped_blocks, (unsigned long long)c.post_fault_put_errors,
                passed ? "PASSED" : "FAILED");
    for (const auto& n : c.notes) std::printf("    %s\n", n.c_str());
  }
  std::error_code rm;
  if (passed) std::filesystem::remove_all(root, rm);
  return passed ? kExitOk : kExitFailure;
}

}  // namespace flatkv::tools
