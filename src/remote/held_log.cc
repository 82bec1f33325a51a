#include "remote/held_log.h"

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/checksum.h"
#include "common/log.h"

namespace flatkv::remote {
namespace {

std::string WithChecksum(const std::string& body) {
  char sum[16];
  std::snprintf(sum, sizeof sum, "%08" PRIx32, RecordChecksum(body.data(), body.size()));
  return body + " " + sum + "\n";
}

std::string PieceBody(const PublishedPiece& p) {
  std::string s = "P " + std::to_string(p.blocks) + " " + std::to_string(p.bytes) + " " + std::to_string(p.names.size());
  for (const std::string& n : p.names) s += " " + n;
  return s;
}

// One line's record, or false when it is torn or corrupt.
bool Parse(const std::string& line, std::deque<PublishedPiece>* held) {
  const size_t sp = line.rfind(' ');
  if (sp == std::string::npos) return false;
  const std::string body = line.substr(0, sp);
  char sum[16];
  std::snprintf(sum, sizeof sum, "%08" PRIx32, RecordChecksum(body.data(), body.size()));
  if (line.substr(sp + 1) != sum) return false;
  std::istringstream in(body);
  std::string kind;
  in >> kind;
  if (kind == "P") {
    PublishedPiece p;
    size_t names = 0;
    if (!(in >> p.blocks >> p.bytes >> names)) return false;
    for (size_t i = 0; i < names; ++i) {
      std::string n;
      if (!(in >> n)) return false;
      p.names.push_back(std::move(n));
    }
    held->push_back(std::move(p));
    return true;
  }
  if (kind == "D") {
    uint64_t pieces = 0;
    if (!(in >> pieces)) return false;
    for (; pieces > 0 && !held->empty(); --pieces) held->pop_front();
    return true;
  }
  return false;
}

Status Errno(const std::string& what, const std::string& path) {
  return Status::IoError("remote tier: " + what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

Result<std::unique_ptr<HeldLog>> HeldLog::Open(const std::string& path, std::deque<PublishedPiece>* held) {
  held->clear();
  {
    std::ifstream in(path);
    std::string line;
    uint64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (!Parse(line, held)) {
        LogWarning("remote tier: " + path + " line " + std::to_string(n) +
                   " is torn or corrupt; what it and later lines published is no longer counted");
        break;
      }
    }
  }
  std::unique_ptr<HeldLog> log(new HeldLog());
  log->path_ = path;
  FLATKV_RETURN_IF_ERROR(log->Rewrite(*held));  // the pieces still held, as a fresh log
  return log;
}

Status HeldLog::Rewrite(const std::deque<PublishedPiece>& held) {
  if (file_) std::fclose(file_);
  file_ = nullptr;
  const std::string tmp = path_ + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return Errno("cannot create", tmp);
  std::string all;
  for (const PublishedPiece& p : held) all += WithChecksum(PieceBody(p));
  const bool wrote = std::fwrite(all.data(), 1, all.size(), f) == all.size() && std::fflush(f) == 0;
  if (std::fclose(f) != 0 || !wrote) return Errno("cannot write", tmp);
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) return Errno("cannot replace", path_);
  file_ = std::fopen(path_.c_str(), "a");
  if (!file_) return Errno("cannot append to", path_);
  records_ = held.size();
  return Status::Ok();
}

HeldLog::~HeldLog() {
  if (file_) std::fclose(file_);
}

Status HeldLog::Append(const std::string& body) {
  if (!file_) return Status::IoError("remote tier: " + path_ + " is not open (an earlier rewrite failed)");
  const std::string line = WithChecksum(body);
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    return Errno("cannot append to", path_);
  ++records_;
  return Status::Ok();
}

Status HeldLog::Published(const PublishedPiece& piece) { return Append(PieceBody(piece)); }

Status HeldLog::Deleted(uint64_t pieces, const std::deque<PublishedPiece>& held) {
  if (records_ + 1 > 2 * held.size() + kSlack) return Rewrite(held);
  return Append("D " + std::to_string(pieces));
}

}  // namespace flatkv::remote
