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
// (a temporary file renamed over it), and appends from there. A line lost
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
  Status Deleted(uint64_t pieces);  // the oldest `pieces` pieces

 private:
  HeldLog() = default;
  Status Append(const std::string& body);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace flatkv::remote
