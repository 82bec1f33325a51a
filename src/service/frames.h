// The daemon's frames (service/wire.h) over a transport connection
// (net/transport.h): whole frames read under a deadline, and the check an
// event loop makes before it reads one from what is already buffered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flatkv/status.h"
#include "net/transport.h"
#include "service/wire.h"

namespace flatkv::service {

using net::Clock;

// Reads one frame header, then its payload into `payload`, which grows as
// the bytes arrive (at most twice the bytes received, or 64 KiB).
Result<wire::Header> ReadFrame(net::Conn& conn, std::vector<std::byte>* payload, uint64_t max_payload,
                               Clock::time_point deadline, bool idle_ok = false);

// Whether `conn`'s buffer holds one whole frame: its header in `*h` when it
// does; a header that does not parse is reported as complete too, for
// ReadFrame to refuse.
bool FrameBuffered(const net::Conn& conn, uint64_t max_payload, wire::Header* h);

}  // namespace flatkv::service
