// Status and Result<T>: flatkv's one error style.
//
// Every fallible call returns a Status (or a Result<T> carrying a value or a
// Status). Codes are a small closed enum; the message says what was wrong and
// with which value ("segment 12: checksum mismatch at offset 4096").
// Thread-safety: values, freely copyable.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace flatkv {

enum class Code : int {
  kOk = 0,
  kInvalidArgument,    // the caller passed something malformed
  kNotFound,           // a key, file or directory that does not exist
  kCorruption,         // stored bytes or metadata failed a check
  kIoError,            // the device or filesystem failed (EIO, short read)
  kNoSpace,            // a capacity limit or the filesystem is full (ENOSPC)
  kPermissionDenied,   // a read-only or inaccessible directory
  kNotSupported,       // a feature this build or machine lacks
  kFailedPrecondition, // the object is in the wrong state for the call
  kAborted,            // the operation was cancelled
};

std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status Corruption(std::string m) { return {Code::kCorruption, std::move(m)}; }
  static Status IoError(std::string m) { return {Code::kIoError, std::move(m)}; }
  static Status NoSpace(std::string m) { return {Code::kNoSpace, std::move(m)}; }
  static Status PermissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
  static Status NotSupported(std::string m) { return {Code::kNotSupported, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {Code::kFailedPrecondition, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
  // Maps an errno value from a system call to a Status; `what` names the call and object.
  static Status FromErrno(int err, std::string_view what);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "IoError: segment 3: pread at 4096: Input/output error"
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// A value or an error. Access value() only when ok().
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace flatkv

#define FLATKV_CONCAT_INNER(a, b) a##b
#define FLATKV_CONCAT(a, b) FLATKV_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` yields a non-OK Status.
#define FLATKV_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::flatkv::Status _st = (expr);            \
    if (!_st.ok()) return _st;                \
  } while (0)

// `FLATKV_ASSIGN_OR_RETURN(auto x, MakeX());`
#define FLATKV_ASSIGN_OR_RETURN(lhs, expr) \
  FLATKV_ASSIGN_OR_RETURN_IMPL(FLATKV_CONCAT(_res_, __LINE__), lhs, expr)
#define FLATKV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
