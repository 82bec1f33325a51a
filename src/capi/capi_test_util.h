// What the C API's C++ tests share.
#pragma once

#include <string>

#include "flatkv/flatkv.h"

namespace flatkv::capi_testing {

// Takes ownership of a status; "" when OK, else "Code: message".
inline std::string Err(flatkv_status* st) {
  if (st == nullptr) return "";
  std::string s = std::string(flatkv_code_name(flatkv_status_code(st))) + ": " + flatkv_status_message(st);
  flatkv_status_destroy(st);
  return s;
}

}  // namespace flatkv::capi_testing
