// Transport: one connected stream socket (Unix or TCP), optionally wrapped
// in TLS, with whole-buffer reads and writes under deadlines, a view of what
// is buffered (for framed protocols: the daemon's frames in
// service/frames.h), and file-descriptor passing (SCM_RIGHTS) on Unix
// sockets. Also address parsing and listening/connecting helpers. The daemon
// (src/service) and the remote tier's RESP client (src/remote) both run on it.
//
// Thread-safety: a Conn is used by one thread at a time, except Shutdown(),
// which any thread may call to wake a blocked reader.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flatkv/status.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace flatkv::net {

using Clock = std::chrono::steady_clock;

struct Endpoint {
  enum Kind { kUnix, kTcp } kind = kUnix;
  std::string path;  // kUnix
  std::string host;  // kTcp
  uint16_t port = 0; // kTcp; 0 when listening: any free port
};
// "unix:/path", "tcp:host:port" (also "host:port" and a bare "/path").
Result<Endpoint> ParseEndpoint(const std::string& address);
// Whether a TCP host is a loopback address (127.0.0.0/8, ::1, localhost).
bool IsLoopbackHost(const std::string& host);

// A listening socket; for TCP with port 0, bound_port() says which.
Result<int> Listen(const Endpoint& ep, uint16_t* bound_port);
Result<int> ConnectSocket(const Endpoint& ep, std::chrono::milliseconds timeout);

// Ignores SIGPIPE process-wide when it still has its default action, so a
// peer that went away is an EPIPE error rather than a killed process.
void IgnoreSigpipe();

// OpenSSL contexts. Server: certificate chain and key in PEM. Client:
// verification against `ca_file` (empty: system defaults) when `verify`.
Result<std::shared_ptr<SSL_CTX>> MakeServerTlsContext(const std::string& cert_file, const std::string& key_file);
Result<std::shared_ptr<SSL_CTX>> MakeClientTlsContext(const std::string& ca_file, bool verify);

class Conn {
 public:
  // Takes ownership of `fd`.
  Conn(int fd, bool unix_socket);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // TLS handshakes; after success every read and write goes through TLS.
  Status TlsAccept(SSL_CTX* ctx, Clock::time_point deadline);
  Status TlsConnect(SSL_CTX* ctx, const std::string& server_name, Clock::time_point deadline);

  // Reads exactly `n` bytes. With `idle_ok`, waiting for the first byte is
  // not bounded by the deadline (a connection idle between requests).
  // Returns Aborted("closed") on a clean EOF before the first byte.
  Status ReadFull(void* buf, size_t n, Clock::time_point deadline, bool idle_ok = false);
  // Reads what is there, at least one byte and at most `n` (buffered bytes
  // first): for stream protocols without frames (RESP). 0 on a clean EOF.
  Result<size_t> ReadAvailable(void* buf, size_t n, Clock::time_point deadline);
  // Reads a frame's payload into scattered buffers (exactly their sum).
  Status ReadV(std::span<iovec> iov, Clock::time_point deadline);
  Status WriteV(std::span<const iovec> iov, Clock::time_point deadline);
  Status Write(std::span<const std::byte> a, Clock::time_point deadline);
  Status Write(std::span<const std::byte> a, std::span<const std::byte> b, Clock::time_point deadline);
  // Sends `frame` with `fd` attached (Unix sockets only, no TLS).
  Status WriteWithFd(std::span<const std::byte> frame, int fd, Clock::time_point deadline);


  // --- non-blocking use, for an event loop (plain sockets only, no TLS) ---
  // Reads what the socket has, without waiting, into the read buffer (at
  // most its 16 KiB); received descriptors are kept for TakeFd. Returns the
  // bytes read: 0 on EOF or when the buffer is full (see BufferFull), and
  // Aborted("would block") when nothing was there.
  Result<size_t> FillBuffer();
  // Whether the last FillBuffer found the socket emptied: it read fewer
  // bytes than it had room for, and no descriptors (a Unix read stops early
  // at passed descriptors). Bytes that come later wake an edge-triggered
  // epoll again, so a loop need not read on to EAGAIN.
  bool Drained() const { return drained_; }
  bool BufferFull() const { return rpos_ == 0 && rend_ == rbuf_.size() && !rbuf_.empty(); }
  // The bytes read into the buffer and not yet consumed (plain sockets: a
  // framed protocol looks for a whole frame there before it reads one).
  std::span<const std::byte> BufferedBytes() const { return std::span(rbuf_.data() + rpos_, rend_ - rpos_); }
  // Writes what the socket takes now; returns how many bytes that was.
  Result<size_t> WriteNow(std::span<const std::byte> a);

  // A file descriptor received with the data read so far, or -1. The
  // caller owns it. Unclaimed ones are closed by DropFds().
  int TakeFd();
  void DropFds();

  // Wakes a reader blocked on this connection (it sees EOF). Thread-safe.
  void Shutdown();
  // Bytes already read and buffered (or decrypted, with TLS): a frame may be
  // readable without waiting on the socket.
  bool Buffered() const;
  int fd() const { return fd_; }
  bool unix_socket() const { return unix_; }
  bool tls() const { return ssl_ != nullptr; }

 private:
  Status WaitFor(short events, Clock::time_point deadline, bool unbounded);
  // One read of at most n bytes; 0 on EOF.
  Result<size_t> ReadSome(void* buf, size_t n, Clock::time_point deadline, bool unbounded);
  Result<size_t> ReadSomeV(iovec* iov, int cnt, Clock::time_point deadline);

  // Copies buffered bytes into `dst`; returns how many.
  size_t FromBuffer(void* dst, size_t n);
  // Keeps the descriptors a recvmsg received with SCM_RIGHTS.
  void KeepFds(msghdr& msg);

  // Small reads (frame headers, lookups) go through a buffer, so a frame
  // usually costs one read; large payloads are read in place.
  static constexpr size_t kBufferBytes = 16 << 10;
  int fd_;
  bool unix_;
  SSL* ssl_ = nullptr;
  std::vector<std::byte> rbuf_;
  size_t rpos_ = 0, rend_ = 0;
  bool drained_ = false;  // see Drained
  std::vector<int> fds_;  // received with SCM_RIGHTS, not yet taken
};

}  // namespace flatkv::net
