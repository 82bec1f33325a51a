// The remote tier's objects and index on a Redis Cluster (issue 15 items 2
// and 3; docs/format_remote.md): a run of a chain's consecutive blocks is
// published as one immutable object per (run piece, layer) of at most
// `object_bytes` each, in flatkv's layer-major layout, and one small index
// entry per block naming its object. A restore finds the chain's longest
// indexed prefix in one pipelined round trip and fetches it layer by layer,
// a bounded number of objects in flight, verifying each object's header
// (layer, block range, namespace) and checksum: a stale, evicted or
// corrupted object ends the restore's valid prefix there (a miss), never
// wrong bytes.
//
// The store reaches it through RemoteMedium (remote_medium.h).
//
// Thread-safety: one thread at a time (it owns a ClusterClient).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flatkv/keys.h"
#include "flatkv/status.h"
#include "remote/cluster_client.h"

namespace flatkv::remote {

inline constexpr uint32_t kObjectMagic = 0x52564B46;  // "FKVR" little-endian
inline constexpr uint16_t kObjectVersion = 1;
inline constexpr uint32_t kObjectHeaderBytes = 96;

// The fixed header in front of every object's payload (little-endian).
struct ObjectHeader {
  uint32_t layer = 0;
  uint32_t blocks = 0;             // consecutive blocks of the chain in the payload
  uint64_t block_layer_bytes = 0;  // bytes per block in this layer
  BlockKey ns;                     // namespace digest
  BlockKey first_key, last_key;    // the payload's first and last block
  uint64_t payload_checksum = 0;   // XXH3-64 of the payload
};
std::string EncodeObjectHeader(const ObjectHeader& h);
// Refuses a wrong magic, an unknown version or a header checksum mismatch.
Result<ObjectHeader> DecodeObjectHeader(std::string_view bytes);

struct RemoteTierOptions {
  ClusterOptions cluster;
  std::string prefix = "fkv";           // every name starts "<prefix>:" (an ACL key pattern "~<prefix>:*")
  uint64_t object_bytes = 4ull << 20;   // payload bytes per object at most (1-4 MiB suits Redis)
  uint32_t max_inflight = 32;           // objects requested at once during a restore
  uint32_t ttl_seconds = 0;             // objects and index entries expire (0: never; maxmemory evicts)
};

// One block's place: its object (by the object's first block key and block
// count) and its position in it.
struct RemoteRef {
  BlockKey object_first;
  uint32_t object_blocks = 0;
  uint32_t position = 0;
};

struct RemoteMatch {
  uint32_t from = 0;              // the first block looked up (the ones before it are held elsewhere)
  uint32_t blocks = 0;            // the chain's indexed prefix ends here (blocks from..blocks-1 are indexed)
  std::vector<RemoteRef> refs;    // one per block from `from` to `blocks`
};

// What one Publish wrote for one piece: its objects (one per layer) and
// its blocks' index entries, and their bytes (values and names).
struct PublishedPiece {
  std::vector<std::string> names;
  uint32_t blocks = 0;
  uint64_t bytes = 0;
};

struct RemoteTierStats {
  uint64_t objects_written = 0, bytes_written = 0, blocks_published = 0, blocks_already_published = 0;
  uint64_t objects_read = 0, bytes_read = 0, stale_objects = 0, missing_objects = 0, index_entries_cleaned = 0;
};

class RemoteTier {
 public:
  static Result<std::unique_ptr<RemoteTier>> Open(const RemoteTierOptions& options, uint32_t layers,
                                                  uint64_t block_layer_bytes);

  // Publishes `keys` (consecutive blocks of one chain, in namespace `ns`):
  // `slice(layer, block)` is block's slice of layer (block_layer_bytes).
  // Blocks already indexed are skipped (another node published them).
  // Objects are written before the index entries that name them.
  // With `written`, what was written is appended to it, piece by piece.
  Status Publish(const BlockKey& ns, std::span<const BlockKey> keys,
                 const std::function<const std::byte*(uint32_t layer, uint32_t block)>& slice,
                 std::vector<PublishedPiece>* written = nullptr);
  // Deletes `names` (pipelined DEL); the number that existed.
  Result<uint64_t> Delete(const std::vector<std::string>& names);

  // How far the chain's blocks from `from` on are indexed: one pipelined
  // round of index reads of chain[from..]. (The blocks before `from` are
  // the caller's, held locally; an object may still begin among them.)
  Result<RemoteMatch> Match(std::span<const BlockKey> chain, uint32_t from = 0);

  // Fetches `match`'s blocks (match.from to match.blocks) of `chain` layer
  // by layer into destination(layer, block) (block: the chain position; a
  // null destination skips the block), calling layer_done(layer, valid) as
  // each layer is complete, with the end of the prefix valid so far;
  // layer_done returning false stops the restore there. Returns the end of
  // the prefix valid in every layer (match.from when nothing is): a missing
  // or corrupt object cuts it at its first block (its index entries are
  // then deleted).
  Result<uint32_t> Restore(const BlockKey& ns, std::span<const BlockKey> chain, const RemoteMatch& match,
                           const std::function<std::byte*(uint32_t layer, uint32_t block)>& destination,
                           const std::function<bool(uint32_t layer, uint32_t valid)>& layer_done = {});

  std::string ObjectName(const BlockKey& first, uint32_t blocks, uint32_t layer) const;
  std::string IndexName(const BlockKey& key) const;
  ClusterClient& cluster() { return *cluster_; }
  const RemoteTierStats& stats() const { return stats_; }
  uint32_t layers() const { return layers_; }
  uint64_t block_layer_bytes() const { return block_layer_bytes_; }
  // Blocks per object: object_bytes / block_layer_bytes, at least 1.
  uint32_t blocks_per_object() const { return per_object_; }

 private:
  RemoteTier() = default;
  RemoteTierOptions options_;
  std::unique_ptr<ClusterClient> cluster_;
  uint32_t layers_ = 0;
  uint64_t block_layer_bytes_ = 0;
  uint32_t per_object_ = 1;
  RemoteTierStats stats_;
};

}  // namespace flatkv::remote
