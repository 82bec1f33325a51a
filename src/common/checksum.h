// Block checksums: XXH3-64 of one block's slice of one layer. Runs at tens
// of GB/s per core, far above the SSD's 1-2.5 GB/s, so it is verified on
// every SSD read. Format in docs/format_segment.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flatkv {

// With AVX2, XXH3 built for it (checksum_avx2.cc): the same value, faster.
uint64_t BlockChecksum(const void* data, size_t len);
// 32-bit checksum of a manifest record's bytes.
uint32_t RecordChecksum(const void* data, size_t len);

namespace internal {
// XXH3-64 compiled for AVX2; call only where the CPU has it.
uint64_t BlockChecksumAvx2(const void* data, size_t len);
}  // namespace internal

}  // namespace flatkv
