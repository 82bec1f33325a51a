// The daemon backend, in a build without the service client.
#include "capi/capi_internal.h"

namespace flatkv::capi {

Result<std::unique_ptr<Backend>> ConnectRemote(const flatkv_options& options) {
  return Status::NotSupported("cannot connect to " + options.server + ": this build has no daemon client");
}

}  // namespace flatkv::capi
