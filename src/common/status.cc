#include "flatkv/status.h"

#include <cerrno>
#include <cstring>

namespace flatkv {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kNotFound: return "NotFound";
    case Code::kCorruption: return "Corruption";
    case Code::kIoError: return "IoError";
    case Code::kNoSpace: return "NoSpace";
    case Code::kPermissionDenied: return "PermissionDenied";
    case Code::kNotSupported: return "NotSupported";
    case Code::kFailedPrecondition: return "FailedPrecondition";
    case Code::kAborted: return "Aborted";
  }
  return "Unknown";
}

Status Status::FromErrno(int err, std::string_view what) {
  std::string msg = std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT: return NoSpace(std::move(msg));
    case ENOENT:
    case ENOTDIR: return NotFound(std::move(msg));
    case EACCES:
    case EPERM:
    case EROFS: return PermissionDenied(std::move(msg));
    case EINVAL: return InvalidArgument(std::move(msg));
    case EOPNOTSUPP: return NotSupported(std::move(msg));
    default: return IoError(std::move(msg));
  }
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

}  // namespace flatkv
