// Helpers shared by the IoEngine implementations (not part of io's API), so
// that every engine words its errors the same way.
#pragma once

#include <cstdint>
#include <string>

#include "io/io_engine.h"

namespace flatkv::io::internal {

// Largest transfer handed to one system call or SQE. Linux moves at most
// about 2 GiB per read/write; a bigger request is split and looped on like a
// partial transfer. A multiple of 4096, so O_DIRECT alignment is kept.
inline constexpr uint64_t kMaxTransferBytes = uint64_t{1} << 30;

// "read", "write" or "fsync".
const char* OpName(Op op);

// "<engine> read at offset 4096 (8192 bytes, fd 7)": what a failed
// transfer of `len` bytes at `offset` is called in error messages.
std::string DescribeTransfer(const char* engine, Op op, int fd, uint64_t offset, uint64_t len);

// The IoError for a transfer that ended early: "short read at offset 0 of fd
// 7: 4096 of 8192 bytes transferred".
Status ShortTransfer(const Request& req, uint64_t transferred);

}  // namespace flatkv::io::internal
