// Thin RAII wrappers over POSIX files and directories used by media/ and
// persist/: open with O_DIRECT (falling back to buffered I/O where the
// filesystem refuses it), preallocate, and fsync a directory.
//
// Thread-safety: a File is immutable after Open; its fd may be used by many
// threads for positional I/O.
#pragma once

#include <cstdint>
#include <string>
#include <string>

#include "flatkv/status.h"

namespace flatkv::io {

class File {
 public:
  File() = default;
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Opens `path` read-write. With `create`, makes it if missing. With
  // `want_direct`, asks for O_DIRECT; if the filesystem refuses it (EINVAL,
  // as tmpfs does), the file is opened buffered and direct() is false.
  // With `read_only`, opens O_RDONLY (and never creates).
  static Result<File> Open(const std::string& path, bool create, bool want_direct, bool read_only = false);

  int fd() const { return fd_; }
  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

  // Current size in bytes.
  Result<uint64_t> Size() const;
  // Makes the file at least `bytes` long with blocks reserved (fallocate),
  // falling back to ftruncate where fallocate is not supported.
  Status Preallocate(uint64_t bytes) const;
  Status Truncate(uint64_t bytes) const;
  // Drops the file's clean pages from the page cache (for benchmarks).
  void DropCache() const;

 private:
  int fd_ = -1;
  bool direct_ = false;
  std::string path_;
};

// Reads a whole file into memory. A file larger than `max_bytes` is an
// InvalidArgument naming the limit (checked before reading).
Result<std::string> ReadWholeFile(const std::string& path, uint64_t max_bytes = UINT64_MAX);

// Creates `dir` (and parents) if missing; checks it is a writable directory.
Status EnsureWritableDir(const std::string& dir);
// fsync()s a directory so that a create or rename in it is durable.
Status SyncDir(const std::string& dir);
// Whether `path` exists.
bool PathExists(const std::string& path);

}  // namespace flatkv::io
