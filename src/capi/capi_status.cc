// flatkv_status: errors as values the caller owns.
#include <string>

#include "capi/capi_internal.h"

namespace flatkv::capi {
namespace {

// Handed out when not even a status can be allocated; never freed. The
// message fits std::string's inline buffer, so building it allocates nothing.
flatkv_status out_of_memory{FLATKV_NO_SPACE, "out of memory"};

}  // namespace

flatkv_status* OutOfMemoryStatus() noexcept { return &out_of_memory; }

flatkv_status* MakeStatus(const Status& status, const char* where) noexcept {
  if (status.ok()) return nullptr;
  try {
    auto* out = new flatkv_status{static_cast<flatkv_code>(status.code()), std::string(where)};
    out->message += ": ";
    out->message += status.message();
    return out;
  } catch (...) {
    return OutOfMemoryStatus();
  }
}

flatkv_status* InternalErrorStatus(const char* where, const char* what) noexcept {
  try {
    return new flatkv_status{FLATKV_ABORTED, std::string(where) + ": internal error: " + what};
  } catch (...) {
    return OutOfMemoryStatus();
  }
}

}  // namespace flatkv::capi

extern "C" {

flatkv_code flatkv_status_code(const flatkv_status* status) { return status ? status->code : FLATKV_OK; }

const char* flatkv_status_message(const flatkv_status* status) { return status ? status->message.c_str() : ""; }

void flatkv_status_destroy(flatkv_status* status) {
  if (status != nullptr && status != flatkv::capi::OutOfMemoryStatus()) delete status;
}

const char* flatkv_code_name(int32_t code) {
  if (code < FLATKV_OK || code > FLATKV_ABORTED) return "Unknown";
  // CodeName returns views of string literals, so data() is NUL-terminated.
  return flatkv::CodeName(static_cast<flatkv::Code>(code)).data();
}

}  // extern "C"
