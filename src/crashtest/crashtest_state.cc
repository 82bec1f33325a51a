#include "crashtest/crashtest_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_set>

namespace flatkv::tools::crashtest {
namespace {

inline uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr uint32_t kMagic = 0xC7A50000u;
constexpr size_t kRecordBytes = 40;

// On-disk record: magic|type, checksum, session, key.lo, key.hi, aux (little-endian host order).
struct Packed {
  uint32_t magic_type;
  uint32_t check;
  uint64_t session, lo, hi, aux;
};
static_assert(sizeof(Packed) == kRecordBytes);

uint32_t Checksum(const Packed& p) {
  uint64_t h = SplitMix(p.magic_type);
  for (uint64_t v : {p.session, p.lo, p.hi, p.aux}) h = SplitMix(h ^ v);
  return static_cast<uint32_t>(h ^ (h >> 32));
}

const KeyHasher& Hasher() {
  static const KeyHasher h;
  return h;
}

}  // namespace

KvShape Shape() { return KvShape::Mha(2, 4, 128, DType::kF16); }

std::vector<BlockKey> ContinueChain(std::span<const BlockKey> prefix, uint64_t chain_id, uint32_t first_index,
                                    uint32_t own_blocks) {
  static const BlockKey root = Hasher().NamespaceDigest({"flatkv-crashtest", "", ""});
  std::vector<BlockKey> out(prefix.begin(), prefix.end());
  std::vector<uint32_t> tokens(kBlockTokens);
  for (uint32_t b = 0; b < own_blocks; ++b) {
    const uint64_t seed = SplitMix(chain_id * 0x100000001B3ull + first_index + b);
    for (uint32_t t = 0; t < kBlockTokens; ++t) tokens[t] = static_cast<uint32_t>(SplitMix(seed + t) % 32000);
    out.push_back(Hasher().Chain(out.empty() ? root : out.back(), tokens));
  }
  return out;
}

void FillPayload(const BlockKey& key, std::span<std::byte> out) {
  uint64_t x = SplitMix(key.lo ^ SplitMix(key.hi)) | 1;
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, 8);
  }
  for (; i < out.size(); ++i) out[i] = std::byte(x >> (8 * (i % 8)));
}

bool PayloadMatches(const BlockKey& key, std::span<const std::byte> got) {
  std::vector<std::byte> want(got.size());
  FillPayload(key, want);
  return std::memcmp(want.data(), got.data(), got.size()) == 0;
}

std::vector<std::byte> Payloads(std::span<const BlockKey> keys, uint64_t block_bytes) {
  std::vector<std::byte> data(keys.size() * block_bytes);
  for (size_t i = 0; i < keys.size(); ++i) FillPayload(keys[i], std::span(data.data() + i * block_bytes, block_bytes));
  return data;
}

Result<ExpectedLog> ExpectedLog::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "expected-state log " + path);
  return ExpectedLog(fd);
}

ExpectedLog::~ExpectedLog() {
  if (fd_ >= 0) ::close(fd_);
}

Status ExpectedLog::Append(std::span<const Record> records) {
  std::vector<Packed> buf(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    Packed& p = buf[i];
    p.magic_type = kMagic | static_cast<uint32_t>(r.type);
    p.session = r.session;
    p.lo = r.key.lo;
    p.hi = r.key.hi;
    p.aux = r.aux;
    p.check = Checksum(p);
  }
  const size_t bytes = buf.size() * kRecordBytes;
  const ssize_t n = ::write(fd_, buf.data(), bytes);
  if (n != static_cast<ssize_t>(bytes)) {
    return Status::FromErrno(n < 0 ? errno : EIO, "expected-state log: write of " + std::to_string(bytes) + " bytes");
  }
  return Status::Ok();
}

Result<std::vector<Record>> ExpectedLog::ReadAll(const std::string& path, uint64_t* ignored_bytes) {
  std::vector<Record> out;
  *ignored_bytes = 0;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return out;
    return Status::FromErrno(errno, "expected-state log " + path);
  }
  std::vector<std::byte> data;
  std::byte chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "expected-state log " + path);
    }
    if (n == 0) break;
    data.insert(data.end(), chunk, chunk + n);
  }
  ::close(fd);
  size_t off = 0;
  for (; off + kRecordBytes <= data.size(); off += kRecordBytes) {
    Packed p;
    std::memcpy(&p, data.data() + off, kRecordBytes);
    const uint32_t type = p.magic_type & 0xFFFF;
    if ((p.magic_type & 0xFFFF0000u) != kMagic || p.check != Checksum(p) || type < 1 || type > 4) break;
    out.push_back({static_cast<RecordType>(type), p.session, {p.lo, p.hi}, p.aux});
  }
  *ignored_bytes = data.size() - off;
  return out;
}

std::vector<BlockExpectation> Expectations(const std::vector<Record>& log, const Contract& contract) {
  std::unordered_set<uint64_t> dropped, reused;
  for (const Record& r : log)
    if (r.type == RecordType::kDrop) dropped.insert(r.session);
  // Per key: its position in the output, whether a putting session was
  // dropped, whether one is live, whether it is owed under on-reuse.
  struct State {
    size_t index;
    bool any_dropped = false, any_live = false, owed_on_reuse = false;
  };
  std::unordered_map<BlockKey, State, BlockKeyHash> keys;
  std::vector<BlockExpectation> out;
  for (const Record& r : log) {
    if (r.type == RecordType::kReuse) reused.insert(r.session);
    if (r.type != RecordType::kPut) continue;
    auto [it, fresh] = keys.try_emplace(r.key, State{out.size()});
    if (fresh) out.push_back({r.key, false});
    State& s = it->second;
    const bool is_dropped = dropped.count(r.session) != 0;
    s.any_dropped |= is_dropped;
    s.any_live |= !is_dropped;
    // Put by the session itself after the session had been reused: the
    // on-reuse contract owes it an SSD home before the put is acknowledged.
    if ((r.aux & kOwnBit) && reused.count(r.session)) s.owed_on_reuse = true;
  }
  for (auto& [key, s] : keys) {
    bool required = contract.shared_refcount ? s.any_live : !s.any_dropped;
    if (contract.admission == SsdAdmission::kOnReuse) required = required && s.owed_on_reuse;
    out[s.index].required = required;
  }
  return out;
}

LogSummary Summarize(const std::vector<Record>& log) {
  LogSummary s;
  std::unordered_set<uint64_t> seen, dropped;
  std::vector<uint64_t> order;
  for (const Record& r : log) {
    switch (r.type) {
      case RecordType::kPut:
        ++s.puts;
        if (seen.insert(r.session).second) order.push_back(r.session);
        break;
      case RecordType::kDrop:
        ++s.drops;
        dropped.insert(r.session);
        break;
      case RecordType::kReuse:
        ++s.reuses;
        break;
      case RecordType::kWrong:
        ++s.wrong_in_worker;
        break;
    }
  }
  for (uint64_t id : order)
    if (!dropped.count(id)) s.live_sessions.push_back(id);
  return s;
}

}  // namespace flatkv::tools::crashtest
