// Pruned views (flatkv/prune.h, docs/architecture.md "Pruned views"): the
// rows of the kept tokens of a stored chain, packed into new blocks.
#include "store/prune_view.h"

#include <cstring>
#include <string>

namespace flatkv {

Result<PruneResult> PruneInto(Store& store, std::span<const BlockKey> chain, std::span<const TokenRange> ranges,
                              std::span<const BlockKey> view_keys, SessionId view_session, const PutOptions& options) {
  const StoreOptions& o = store.options();
  const uint32_t bt = o.block_tokens, layers = o.shape.layers;
  if (chain.empty()) return Status::InvalidArgument("prune: empty chain");
  const auto n = static_cast<uint32_t>(chain.size());
  FLATKV_RETURN_IF_ERROR(ValidatePruneSet(ranges, n * bt));
  const uint32_t kept = PruneKeptTokens(ranges, n * bt);
  const uint32_t view_blocks = (kept + bt - 1) / bt;
  if (view_keys.size() != view_blocks)
    return Status::InvalidArgument("prune: " + std::to_string(view_keys.size()) + " view keys for " +
                                   std::to_string(view_blocks) + " view blocks");
  PruneResult result;
  result.view_session = view_session;
  result.logical_blocks = n;
  result.kept_tokens = kept;
  result.view_blocks = view_blocks;
  if (store.Match(view_keys) == view_blocks) return result;  // the view exists
  const uint32_t stored = store.Match(chain);
  if (stored < n)
    return Status::NotFound("prune: " + std::to_string(stored) + " of the chain's " + std::to_string(n) +
                            " blocks are stored");
  // Rows of a slice (flatkv/codec.h): MHA K rows then V rows, MLA one row per token.
  const bool mha = o.shape.kind == AttentionKind::kMha;
  const uint64_t slice = store.BlockLayerBytes();
  const uint64_t row = mha ? slice / (2ull * bt) : slice / bt;
  const std::vector<uint32_t> keep = PruneKeptPositions(ranges, n * bt);
  std::vector<std::byte> data(uint64_t{view_blocks} * layers * slice);  // Put's layout: block-major
  FLATKV_ASSIGN_OR_RETURN(auto restore, store.StartRestore(chain));
  for (uint32_t l = 0; l < layers; ++l) {
    FLATKV_ASSIGN_OR_RETURN(LayerView view, restore->WaitLayer(l));
    if (view.blocks != n) {
      restore->ReleaseLayer(l);
      return Status::Corruption("prune: layer " + std::to_string(l) + " restored " + std::to_string(view.blocks) +
                                " of " + std::to_string(n) + " blocks");
    }
    for (uint32_t j = 0; j < kept; ++j) {
      const uint32_t p = keep[j], src_block = p / bt, src_row = p % bt, dst_block = j / bt, dst_row = j % bt;
      const std::byte* src = view.data.data() + uint64_t{src_block} * slice;
      std::byte* dst = data.data() + (uint64_t{dst_block} * layers + l) * slice;
      std::memcpy(dst + dst_row * row, src + src_row * row, row);
      if (mha) std::memcpy(dst + (bt + dst_row) * row, src + (bt + src_row) * row, row);
    }
    restore->ReleaseLayer(l);
  }
  if (restore->Finish() != n) return Status::Corruption("prune: blocks of the chain failed while being read");
  restore.reset();
  PutResult put;
  PutOptions po = options;
  po.first_block = 0;
  po.result = &put;
  FLATKV_RETURN_IF_ERROR(store.Put(result.view_session, view_keys, data, po).WithContext("prune"));
  result.stored_blocks = put.stored_blocks;
  return result;
}

Result<PruneResult> Store::Prune(std::span<const BlockKey> chain, std::span<const TokenRange> ranges,
                                 const PutOptions& options) {
  if (chain.empty()) return Status::InvalidArgument("prune: empty chain");
  const uint32_t bt = this->options().block_tokens;
  FLATKV_RETURN_IF_ERROR(ValidatePruneSet(ranges, static_cast<uint32_t>(chain.size()) * bt));
  const auto keys = PruneViewKeys(chain.back(), static_cast<uint32_t>(chain.size()), ranges, bt);
  return PruneInto(*this, chain, ranges, keys, PruneViewSession(keys[0]), options);
}

uint32_t Store::MatchPruned(std::span<const BlockKey> chain, std::span<const TokenRange> ranges) const {
  const uint32_t bt = options().block_tokens;
  if (chain.empty() || !ValidatePruneSet(ranges, static_cast<uint32_t>(chain.size()) * bt).ok()) return 0;
  return Match(PruneViewKeys(chain.back(), static_cast<uint32_t>(chain.size()), ranges, bt));
}

}  // namespace flatkv
