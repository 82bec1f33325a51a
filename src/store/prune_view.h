// Building a pruned view (flatkv/prune.h) through the Store interface:
// Store::Prune's implementation, and the daemon's, which passes its
// tenant's salted chain and view keys.
#pragma once

#include <span>

#include "flatkv/store.h"

namespace flatkv {

// Restores every block of `chain` from `store`, packs the KV rows of the
// tokens outside `ranges` into view blocks in order (the last zero-padded)
// and puts them under `view_keys` (PruneViewKeys of the caller's chain) in
// session `view_session` (PruneViewSession of the caller's first view key),
// placing them at chain position 0.
// NotFound when `chain` is not wholly stored; Corruption when a block fails
// while being read (nothing is put).
Result<PruneResult> PruneInto(Store& store, std::span<const BlockKey> chain, std::span<const TokenRange> ranges,
                              std::span<const BlockKey> view_keys, SessionId view_session, const PutOptions& options);

}  // namespace flatkv
