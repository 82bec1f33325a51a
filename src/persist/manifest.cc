#include "persist/manifest.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/checksum.h"
#include "common/log.h"

namespace flatkv::persist {
namespace {

constexpr char kMagic[8] = {'F', 'L', 'A', 'T', 'K', 'V', 'M', 'F'};
constexpr uint32_t kMaxRecordBytes = 1u << 20;
constexpr uint32_t kHeaderBodyBytes = 68;
enum RecordType : uint8_t { kExtentCreate = 1, kBlockPut = 2, kExtentFree = 3, kExtentCreateCoded = 4, kBlockPutCoded = 5,
                         kExtentSessions = 6, kBlockPositions = 7, kBlocksDropped = 8, kExtentCreateSized = 9,
                         kBlockPutTagged = 10 };
constexpr uint64_t kHeaderBytes = 8 + 4 + 4 + kHeaderBodyBytes + 4;
constexpr uint64_t kChunkBytes = 8ull << 20;  // log bytes read (replay, checkpoint) or written (checkpoint) at once
constexpr uint32_t kMaxCodecSpecBytes = 256;

void PutU8(std::vector<uint8_t>& o, uint8_t v) { o.push_back(v); }
void PutU16(std::vector<uint8_t>& o, uint16_t v) { for (int i = 0; i < 2; ++i) o.push_back(uint8_t(v >> (8 * i))); }
void PutU32(std::vector<uint8_t>& o, uint32_t v) { for (int i = 0; i < 4; ++i) o.push_back(uint8_t(v >> (8 * i))); }
void PutU64(std::vector<uint8_t>& o, uint64_t v) { for (int i = 0; i < 8; ++i) o.push_back(uint8_t(v >> (8 * i))); }

// Bounds-checked little-endian reader over a byte span.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  bool Has(size_t n) const { return b_.size() - pos_ >= n; }
  size_t pos() const { return pos_; }
  size_t remaining() const { return b_.size() - pos_; }
  uint64_t Get(int bytes) {  // caller checked Has()
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | b_[pos_ + i];
    pos_ += bytes;
    return v;
  }
  uint8_t U8() { return uint8_t(Get(1)); }
  uint16_t U16() { return uint16_t(Get(2)); }
  uint32_t U32() { return uint32_t(Get(4)); }
  uint64_t U64() { return Get(8); }
  std::span<const uint8_t> Bytes(size_t n) {
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

void FinishRecord(std::vector<uint8_t>& out, size_t start) {
  // Layout: [u32 len][u32 checksum][type + payload (len bytes)]
  uint32_t len = static_cast<uint32_t>(out.size() - start - 8);
  uint32_t sum = RecordChecksum(out.data() + start + 8, len);
  for (int i = 0; i < 4; ++i) out[start + i] = uint8_t(len >> (8 * i));
  for (int i = 0; i < 4; ++i) out[start + 4 + i] = uint8_t(sum >> (8 * i));
}

size_t BeginRecord(std::vector<uint8_t>& out, RecordType type) {
  size_t start = out.size();
  out.resize(out.size() + 8);
  PutU8(out, type);
  return start;
}

Status ParseHeader(Reader& r, ManifestHeader* h, uint32_t* version_out) {
  if (!r.Has(16)) return Status::Corruption("manifest: shorter than its header (" + std::to_string(r.remaining()) + " bytes)");
  auto magic = r.Bytes(8);
  if (std::memcmp(magic.data(), kMagic, 8) != 0) return Status::Corruption("manifest: bad magic (not a flatkv manifest)");
  uint32_t version = r.U32();
  if (version < 1 || version > kManifestVersion)
    return Status::NotSupported("manifest: version " + std::to_string(version) + " (this build reads versions 1 to " +
                                std::to_string(kManifestVersion) + ")");
  *version_out = version;
  uint32_t body_len = r.U32();
  if (body_len != kHeaderBodyBytes || !r.Has(body_len + 4))
    return Status::Corruption("manifest: header body length " + std::to_string(body_len) + " (expected " + std::to_string(kHeaderBodyBytes) + ")");
  auto body = r.Bytes(body_len);
  uint32_t sum = r.U32();
  if (sum != RecordChecksum(body.data(), body.size())) return Status::Corruption("manifest: header checksum mismatch");
  Reader b(body);
  h->shape.kind = static_cast<AttentionKind>(b.U8());
  h->shape.dtype = static_cast<DType>(b.U8());
  b.U16();
  h->shape.layers = b.U32();
  h->shape.kv_heads = b.U32();
  h->shape.head_dim = b.U32();
  h->shape.latent_dim = b.U32();
  h->shape.rope_dim = b.U32();
  h->block_tokens = b.U32();
  h->segment_bytes = b.U64();
  h->extent_blocks = b.U32();
  const uint32_t unit_blocks = b.U32();  // reserved (0) before version 5
  h->unit_blocks = version >= kManifestVersionSized ? unit_blocks : 0;
  h->slot_stride = b.U64();
  h->layer_stride = b.U64();
  h->extent_bytes = b.U64();
  Status s = h->shape.Validate();
  if (!s.ok()) return Status::Corruption("manifest header: " + s.message());
  if (h->block_tokens == 0 || h->extent_blocks == 0 || h->slot_stride == 0 ||
      h->layer_stride < uint64_t{h->extent_blocks} * h->slot_stride ||
      h->extent_bytes != h->layer_stride * h->shape.layers || h->segment_bytes < h->extent_bytes ||
      h->unit_blocks > h->extent_blocks || (h->sized() && h->layer_stride != uint64_t{h->extent_blocks} * h->slot_stride))
    return Status::Corruption("manifest header: inconsistent extent layout: " + h->ToString());
  return Status::Ok();
}

}  // namespace

std::string ManifestHeader::ToString() const {
  return shape.ToString() + " block_tokens=" + std::to_string(block_tokens) +
         " segment_bytes=" + std::to_string(segment_bytes) + " extent_blocks=" + std::to_string(extent_blocks) +
         " slot_stride=" + std::to_string(slot_stride) + " layer_stride=" + std::to_string(layer_stride) +
         " extent_bytes=" + std::to_string(extent_bytes) + (sized() ? " unit_blocks=" + std::to_string(unit_blocks) : "");
}

void EncodeHeader(std::vector<uint8_t>& out, const ManifestHeader& h, uint32_t version) {
  out.insert(out.end(), kMagic, kMagic + 8);
  PutU32(out, version);
  PutU32(out, kHeaderBodyBytes);
  size_t body = out.size();
  PutU8(out, uint8_t(h.shape.kind));
  PutU8(out, uint8_t(h.shape.dtype));
  PutU16(out, 0);
  PutU32(out, h.shape.layers);
  PutU32(out, h.shape.kv_heads);
  PutU32(out, h.shape.head_dim);
  PutU32(out, h.shape.latent_dim);
  PutU32(out, h.shape.rope_dim);
  PutU32(out, h.block_tokens);
  PutU64(out, h.segment_bytes);
  PutU32(out, h.extent_blocks);
  PutU32(out, h.unit_blocks);
  PutU64(out, h.slot_stride);
  PutU64(out, h.layer_stride);
  PutU64(out, h.extent_bytes);
  PutU32(out, RecordChecksum(out.data() + body, out.size() - body));
}

void EncodeExtentCreate(std::vector<uint8_t>& out, ExtentRef ref, uint64_t session, std::string_view codec,
                        uint32_t blocks) {
  size_t start = BeginRecord(out, blocks ? kExtentCreateSized : codec.empty() ? kExtentCreate : kExtentCreateCoded);
  PutU32(out, ref.segment);
  PutU32(out, ref.slot);
  if (blocks) PutU32(out, blocks);
  PutU64(out, session);
  if (blocks) {  // the codec spec, empty for a raw extent
    PutU16(out, static_cast<uint16_t>(codec.size()));
    out.insert(out.end(), codec.begin(), codec.end());
  } else if (!codec.empty()) {
    PutU16(out, static_cast<uint16_t>(codec.size()));
    out.insert(out.end(), codec.begin(), codec.end());
  }
  FinishRecord(out, start);
}

uint32_t SumsTag(const void* entries, size_t bytes) { return static_cast<uint32_t>(BlockChecksum(entries, bytes)); }

void EncodeBlockPut(std::vector<uint8_t>& out, ExtentRef ref, const BlockRecord& block) {
  if (block.tagged()) {
    size_t start = BeginRecord(out, kBlockPutTagged);
    PutU32(out, ref.segment);
    PutU32(out, ref.slot);
    PutU32(out, block.index);
    PutU64(out, block.key.lo);
    PutU64(out, block.key.hi);
    PutU32(out, block.stored);
    PutU32(out, block.tag);
    FinishRecord(out, start);
    return;
  }
  const bool coded = !block.offsets.empty();
  size_t start = BeginRecord(out, coded ? kBlockPutCoded : kBlockPut);
  PutU32(out, ref.segment);
  PutU32(out, ref.slot);
  PutU32(out, block.index);
  PutU64(out, block.key.lo);
  PutU64(out, block.key.hi);
  PutU32(out, static_cast<uint32_t>(block.checksums.size()));
  for (size_t l = 0; l < block.checksums.size(); ++l) {
    PutU64(out, block.checksums[l]);
    if (coded) {
      PutU32(out, block.offsets[l]);
      PutU32(out, block.lengths[l]);
    }
  }
  FinishRecord(out, start);
}

void EncodeExtentFree(std::vector<uint8_t>& out, ExtentRef ref) {
  size_t start = BeginRecord(out, kExtentFree);
  PutU32(out, ref.segment);
  PutU32(out, ref.slot);
  FinishRecord(out, start);
}

void EncodeExtentSessions(std::vector<uint8_t>& out, ExtentRef ref, uint64_t owner, std::span<const uint64_t> sharers) {
  size_t start = BeginRecord(out, kExtentSessions);
  PutU32(out, ref.segment);
  PutU32(out, ref.slot);
  PutU64(out, owner);
  PutU32(out, static_cast<uint32_t>(sharers.size()));
  for (uint64_t s : sharers) PutU64(out, s);
  FinishRecord(out, start);
}

void EncodeBlockPositions(std::vector<uint8_t>& out, ExtentRef ref, std::span<const std::pair<uint32_t, uint32_t>> runs) {
  size_t start = BeginRecord(out, kBlockPositions);
  PutU32(out, ref.segment);
  PutU32(out, ref.slot);
  PutU32(out, static_cast<uint32_t>(runs.size()));
  for (const auto& [index, position] : runs) {
    PutU32(out, index);
    PutU32(out, position);
  }
  FinishRecord(out, start);
}

void EncodeBlocksDropped(std::vector<uint8_t>& out, ExtentRef ref, std::span<const uint32_t> indices) {
  size_t start = BeginRecord(out, kBlocksDropped);
  PutU32(out, ref.segment);
  PutU32(out, ref.slot);
  PutU32(out, static_cast<uint32_t>(indices.size()));
  for (uint32_t i : indices) PutU32(out, i);
  FinishRecord(out, start);
}

namespace {

// Applies a log's records, one at a time, to the contents they describe.
class LogParser {
 public:
  explicit LogParser(ManifestContents* c) : c_(*c), h_(c->header), last_(c->extents.end()) {}

