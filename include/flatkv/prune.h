// Prefix-cache pruning: a *pruned view* of a stored chain keeps only some of
// its tokens' KV (an agent's stale tool outputs removed), while a later
// request still finds it by the chain's logical, unpruned prefix.
//
// A view of the first `logical_blocks` blocks of a chain minus the token
// ranges of a *prune set* is a session of its own whose blocks hold only the
// kept tokens' KV rows, packed in order, each with the position it had (the
// positions are not stored: they are the complement of the prune set, which
// every request that wants the view names). Its keys are derived from the
// last logical key and a digest of the prune set (docs/format_keys.md,
// "Pruned views"), so
//   - only a request naming that prune set computes them and finds the view;
//   - a request naming none hashes the logical chain and never meets a view
//     key: it never receives pruned KV.
// The view is made of new blocks (write-once as every block); the unpruned
// blocks stay until no session references them (DropSession of the
// original session frees them). docs/architecture.md, "Pruned views".
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "flatkv/keys.h"
#include "flatkv/status.h"

namespace flatkv {

// Token positions [begin, end) of a chain, removed by a prune.
struct TokenRange {
  uint32_t begin = 0;
  uint32_t end = 0;
  bool operator==(const TokenRange&) const = default;
};

// What a Prune made.
struct PruneResult {
  uint64_t view_session = 0;   // the session the view's blocks are stored under
  uint32_t logical_blocks = 0; // blocks of the chain the view covers
  uint32_t kept_tokens = 0;    // tokens whose KV the view holds
  uint32_t view_blocks = 0;    // ceil(kept_tokens / block_tokens)
  uint32_t stored_blocks = 0;  // view blocks this call wrote (0: the view existed)
};

// The view format's version, hashed into every view key (format_keys.md).
inline constexpr uint32_t kPruneViewVersion = 1;

// InvalidArgument unless `ranges` are non-empty, sorted, non-overlapping,
// each non-empty, within [0, logical_tokens), and leave at least one token.
Status ValidatePruneSet(std::span<const TokenRange> ranges, uint32_t logical_tokens);
// Tokens of [0, logical_tokens) outside `ranges` (valid ones).
uint32_t PruneKeptTokens(std::span<const TokenRange> ranges, uint32_t logical_tokens);
// The kept tokens' original positions, ascending.
std::vector<uint32_t> PruneKeptPositions(std::span<const TokenRange> ranges, uint32_t logical_tokens);
// The 128-bit digest of a prune set over `logical_blocks` blocks.
BlockKey PruneSetDigest(std::span<const TokenRange> ranges, uint32_t logical_blocks);
// The view's keys: view_blocks keys chained from the logical chain's last
// key (the key of block logical_blocks - 1) and the prune set's digest.
std::vector<BlockKey> PruneViewKeys(const BlockKey& last_logical_key, uint32_t logical_blocks,
                                    std::span<const TokenRange> ranges, uint32_t block_tokens);
// The session a view is stored under: its first key's low word, top bit set
// (as ChunkSession; view keys are unrelated to chunk keys).
inline uint64_t PruneViewSession(const BlockKey& first_view_key) { return first_view_key.lo | (uint64_t{1} << 63); }

}  // namespace flatkv
