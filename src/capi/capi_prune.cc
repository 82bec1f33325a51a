// Prefix-cache pruning in the C API (flatkv_store_prune,
// flatkv_prune_view_keys; flatkv/prune.h).
#include <limits>
#include <string>
#include <vector>

#include "capi/capi_internal.h"

using flatkv::BlockKey;
using flatkv::Status;
using flatkv::TokenRange;
using flatkv::capi::Guard;

namespace {

flatkv::Result<std::vector<TokenRange>> Ranges(const flatkv_token_range* ranges, uint64_t n) {
  if (ranges == nullptr && n > 0) return Status::InvalidArgument("ranges is NULL with n_ranges " + std::to_string(n));
  if (n > std::numeric_limits<uint32_t>::max()) return Status::InvalidArgument("n_ranges " + std::to_string(n) + " exceeds 2^32 - 1");
  std::vector<TokenRange> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = TokenRange{ranges[i].begin, ranges[i].end};
  return out;
}

}  // namespace

extern "C" {

flatkv_status* flatkv_store_prune(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys,
                                  const flatkv_token_range* ranges, uint64_t n_ranges, flatkv_prune_result* result) {
  return Guard(__func__, [&]() -> Status {
    if (result) *result = flatkv_prune_result{};
    if (store == nullptr) return Status::InvalidArgument("store is NULL");
    if (keys == nullptr && n_keys > 0) return Status::InvalidArgument("keys is NULL with n_keys " + std::to_string(n_keys));
    if (n_keys == 0) return Status::InvalidArgument("prune: empty chain (n_keys 0)");
    if (n_keys > std::numeric_limits<uint32_t>::max() / store->backend->geometry().block_tokens)
      return Status::InvalidArgument("n_keys " + std::to_string(n_keys) + " is too many blocks to prune");
    std::vector<BlockKey> k(n_keys);
    for (uint64_t i = 0; i < n_keys; ++i) k[i] = BlockKey{keys[i].lo, keys[i].hi};
    FLATKV_ASSIGN_OR_RETURN(auto r, Ranges(ranges, n_ranges));
    FLATKV_ASSIGN_OR_RETURN(flatkv::PruneResult p, store->backend->Prune(k, r, flatkv::PutHint::kAuto));
    if (result) *result = flatkv_prune_result{p.view_session, p.logical_blocks, p.kept_tokens, p.view_blocks, p.stored_blocks};
    return Status::Ok();
  });
}

flatkv_status* flatkv_prune_view_keys(flatkv_key last_key, uint32_t logical_blocks, const flatkv_token_range* ranges,
                                      uint64_t n_ranges, uint32_t block_tokens, flatkv_key* keys,
                                      uint64_t keys_capacity, uint64_t* n_keys) {
  return Guard(__func__, [&]() -> Status {
    if (n_keys) *n_keys = 0;
    if (n_keys == nullptr) return Status::InvalidArgument("n_keys is NULL");
    if (block_tokens == 0) return Status::InvalidArgument("block_tokens is 0");
    if (logical_blocks == 0 || logical_blocks > std::numeric_limits<uint32_t>::max() / block_tokens)
      return Status::InvalidArgument("logical_blocks " + std::to_string(logical_blocks) + " of " +
                                     std::to_string(block_tokens) + " tokens");
    FLATKV_ASSIGN_OR_RETURN(auto r, Ranges(ranges, n_ranges));
    FLATKV_RETURN_IF_ERROR(flatkv::ValidatePruneSet(r, logical_blocks * block_tokens));
    const auto k = flatkv::PruneViewKeys(BlockKey{last_key.lo, last_key.hi}, logical_blocks, r, block_tokens);
    if (keys_capacity < k.size())
      return Status::InvalidArgument("keys_capacity " + std::to_string(keys_capacity) + " < the view's " +
                                     std::to_string(k.size()) + " keys");
    if (keys == nullptr) return Status::InvalidArgument("keys is NULL");
    for (size_t i = 0; i < k.size(); ++i) keys[i] = flatkv_key{k[i].lo, k[i].hi};
    *n_keys = k.size();
    return Status::Ok();
  });
}

}  // extern "C"
