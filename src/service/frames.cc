#include "service/frames.h"

#include <algorithm>

namespace flatkv::service {
namespace {

constexpr size_t kFirstPayloadChunk = 64 << 10;

}  // namespace

Result<wire::Header> ReadFrame(net::Conn& conn, std::vector<std::byte>* payload, uint64_t max_payload,
                               Clock::time_point deadline, bool idle_ok) {
  std::byte head[wire::kHeaderBytes];
  FLATKV_RETURN_IF_ERROR(conn.ReadFull(head, sizeof head, deadline, idle_ok));
  FLATKV_ASSIGN_OR_RETURN(wire::Header h, wire::ParseHeader(head, max_payload));
  // The buffer grows with the bytes that arrive (doubling, from 64 KiB), not
  // from the header's claim: a header announcing 64 MiB and no payload costs
  // 64 KiB, so 1,024 such connections cannot take 64 GiB.
  payload->clear();
  size_t got = 0;
  while (got < h.payload_bytes) {
    const size_t step = std::min<size_t>(h.payload_bytes - got, std::max<size_t>(got, kFirstPayloadChunk));
    payload->resize(got + step);
    FLATKV_RETURN_IF_ERROR(conn.ReadFull(payload->data() + got, step, deadline));
    got += step;
  }
  return h;
}

bool FrameBuffered(const net::Conn& conn, uint64_t max_payload, wire::Header* h) {
  const std::span<const std::byte> buffered = conn.BufferedBytes();
  if (buffered.size() < wire::kHeaderBytes) return false;
  auto parsed = wire::ParseHeader(buffered.first(wire::kHeaderBytes), max_payload);
  if (!parsed.ok()) return true;
  *h = *parsed;
  return buffered.size() >= wire::kHeaderBytes + uint64_t{parsed->payload_bytes};
}

}  // namespace flatkv::service
