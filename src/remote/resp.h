// RESP2, the Redis protocol: commands encoded as arrays of bulk strings, and
// one connection that parses replies with hiredis's redisReader (Debian's
// libhiredis 0.14 has no TLS, so the socket and TLS are flatkv's own
// net::Conn). Issue 15's remote tier runs on it; docs/format_remote.md.
//
// Thread-safety: a RespConnection is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/status.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace flatkv::net {
class Conn;
}

namespace flatkv::remote {

using Clock = std::chrono::steady_clock;

// One reply, converted from hiredis's redisReply so callers do not see hiredis.
struct RespValue {
  enum Type { kString, kArray, kInteger, kNil, kStatus, kError } type = kNil;
  std::string str;                  // kString, kStatus, kError
  long long integer = 0;            // kInteger
  std::vector<RespValue> elements;  // kArray
  bool sunk = false;                // a top-level bulk string given to a BulkSink instead (str empty)
  bool is_error() const { return type == kError; }
};

// Takes a top-level bulk string reply where it lies in the reader's buffer
// (valid only during the call), so a large value is used without a copy.
using BulkSink = std::function<void(std::string_view)>;

// "*N\r\n$len\r\narg\r\n..." for `args` (binary safe), appended to `out`.
void AppendCommand(std::span<const std::string_view> args, std::string* out);
std::string EncodeCommand(std::initializer_list<std::string_view> args);

struct RespConnectOptions {
  std::chrono::milliseconds timeout{1000};  // connect, TLS handshake, AUTH
  SSL_CTX* tls = nullptr;                   // TLS when set
  std::string tls_server_name;              // SNI and verification name; empty: the host
  std::string user;                         // ACL user (empty: `default`)
  std::string password;                     // AUTH when non-empty
};

class RespConnection {
 public:
  ~RespConnection();
  RespConnection(const RespConnection&) = delete;
  RespConnection& operator=(const RespConnection&) = delete;

  // Connects to host:port (TCP), handshakes TLS and authenticates as asked.
  // A refused AUTH is PermissionDenied with Redis's message.
  static Result<std::unique_ptr<RespConnection>> Connect(const std::string& host, uint16_t port,
                                                         const RespConnectOptions& options);

  // Sends already encoded commands (one or several, pipelined).
  Status Send(std::string_view bytes, Clock::time_point deadline);
  // The next reply. A malformed stream is Corruption (the connection is then
  // unusable); an error reply is returned as a kError value.
  // With a `sink`, a top-level bulk string goes to it (the value comes back
  // with `sunk` set and no bytes).
  Result<RespValue> Read(Clock::time_point deadline, const BulkSink* sink = nullptr);
  // Send one command and read its reply.
  Result<RespValue> Call(std::initializer_list<std::string_view> args, Clock::time_point deadline);

  const std::string& peer() const { return peer_; }

 private:
  RespConnection() = default;
  std::unique_ptr<net::Conn> conn_;
  void* reader_ = nullptr;  // redisReader*
  std::string peer_;        // "host:port", for messages
  // Reads of up to 512 KiB: objects are megabytes, so few syscalls and feeds each.
  static constexpr size_t kReadChunk = 512 << 10;
  std::vector<char> chunk_;
};

// Error replies that mean "not allowed": NOAUTH, NOPERM, WRONGPASS.
bool IsPermissionError(const std::string& message);

}  // namespace flatkv::remote