  // Applies one record (type + payload); returns why it was refused, or
  // an empty string. Nothing per record is allocated but what it adds
  // (a version 6 block record: nothing but its place in its extent's list).
  std::string Apply(std::span<const uint8_t> payload) {
    ManifestContents& c = c_;
    const ManifestHeader& h = h_;
    const uint64_t max_slot = h.UnitsPerSegment();  // units (sized) or extents per segment
    // An extent's layer region: its block slots times slot_stride (sized), else the header's.
    auto layer_bytes = [&](const ExtentRecord& e) { return h.sized() ? uint64_t{ExtentBlocks(h, e)} * h.slot_stride : h.layer_stride; };
    uint64_t& sequence = sequence_;
    ExtentRef& last_ref = last_ref_;
    auto& last = last_;
    const uint32_t len = static_cast<uint32_t>(payload.size());
    Reader p(payload);
    uint8_t type = p.U8();
    auto need = [&](size_t n) { return p.remaining() == n; };
    std::string problem;
    const bool coded_type = type == kExtentCreateCoded || type == kBlockPutCoded;
    if (coded_type && c.version < kManifestVersionCoded) {
      problem = "coded record type " + std::to_string(type) + " in a version " + std::to_string(c.version) + " log";
    } else if ((type == kBlockPut || type == kBlockPutCoded) && c.version >= kManifestVersionTagged) {
      problem = "block record type " + std::to_string(type) + " (per-layer checksums) in a version " +
                std::to_string(c.version) + " log";
    } else if (type == kBlockPutTagged && c.version < kManifestVersionTagged) {
      problem = "tagged block record type 10 in a version " + std::to_string(c.version) + " log";
    } else if (type == kBlockPutTagged && need(36)) {
      ExtentRef ref{p.U32(), p.U32()};
      TaggedBlock b;
      b.index = p.U32();
      b.key.lo = p.U64();
      b.key.hi = p.U64();
      b.stored = p.U32();
      b.tag = p.U32();
      if (!(ref == last_ref) || last == c.extents.end()) last = c.extents.find(ref);
      last_ref = ref;
      auto it = last;
      if (it == c.extents.end()) {
        problem = "block in unknown extent " + std::to_string(ref.segment) + "/" + std::to_string(ref.slot);
      } else {
        const bool coded = !it->second.codec.empty();
        const uint64_t max_index = uint64_t{ExtentBlocks(h, it->second)} * (coded ? kCodedBlocksPerSlot : 1);
        if (b.index >= max_index) problem = "block index " + std::to_string(b.index) + " beyond extent";
        else if (coded ? (b.stored < h.shape.layers || b.stored > layer_bytes(it->second) * h.shape.layers) : b.stored != 0)
          problem = "block " + std::to_string(b.index) + " with " + std::to_string(b.stored) + " stored bytes in a " +
                    (coded ? "coded" : "raw") + " extent";
        else {
          it->second.sequence = ++sequence;
          it->second.tagged.push_back(b);
        }
      }
    } else if (type == kExtentSessions && c.version < kManifestVersionShared) {
      problem = "shared-extent record type 6 in a version " + std::to_string(c.version) + " log";
    } else if ((type == kBlockPositions || type == kBlocksDropped) && c.version < kManifestVersionPositions) {
      problem = "record type " + std::to_string(type) + " in a version " + std::to_string(c.version) + " log";
    } else if ((type == kBlockPositions || type == kBlocksDropped) && p.remaining() >= 12) {
      ExtentRef ref{p.U32(), p.U32()};
      const uint32_t n = p.U32();
      auto it = c.extents.find(ref);
      const uint64_t max_index =
          it == c.extents.end() ? 0 : uint64_t{ExtentBlocks(h, it->second)} * kCodedBlocksPerSlot;
      const uint64_t each = type == kBlockPositions ? 8 : 4;
      if (it == c.extents.end())
        problem = "record type " + std::to_string(type) + " for unknown extent " + std::to_string(ref.segment) + "/" +
                  std::to_string(ref.slot);
      else if (n > max_index || !need(each * n)) problem = "record type " + std::to_string(type) + " with " + std::to_string(n) + " entries";
      else if (type == kBlockPositions) {
        auto& runs = it->second.positions;
        for (uint32_t i = 0; i < n && problem.empty(); ++i) {
          const uint32_t index = p.U32(), position = p.U32();
          if (index >= max_index) problem = "position of block index " + std::to_string(index) + " beyond extent";
          else if (!runs.empty() && index <= runs.back().first) {
            // A later record restates a run (a snapshot's runs, then the
            // live ones): the newer one wins from its index on.
            while (!runs.empty() && runs.back().first >= index) runs.pop_back();
          }
          if (problem.empty()) runs.push_back({index, position});
        }
        if (runs.size() > kMaxPositionRuns) problem = "extent with more than " + std::to_string(kMaxPositionRuns) + " position runs";
      } else {
        std::vector<uint32_t> drop(n);
        for (uint32_t i = 0; i < n; ++i) drop[i] = p.U32();
        std::sort(drop.begin(), drop.end());
        auto dropped = [&](const auto& b) { return std::binary_search(drop.begin(), drop.end(), b.index); };
        auto& blocks = it->second.blocks;
        blocks.erase(std::remove_if(blocks.begin(), blocks.end(), dropped), blocks.end());
        auto& tagged = it->second.tagged;
        tagged.erase(std::remove_if(tagged.begin(), tagged.end(), dropped), tagged.end());
        it->second.sequence = ++sequence;
      }
    } else if (type == kExtentSessions && p.remaining() >= 20) {
      ExtentRef ref{p.U32(), p.U32()};
      const uint64_t owner = p.U64();
      const uint32_t n = p.U32();
      auto it = c.extents.find(ref);
      if (n > kMaxSharers || !need(8ull * n)) problem = "shared-extent record with " + std::to_string(n) + " sessions";
      else if (it == c.extents.end())
        problem = "sessions of unknown extent " + std::to_string(ref.segment) + "/" + std::to_string(ref.slot);
      else {
        it->second.session = owner;
        it->second.sharers.clear();
        for (uint32_t i = 0; i < n; ++i) it->second.sharers.push_back(p.U64());
        it->second.sequence = ++sequence;
      }
    } else if ((type == kExtentCreate && need(16)) || (type == kExtentCreateCoded && p.remaining() >= 18) ||
               (type == kExtentCreateSized && p.remaining() >= 22)) {
      ExtentRef ref{p.U32(), p.U32()};
      const uint32_t blocks = type == kExtentCreateSized ? p.U32() : 0;
      uint64_t session = p.U64();
      std::string codec;
      if (type != kExtentCreate) {
        const uint16_t n = p.U16();
        if ((n == 0 && type == kExtentCreateCoded) || n > kMaxCodecSpecBytes || !need(n))
          problem = "codec spec of " + std::to_string(n) + " bytes";
        else {
          auto spec = p.Bytes(n);
          codec.assign(reinterpret_cast<const char*>(spec.data()), spec.size());
        }
      }
      if (!problem.empty()) {
      } else if ((type == kExtentCreateSized) != h.sized()) {
        problem = h.sized() ? "fixed-size extent record type " + std::to_string(type) + " in a log of sized extents"
                            : std::string("sized extent record type 9 in a log without allocation units");
      } else if (h.sized() && (blocks == 0 || blocks > h.extent_blocks || blocks % h.unit_blocks != 0)) {
        problem = "sized extent of " + std::to_string(blocks) + " block slots (units of " + std::to_string(h.unit_blocks) +
                  ", at most " + std::to_string(h.extent_blocks) + ")";
      } else if (uint64_t{ref.slot} + (h.sized() ? blocks / h.unit_blocks : 1) > max_slot) {
        problem = "extent slot " + std::to_string(ref.slot) + " beyond segment";
      } else if (c.extents.count(ref)) problem = "extent " + std::to_string(ref.segment) + "/" + std::to_string(ref.slot) + " created twice";
      else c.extents[ref] = ExtentRecord{session, std::move(codec), ++sequence, {}, {}, {}, blocks};
    } else if ((type == kBlockPut || type == kBlockPutCoded) && p.remaining() >= 32) {
      const bool coded = type == kBlockPutCoded;
      ExtentRef ref{p.U32(), p.U32()};
      BlockRecord b;
      b.index = p.U32();
      b.key.lo = p.U64();
      b.key.hi = p.U64();
      uint32_t n = p.U32();
      // Block records of one extent mostly follow each other: look it up once.
      if (!(ref == last_ref) || last == c.extents.end()) last = c.extents.find(ref);
      last_ref = ref;
      auto it = last;
      const uint64_t max_index =
          it == c.extents.end() ? 0 : uint64_t{ExtentBlocks(h, it->second)} * (coded ? kCodedBlocksPerSlot : 1);
      const uint64_t region = it == c.extents.end() ? 0 : layer_bytes(it->second);
      if (n != c.header.shape.layers || !need((coded ? 16ull : 8ull) * n)) problem = "block record with " + std::to_string(n) + " checksums";
      else if (it == c.extents.end()) problem = "block in unknown extent " + std::to_string(ref.segment) + "/" + std::to_string(ref.slot);
      else if (it->second.codec.empty() == coded)
        problem = std::string(coded ? "coded block in a raw" : "raw block in a coded") + " extent " +
                  std::to_string(ref.segment) + "/" + std::to_string(ref.slot);
      else if (b.index >= max_index) problem = "block index " + std::to_string(b.index) + " beyond extent";
      else {
        b.checksums.resize(n);
        if (coded) {
          b.offsets.resize(n);
          b.lengths.resize(n);
        }
        for (uint32_t l = 0; l < n; ++l) {
          b.checksums[l] = p.U64();
          if (!coded) continue;
          b.offsets[l] = p.U32();
          b.lengths[l] = p.U32();
          if (b.lengths[l] == 0 || uint64_t{b.offsets[l]} + b.lengths[l] > region)
            problem = "block " + std::to_string(b.index) + " layer " + std::to_string(l) + ": encoded bytes [" +
                      std::to_string(b.offsets[l]) + ", +" + std::to_string(b.lengths[l]) + ") outside the layer region of " +
                      std::to_string(region) + " bytes";
        }
        if (problem.empty()) {
          it->second.sequence = ++sequence;
          it->second.blocks.push_back(std::move(b));
        }
      }
    } else if (type == kExtentFree && need(8)) {
      ExtentRef ref{p.U32(), p.U32()};
      last = c.extents.end();
      if (c.extents.erase(ref) == 0) problem = "free of unknown extent " + std::to_string(ref.segment) + "/" + std::to_string(ref.slot);
      ++sequence;
    } else {
      problem = "unknown or malformed record type " + std::to_string(type) + " of " + std::to_string(len) + " bytes";
    }
    return problem;
  }

