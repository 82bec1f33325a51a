// The Redis GET baseline of `flatkv bench serve`: a redis-server this
// process starts on loopback (when one is installed), a minimal RESP client
// for the same closed-loop harness the daemon's lookups run through, and
// redis-benchmark on the same server as the check that the harness is not
// the bottleneck.
//
// Thread-safety: a RedisServer is used from one thread; each RedisClient
// from one thread at a time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "flatkv/status.h"

namespace flatkv::tools {

// A redis-server child process on 127.0.0.1, persistence off, its files in
// `dir`; stopped (SIGTERM, then SIGKILL) when destroyed.
class RedisServer {
 public:
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // The first `redis-server` on PATH; NotFound when there is none.
  static Result<std::string> FindBinary();
  // Starts `binary` and waits (up to 10 s) until it answers PING.
  static Result<std::unique_ptr<RedisServer>> Start(const std::string& binary, const std::string& dir);

  uint16_t port() const { return port_; }
  const std::string& version() const { return version_; }

 private:
  RedisServer() = default;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::string version_;
};

// One blocking TCP connection speaking RESP2: enough for SET and GET of
// small values, with replies parsed in full (a malformed reply is an error).
class RedisClient {
 public:
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  static Result<std::unique_ptr<RedisClient>> Connect(uint16_t port);
  Status Set(const std::string& key, const std::string& value);
  // The value; NotFound for a nil reply.
  Result<std::string> Get(const std::string& key);
  Status Ping();

 private:
  explicit RedisClient(int fd) : fd_(fd) {}
  Status Send(const std::string& command);
  // Reads one reply: `bulk` receives a bulk string's bytes; `nil` is set for $-1.
  Status ReadReply(std::string* bulk, bool* nil);
  Result<std::string> ReadLine();
  Status Fill();

  int fd_ = -1;
  std::string buf_;
  size_t pos_ = 0;
};

// redis-benchmark's own figures for GET of a `value_bytes` value with
// `clients` connections (its closed loop, single-threaded event loop).
struct RedisBenchmarkResult {
  double rps = 0, p50_us = 0, p99_us = 0;
};
// Runs `redis-benchmark -t set,get -d value_bytes -c clients -n requests
// --csv` against 127.0.0.1:port and parses its GET row; NotFound when
// redis-benchmark is not installed.
Result<RedisBenchmarkResult> RunRedisBenchmark(uint16_t port, uint32_t clients, uint32_t value_bytes,
                                               uint64_t requests);

}  // namespace flatkv::tools
