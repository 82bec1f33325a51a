// Block checksums: XXH3-64 of one block's slice of one layer. Runs at tens
// of GB/s per core, far above the SSD's 1-2.5 GB/s, so it is verified on
// every SSD read. Format in docs/format_segment.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flatkv {

uint64_t BlockChecksum(const void* data, size_t len);
// 32-bit checksum of a manifest record's bytes.
uint32_t RecordChecksum(const void* data, size_t len);

}  // namespace flatkv
