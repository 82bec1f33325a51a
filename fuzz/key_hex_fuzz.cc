// Fuzzes block-key hex parsing: any input parses or is rejected, and a
// parsed key prints back to the same (lower-cased) text.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>

#include "flatkv/keys.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string s(reinterpret_cast<const char*>(data), size);
  auto k = flatkv::BlockKey::FromHex(s);
  if (!k.ok()) return 0;
  std::string lower = s;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (k->ToHex() != lower) __builtin_trap();
  return 0;
}
