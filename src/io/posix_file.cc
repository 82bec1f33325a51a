#include "io/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

namespace flatkv::io {

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& other) noexcept : fd_(other.fd_), direct_(other.direct_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    direct_ = other.direct_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

Result<File> File::Open(const std::string& path, bool create, bool want_direct, bool read_only) {
  int flags = read_only ? (O_RDONLY | O_CLOEXEC) : (O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0));
  File f;
  f.path_ = path;
  if (want_direct) {
    f.fd_ = ::open(path.c_str(), flags | O_DIRECT, 0644);
    if (f.fd_ >= 0) {
      f.direct_ = true;
      return f;
    }
    if (errno != EINVAL) return Status::FromErrno(errno, "open " + path);
  }
  f.fd_ = ::open(path.c_str(), flags, 0644);
  if (f.fd_ < 0) return Status::FromErrno(errno, "open " + path);
  return f;
}

Result<uint64_t> File::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return Status::FromErrno(errno, "fstat " + path_);
  return static_cast<uint64_t>(st.st_size);
}

Status File::Preallocate(uint64_t bytes) const {
  int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
  if (rc == 0) return Status::Ok();
  if (rc == EOPNOTSUPP || rc == EINVAL) return Truncate(bytes);
  return Status::FromErrno(rc, "fallocate " + path_ + " to " + std::to_string(bytes) + " bytes");
}

Status File::Truncate(uint64_t bytes) const {
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
    return Status::FromErrno(errno, "ftruncate " + path_ + " to " + std::to_string(bytes) + " bytes");
  return Status::Ok();
}

void File::DropCache() const {
  ::fdatasync(fd_);
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
}

Result<std::string> ReadWholeFile(const std::string& path, uint64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Status::FromErrno(errno, "fstat " + path);
    ::close(fd);
    return s;
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return Status::InvalidArgument(path + ": " + std::to_string(st.st_size) + " bytes is larger than the " +
                                   std::to_string(max_bytes) + "-byte limit");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t r = ::read(fd, out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      Status s = Status::FromErrno(errno, "read " + path + " at " + std::to_string(done));
      ::close(fd);
      return s;
    }
    if (r == 0) break;  // shrank while reading: return what is there
    done += static_cast<size_t>(r);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

Status EnsureWritableDir(const std::string& dir) {
  if (dir.empty()) return Status::InvalidArgument("directory path is empty");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::FromErrno(ec.value(), "create directory " + dir);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + dir);
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(dir + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return Status::FromErrno(errno, "directory " + dir + " is not writable");
  // access() says yes to root even on a read-only mount; probe for real.
  std::string probe = dir + "/.flatkv-write-probe";
  int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "directory " + dir + " is not writable");
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::Ok();
}

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open directory " + dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::FromErrno(err, "fsync directory " + dir);
  return Status::Ok();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace flatkv::io
