// HeldLog: what a store has published to the remote tier and still keeps,
// kept on disk beside its SSD data, so that RemoteOptions::capacity_bytes
// counts the objects of earlier runs too (docs/format_remote.md, "The held
// log").
//
// One text line per record, each ending in its checksum:
//   P <blocks> <bytes> <names> <name> ... <checksum>   a piece published
//   D <pieces> <checksum>                              the oldest pieces deleted
// Open replays the lines (a torn or corrupt line ends the log: what follows
// is not trusted), writes the pieces still held back as a fresh log
// (a temporary file renamed over it), and appends from there; once the
// records outnumber twice the pieces held (plus kSlack), Deleted rewrites it
// the same way, so the file stays proportional to what is held. A line lost
// in a crash leaves its piece uncounted: the shards' TTL and maxmemory
// still bound it.
//
// Thread-safety: none; the publisher thread owns it.
#pragma once

#include <cstdio>
#include <deque>
#include <memory>
#include <string>

#include "flatkv/status.h"
#include "remote/remote_tier.h"

namespace flatkv::remote {

class HeldLog {
 public:
  // Opens (or creates) the log at `path`; *held gets the pieces it holds,
  // oldest first.
  static Result<std::unique_ptr<HeldLog>> Open(const std::string& path, std::deque<PublishedPiece>* held);
  ~HeldLog();

  Status Published(const PublishedPiece& piece);
  // The oldest `pieces` pieces were deleted; `held` is what is held now
  // (the log is rewritten from it when it has grown).
  Status Deleted(uint64_t pieces, const std::deque<PublishedPiece>& held);

  uint64_t records() const { return records_; }  // lines in the file now
  static constexpr uint64_t kSlack = 1024;

 private:
  HeldLog() = default;
  Status Append(const std::string& body);
  // Writes `held` as the whole log (a temporary file renamed over it) and
  // reopens it for appending.
  Status Rewrite(const std::deque<PublishedPiece>& held);

  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t records_ = 0;
};

}  // namespace flatkv::remote
