// Fuzzes the wire protocol's frame parser the way the daemon reads a
// stream: header after header, each payload decoded as its type says. It
// must return a Status, never crash; a decoded request must re-encode to a
// frame that decodes again.
#include <cstddef>
#include <cstdint>
#include <span>

#include "service/wire.h"

using namespace flatkv::service::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  while (in.size() >= kHeaderBytes) {
    auto h = ParseHeader(in, 1 << 16);
    if (!h.ok()) return 0;
    in = in.subspan(kHeaderBytes);
    if (h->payload_bytes > in.size()) return 0;
    auto payload = in.first(h->payload_bytes);
    in = in.subspan(h->payload_bytes);
    (void)ValidateRequest(h->type, payload);
    switch (h->type) {
      case Type::kLookup: {
        auto m = DecodeLookup(payload);
        if (m.ok()) {
          const auto frame = EncodeLookup(1, *m);
          auto again = DecodeLookup(std::span(frame).subspan(kHeaderBytes));
          if (!again.ok() || again->keys != m->keys) __builtin_trap();
        }
        break;
      }
      case Type::kRestore: {
        auto m = DecodeRestore(payload);
        if (m.ok()) {
          const auto frame = EncodeRestore(1, *m);
          auto again = DecodeRestore(std::span(frame).subspan(kHeaderBytes));
          if (!again.ok() || again->keys != m->keys || again->shm_offset != m->shm_offset) __builtin_trap();
        }
        break;
      }
      case Type::kHelloOk: (void)DecodeHelloOk(payload); break;
      case Type::kRestoreLayer: (void)DecodeRestoreLayer(payload); break;
      case Type::kError: (void)ErrorStatus(payload); break;
      default: (void)DecodeU64(payload); break;
    }
  }
  return 0;
}
