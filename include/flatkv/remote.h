// The remote tier (a Redis Cluster shared by a fleet, docs/remote.md) as a
// medium of the store: component flatkv::remote (library flatkv_remote).
//
// A store's media register where the store is composed, so the core store
// (flatkv::core) links no medium it is not asked for. A program whose
// stores set StoreOptions::remote links flatkv::remote and calls this once
// before Store::Open; without it, Open fails with FailedPrecondition naming
// the medium. The daemon and the C API call it themselves.
//
// Thread-safety: may be called from any thread, any number of times.
#pragma once

namespace flatkv {

void RegisterRemoteMedium();

}  // namespace flatkv