 private:
  ManifestContents& c_;
  const ManifestHeader& h_;
  uint64_t sequence_ = 0;
  ExtentRef last_ref_;
  std::map<ExtentRef, ExtentRecord>::iterator last_;  // the extent of the last block record (reset when one is freed)
};

// Replays the records of a log of `size` bytes whose header (kHeaderBytes)
// c->header holds, reading them `read(offset, dst, n)` kChunkBytes at a
// time: the first bad record ends the valid prefix (c->torn_tail).
template <typename Read>
Status ReplayRecords(uint64_t size, const Read& read, ManifestContents* c) {
  LogParser parser(c);
  auto stop = [&](uint64_t at, std::string why) {
    c->good_bytes = at;
    c->torn_tail = true;
    c->tail_problem = "offset " + std::to_string(at) + ": " + why;
  };
  c->good_bytes = kHeaderBytes;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[kChunkBytes + kMaxRecordBytes + 8]);  // not zeroed: read into
  const uint64_t cap = kChunkBytes + kMaxRecordBytes + 8;
  uint64_t file_at = kHeaderBytes, base = kHeaderBytes;  // base: file offset of buf[0]
  size_t have = 0, pos = 0;
  for (;;) {
    if (have - pos < 8 + uint64_t{kMaxRecordBytes} + 1 && file_at < size) {  // refill: move the rest to the front
      std::memmove(buf.get(), buf.get() + pos, have - pos);
      base += pos;
      have -= pos;
      pos = 0;
      const uint64_t want = std::min<uint64_t>(cap - have, size - file_at);
      FLATKV_RETURN_IF_ERROR(read(file_at, buf.get() + have, want));
      file_at += want;
      have += want;
    }
    if (pos == have) break;
    const uint64_t at = base + pos;
    const uint8_t* rec = buf.get() + pos;
    if (have - pos < 9) { stop(at, "truncated record header"); break; }
    const uint32_t len = uint32_t{rec[0]} | uint32_t{rec[1]} << 8 | uint32_t{rec[2]} << 16 | uint32_t{rec[3]} << 24;
    const uint32_t sum = uint32_t{rec[4]} | uint32_t{rec[5]} << 8 | uint32_t{rec[6]} << 16 | uint32_t{rec[7]} << 24;
    if (len == 0 || len > kMaxRecordBytes || have - pos - 8 < len) { stop(at, "record length " + std::to_string(len) + " runs past the end"); break; }
    std::span<const uint8_t> payload(rec + 8, len);
    if (RecordChecksum(payload.data(), payload.size()) != sum) { stop(at, "record checksum mismatch"); break; }
    std::string problem = parser.Apply(payload);
    if (!problem.empty()) { stop(at, problem); break; }
    pos += 8 + len;
    c->good_bytes = base + pos;
  }
  return Status::Ok();
}

}  // namespace

Result<ManifestContents> ParseManifest(std::span<const uint8_t> bytes) {
  ManifestContents c;
  Reader r(bytes);
  FLATKV_RETURN_IF_ERROR(ParseHeader(r, &c.header, &c.version));
  c.good_bytes = r.pos();
  FLATKV_RETURN_IF_ERROR(ReplayRecords(bytes.size(), [&](uint64_t at, uint8_t* dst, uint64_t n) {
    std::memcpy(dst, bytes.data() + at, n);
    return Status::Ok();
  }, &c));
  return c;
}

Result<std::unique_ptr<Manifest>> Manifest::Open(const std::string& dir, const ManifestHeader& header,
                                                 io::IoEngine* engine, ManifestContents* contents, bool read_only) {
  std::unique_ptr<Manifest> m(new Manifest(dir, engine));
  m->read_only_ = read_only;
  MutexLock lock(&m->mu_);  // not shared yet; taken for the analysis
  const std::string path = dir + "/" + kManifestName;
  const bool exists = io::PathExists(path);
  if (!exists && (header.shape.layers == 0 || read_only))
    return Status::NotFound(dir + ": no flatkv store here (no " + kManifestName + ")" +
                            (read_only ? "" : " and no shape given to create one"));
  FLATKV_ASSIGN_OR_RETURN(m->file_, io::File::Open(path, /*create=*/true, /*want_direct=*/false, read_only));
  if (!exists) {
    std::vector<uint8_t> bytes;
    // A new directory of sized extents keeps its per-layer sums in the sums
    // tables alone (version 6); one of fixed extents stays readable by older
    // builds (version 1, raised only as its records need).
    const uint32_t version = header.sized() ? kManifestVersionTagged : 1;
    EncodeHeader(bytes, header, version);
    FLATKV_RETURN_IF_ERROR(m->WriteAll(m->file_, 0, bytes));
    FLATKV_RETURN_IF_ERROR(engine->Execute({io::Op::kSync, m->file_.fd(), 0, nullptr, 0, nullptr}).WithContext(path));
    FLATKV_RETURN_IF_ERROR(io::SyncDir(dir));
    m->tail_ = bytes.size();
    *contents = ManifestContents{};
    contents->header = header;
    contents->version = version;
    contents->good_bytes = bytes.size();
    m->version_ = version;
    return m;
  }
  FLATKV_ASSIGN_OR_RETURN(uint64_t size, m->file_.Size());
  // The header, then the records streamed kChunkBytes at a time (the log
  // is never held whole: at 10M blocks it is hundreds of MB).
  const int fd = m->file_.fd();  // m is not shared yet; the lambda reads through the fd alone
  auto read = [&](uint64_t at, uint8_t* dst, uint64_t n) {
    return engine->Execute({io::Op::kRead, fd, at, dst, n, nullptr}).WithContext("read " + path);
  };
  std::vector<uint8_t> head(std::min<uint64_t>(size, kHeaderBytes));
  if (!head.empty()) FLATKV_RETURN_IF_ERROR(read(0, head.data(), head.size()));
  *contents = ManifestContents{};
  Reader r(head);
  if (Status hs = ParseHeader(r, &contents->header, &contents->version); !hs.ok()) return hs.WithContext(path);
  FLATKV_RETURN_IF_ERROR(ReplayRecords(size, read, contents));
  if (contents->torn_tail && !read_only) {
    LogWarning(path + ": dropping " + std::to_string(size - contents->good_bytes) + " bytes of log tail (" +
               contents->tail_problem + ")");
    FLATKV_RETURN_IF_ERROR(m->file_.Truncate(contents->good_bytes));
  }
  m->tail_ = contents->good_bytes;
  m->version_ = contents->version;
  return m;
}

Status Manifest::WriteAll(const io::File& file, uint64_t offset, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status::Ok();
  return engine_->Execute({io::Op::kWrite, file.fd(), offset, const_cast<uint8_t*>(bytes.data()), bytes.size(), nullptr})
      .WithContext("append to " + file.path());
}

Status Manifest::Append(std::span<const uint8_t> records, bool sync) {
  {
    MutexLock lock(&mu_);
    if (read_only_) return Status::FailedPrecondition(dir_ + ": opened read-only");
    Status s = WriteAll(file_, tail_, records);
    if (!s.ok()) {
      // Cut off whatever part of the append reached the file, so the log stays a valid prefix.
      (void)file_.Truncate(tail_);
      return s;
    }
    tail_ += records.size();
    if (checkpoint_min_ && tail_ >= checkpoint_at_ && !checkpoint_wanted_) {
      checkpoint_wanted_ = true;
      checkpoint_cv_.SignalAll();
    }
  }
  return sync ? Sync() : Status::Ok();
}

Status Manifest::Sync() {
  MutexLock one_sync(&sync_mu_);
  int fd;
  uint64_t upto;
  std::string path;
  {
    MutexLock lock(&mu_);
    if (read_only_) return Status::FailedPrecondition(dir_ + ": opened read-only");
    if (synced_ >= tail_) return Status::Ok();  // an earlier sync covered it
    fd = file_.fd();
    upto = tail_;
    path = file_.path();
  }
  FLATKV_RETURN_IF_ERROR(engine_->Execute({io::Op::kSync, fd, 0, nullptr, 0, nullptr}).WithContext(path));
  MutexLock lock(&mu_);
  synced_ = std::max(synced_, upto);
  return Status::Ok();
}

namespace {

// The snapshot of `contents` as a log: header, then each live extent's
// ExtentCreate, ExtentSessions (when shared) and BlockPuts, in LRU order
// (ExtentRecord::sequence). *version: max(min_version, what it holds needs).
std::vector<uint8_t> EncodeSnapshot(const ManifestContents& contents, uint32_t min_version, uint32_t* version) {
  *version = min_version;
  if (contents.header.sized()) *version = std::max(*version, kManifestVersionSized);
  for (const auto& [ref, e] : contents.extents) {
    if (!e.codec.empty()) *version = std::max(*version, kManifestVersionCoded);
    if (!e.sharers.empty()) *version = std::max(*version, kManifestVersionShared);
    if (!e.positions.empty()) *version = std::max(*version, kManifestVersionPositions);
    if (!e.tagged.empty() || (!e.blocks.empty() && e.blocks.front().tagged()))
      *version = std::max(*version, kManifestVersionTagged);
  }
  std::vector<uint8_t> bytes;
  EncodeHeader(bytes, contents.header, *version);
  std::vector<std::pair<uint64_t, ExtentRef>> order;
  for (const auto& [ref, e] : contents.extents) order.push_back({e.sequence, ref});
  std::sort(order.begin(), order.end());
  for (const auto& [seq, ref] : order) {
    const ExtentRecord& e = contents.extents.at(ref);
    EncodeExtentCreate(bytes, ref, e.session, e.codec, contents.header.sized() ? ExtentBlocks(contents.header, e) : 0);
    if (!e.sharers.empty()) EncodeExtentSessions(bytes, ref, e.session, e.sharers);
    if (!e.positions.empty()) EncodeBlockPositions(bytes, ref, e.positions);
    for (const auto& b : e.blocks) EncodeBlockPut(bytes, ref, b);
    for (const auto& b : e.tagged) EncodeBlockPut(bytes, ref, b.ToRecord());
  }
  return bytes;
}

}  // namespace

Result<io::File> Manifest::WriteTemp(std::span<const uint8_t> bytes) {
  const std::string tmp = dir_ + "/" + kManifestName + ".tmp";
  FLATKV_ASSIGN_OR_RETURN(io::File f, io::File::Open(tmp, true, false));
  FLATKV_RETURN_IF_ERROR(f.Truncate(0));
  FLATKV_RETURN_IF_ERROR(WriteAll(f, 0, bytes));
  FLATKV_RETURN_IF_ERROR(engine_->Execute({io::Op::kSync, f.fd(), 0, nullptr, 0, nullptr}).WithContext(tmp));
  return f;
}

Status Manifest::Replace(io::File f, uint64_t size, uint32_t version) {
  const std::string path = dir_ + "/" + kManifestName;
  const std::string tmp = path + ".tmp";
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::FromErrno(errno, "rename " + tmp + " to " + path);
  FLATKV_RETURN_IF_ERROR(io::SyncDir(dir_));
  file_ = std::move(f);
  tail_ = size;
  synced_ = tail_;
  version_ = version;
  checkpoint_at_ = std::max(checkpoint_min_, 2 * size);
  return Status::Ok();
}

Status Manifest::Rewrite(const ManifestContents& contents, uint32_t min_version) {
  MutexLock one_replace(&checkpoint_mu_);
  MutexLock one_sync(&sync_mu_);  // no sync is using the file being replaced
  MutexLock lock(&mu_);
  if (read_only_) return Status::FailedPrecondition(dir_ + ": opened read-only");
  uint32_t version;
  const std::vector<uint8_t> bytes = EncodeSnapshot(contents, std::max(version_, min_version), &version);
  FLATKV_ASSIGN_OR_RETURN(io::File f, WriteTemp(bytes));
  return Replace(std::move(f), bytes.size(), version);
}

namespace {

uint32_t Le32(const uint8_t* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24; }

// Calls fn(ordinal, record) for each record of the log in [kHeaderBytes,
// upto) of `fd`, read kChunkBytes at a time (a record is at most
// kMaxRecordBytes); a record that is truncated or fails its checksum is
// Corruption (the log up to its tail was validated as it was written).
template <typename Fn>
Status ForEachRecord(io::IoEngine* engine, int fd, const std::string& path, uint64_t upto, Fn fn) {
  std::vector<uint8_t> buf(kChunkBytes + kMaxRecordBytes + 8);
  uint64_t file_at = kHeaderBytes, ordinal = 0;
  size_t have = 0;
  while (file_at < upto || have > 0) {
    const uint64_t want = std::min<uint64_t>(buf.size() - have, upto - file_at);
    if (want > 0) {
      FLATKV_RETURN_IF_ERROR(engine->Execute({io::Op::kRead, fd, file_at, buf.data() + have, want, nullptr})
                                 .WithContext("read " + path));
      file_at += want;
      have += want;
    }
    size_t pos = 0;
    while (have - pos >= 9) {
      const uint32_t len = Le32(buf.data() + pos), sum = Le32(buf.data() + pos + 4);
      if (len == 0 || len > kMaxRecordBytes) return Status::Corruption(path + ": checkpoint: record of " + std::to_string(len) + " bytes");
      if (have - pos < 8 + uint64_t{len}) break;
      if (RecordChecksum(buf.data() + pos + 8, len) != sum) return Status::Corruption(path + ": checkpoint: record checksum mismatch");
      FLATKV_RETURN_IF_ERROR(fn(ordinal++, std::span<const uint8_t>(buf.data() + pos, 8 + len)));
      pos += 8 + len;
    }
    if (pos == 0 && file_at >= upto) return Status::Corruption(path + ": checkpoint: truncated record at the tail");
    std::memmove(buf.data(), buf.data() + pos, have - pos);
    have -= pos;
  }
  return Status::Ok();
}

// The extent a record (not a header) is about: its type and ExtentRef.
bool RecordExtent(std::span<const uint8_t> record, uint8_t* type, ExtentRef* ref) {
  if (record.size() < 8 + 1 + 8) return false;
  *type = record[8];
  ref->segment = Le32(record.data() + 9);
  ref->slot = Le32(record.data() + 13);
  return true;
}

}  // namespace

Status Manifest::Checkpoint() {
  MutexLock one_replace(&checkpoint_mu_);
  uint64_t upto;
  int fd;
  std::string path;
  uint32_t version;
  {
    MutexLock lock(&mu_);
    if (read_only_) return Status::FailedPrecondition(dir_ + ": opened read-only");
    upto = tail_;
    fd = file_.fd();  // stays open: only Checkpoint and Rewrite replace the file
    path = file_.path();
    version = version_;
  }
  // The live records of the log up to `upto`, found in two streaming passes
  // with no lock held and kept in log order; memory holds a few words per
  // extent created, never the log or its blocks. Pass 1: which extents were
  // freed, each live one's last ExtentSessions, and its dropped blocks.
  struct Instance {
    bool freed = false;
    uint64_t last_sessions = UINT64_MAX;
    std::vector<std::pair<uint32_t, uint64_t>> drops;  // (block index, ordinal of its BlocksDropped)
  };
  std::vector<Instance> instances;  // by creation
  std::map<ExtentRef, size_t> current;
  auto unknown = [&](ExtentRef ref) {
    return Status::Corruption(path + ": checkpoint: a record of unknown extent " + std::to_string(ref.segment) + "/" +
                              std::to_string(ref.slot));
  };
  FLATKV_RETURN_IF_ERROR(ForEachRecord(engine_, fd, path, upto, [&](uint64_t ordinal, std::span<const uint8_t> rec) -> Status {
    uint8_t type = 0;
    ExtentRef ref;
    if (!RecordExtent(rec, &type, &ref)) return Status::Corruption(path + ": checkpoint: record too short");
    if (type == kExtentCreate || type == kExtentCreateCoded || type == kExtentCreateSized) {
      current[ref] = instances.size();
      instances.emplace_back();
      return Status::Ok();
    }
    auto it = current.find(ref);
    if (it == current.end()) return unknown(ref);
    Instance& x = instances[it->second];
    if (type == kExtentFree) {
      x.freed = true;
      current.erase(it);
    } else if (type == kExtentSessions) {
      x.last_sessions = ordinal;
    } else if (type == kBlocksDropped && rec.size() >= 8 + 1 + 12) {
      const uint32_t n = Le32(rec.data() + 17);
      if (rec.size() != 8 + 1 + 12 + 4ull * n) return Status::Corruption(path + ": checkpoint: malformed dropped-blocks record");
      for (uint32_t k = 0; k < n; ++k) {
        x.drops.push_back({Le32(rec.data() + 21 + 4 * k), ordinal});
      }
    }
    return Status::Ok();
  }));
  // Pass 2: the header and the records of live extents into MANIFEST.tmp,
  // leaving out frees, all but the last ExtentSessions, BlocksDropped and
  // the puts they dropped.
  const std::string tmp = dir_ + "/" + kManifestName + ".tmp";
  FLATKV_ASSIGN_OR_RETURN(io::File f, io::File::Open(tmp, true, false));
  FLATKV_RETURN_IF_ERROR(f.Truncate(0));
  std::vector<uint8_t> out(kHeaderBytes);
  FLATKV_RETURN_IF_ERROR(engine_->Execute({io::Op::kRead, fd, 0, out.data(), kHeaderBytes, nullptr}).WithContext("read " + path));
  uint64_t written = 0;
  auto flush = [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(WriteAll(f, written, out));
    written += out.size();
    out.clear();
    return Status::Ok();
  };
  size_t created = 0;
  current.clear();
  FLATKV_RETURN_IF_ERROR(ForEachRecord(engine_, fd, path, upto, [&](uint64_t ordinal, std::span<const uint8_t> rec) -> Status {
    uint8_t type = 0;
    ExtentRef ref;
    if (!RecordExtent(rec, &type, &ref)) return Status::Corruption(path + ": checkpoint: record too short");
    bool keep = false;
    if (type == kExtentCreate || type == kExtentCreateCoded || type == kExtentCreateSized) {
      current[ref] = created;
      keep = !instances[created++].freed;
    } else {
      auto it = current.find(ref);
      if (it == current.end()) return unknown(ref);
      const Instance& x = instances[it->second];
      if (type == kExtentFree) current.erase(it);
      if (!x.freed) {
        if (type == kBlockPut || type == kBlockPutCoded || type == kBlockPutTagged) {
          const uint32_t index = Le32(rec.data() + 17);
          keep = std::none_of(x.drops.begin(), x.drops.end(), [&](const auto& d) { return d.first == index && d.second > ordinal; });
        } else if (type == kExtentSessions) {
          keep = ordinal == x.last_sessions;
        } else {
          keep = type == kBlockPositions;
        }
      }
    }
    if (keep) out.insert(out.end(), rec.begin(), rec.end());
    return out.size() >= kChunkBytes ? flush() : Status::Ok();
  }));
  FLATKV_RETURN_IF_ERROR(flush());
  FLATKV_RETURN_IF_ERROR(engine_->Execute({io::Op::kSync, f.fd(), 0, nullptr, 0, nullptr}).WithContext(tmp));
  const uint64_t snapshot_bytes = written;
  // Holding appends: the records appended since `upto` follow the snapshot
  // (they may need the version Upgrade has raised meanwhile).
  MutexLock one_sync(&sync_mu_);
  MutexLock lock(&mu_);
  std::vector<uint8_t> since(tail_ - upto);
  if (!since.empty())
    FLATKV_RETURN_IF_ERROR(
        engine_->Execute({io::Op::kRead, file_.fd(), upto, since.data(), since.size(), nullptr}).WithContext("read " + path));
  const uint32_t final_version = std::max(version, version_);  // the snapshot has the log's header and version
  if (final_version != version) {
    std::vector<uint8_t> v;
    PutU32(v, final_version);
    FLATKV_RETURN_IF_ERROR(WriteAll(f, sizeof kMagic, v));  // the version follows the magic
  }
  FLATKV_RETURN_IF_ERROR(WriteAll(f, snapshot_bytes, since));
  if (!since.empty() || final_version != version)
    FLATKV_RETURN_IF_ERROR(engine_->Execute({io::Op::kSync, f.fd(), 0, nullptr, 0, nullptr}).WithContext(f.path()));
  FLATKV_RETURN_IF_ERROR(Replace(std::move(f), snapshot_bytes + since.size(), final_version));
  ++checkpoints_;
  return Status::Ok();
}

void Manifest::StartCheckpoints(uint64_t min_bytes) {
  MutexLock lock(&mu_);
  if (read_only_ || min_bytes == 0 || checkpointer_.joinable()) return;
  checkpoint_min_ = min_bytes;
  checkpoint_at_ = std::max(min_bytes, 2 * tail_);
  checkpointer_ = std::thread([this] { CheckpointLoop(); });
}

void Manifest::CheckpointLoop() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      while (!checkpoint_wanted_ && !stopping_) checkpoint_cv_.Wait(&mu_);
      if (stopping_) return;
      checkpoint_wanted_ = false;
    }
    Status s = Checkpoint();
    if (!s.ok()) {
      LogWarning("manifest checkpoint: " + s.ToString() + " (the log keeps growing until the next one)");
      MutexLock lock(&mu_);
      checkpoint_at_ = std::max(checkpoint_min_, 2 * tail_);
    }
  }
}

uint64_t Manifest::checkpoints() const {
  MutexLock lock(&mu_);
  return checkpoints_;
}

Manifest::~Manifest() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  checkpoint_cv_.SignalAll();
  if (checkpointer_.joinable()) checkpointer_.join();
}

Status Manifest::Upgrade(uint32_t version) {
  MutexLock lock(&mu_);
  if (read_only_) return Status::FailedPrecondition(dir_ + ": opened read-only");
  if (version <= version_) return Status::Ok();
  std::vector<uint8_t> v;
  PutU32(v, version);
  FLATKV_RETURN_IF_ERROR(WriteAll(file_, sizeof kMagic, v));  // the version follows the magic
  FLATKV_RETURN_IF_ERROR(engine_->Execute({io::Op::kSync, file_.fd(), 0, nullptr, 0, nullptr}).WithContext(file_.path()));
  version_ = version;
  return Status::Ok();
}

uint32_t Manifest::version() const {
  MutexLock lock(&mu_);
  return version_;
}

uint64_t Manifest::bytes() const {
  MutexLock lock(&mu_);
  return tail_;
}

}  // namespace flatkv::persist
