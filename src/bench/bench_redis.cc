#include "bench/bench_redis.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

extern char** environ;

namespace flatkv::tools {
namespace {

Result<std::string> FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string candidate = dir.empty() ? std::string(".") : dir;
    candidate.append("/").append(name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return Status::NotFound(name + " is not on PATH (Debian: apt-get install redis-server redis-tools)");
}

// A loopback port that was free a moment ago (the kernel's choice for a
// bind to port 0).
Result<uint16_t> FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::FromErrno(e, "binding a free loopback port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs argv with stdout captured, stderr to `log`; the child's output and
// exit status.
Result<std::string> RunCapture(const std::vector<std::string>& argv, const std::string& log) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<char*> args;
  for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return Status::FromErrno(rc, "starting " + argv[0]);
  }
  std::string out;
  char chunk[4096];
  for (ssize_t n; (n = ::read(fds[0], chunk, sizeof(chunk))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(chunk, size_t(n));
  }
  ::close(fds[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
    return Status::IoError(argv[0] + " failed (status " + std::to_string(wstatus) + "); see " + log);
  return out;
}

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  for (std::string f; std::getline(in, f, ',');) {
    if (f.size() >= 2 && f.front() == '"' && f.back() == '"') f = f.substr(1, f.size() - 2);
    fields.push_back(f);
  }
  return fields;
}

std::string Command(std::initializer_list<std::string> parts) {
  std::string c = "*";
  c.append(std::to_string(parts.size())).append("\r\n");
  for (const auto& p : parts) c.append("$").append(std::to_string(p.size())).append("\r\n").append(p).append("\r\n");
  return c;
}

}  // namespace

Result<std::string> RedisServer::FindBinary() { return FindOnPath("redis-server"); }

Result<std::unique_ptr<RedisServer>> RedisServer::Start(const std::string& binary, const std::string& dir) {
  auto port = FreePort();
  if (!port.ok()) return port.status();
  std::unique_ptr<RedisServer> server(new RedisServer());
  server->port_ = *port;
  // As a cache is deployed: no RDB snapshots, no AOF, loopback only.
  const std::vector<std::string> argv = {binary, "--port", std::to_string(*port), "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no", "--daemonize", "no",
                                         "--dir", dir, "--logfile", dir + "/redis.log"};
  std::vector<char*> args;
  for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  const int rc = ::posix_spawn(&server->pid_, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    server->pid_ = -1;
    return Status::FromErrno(rc, "starting " + binary);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Status last = Status::IoError("not started");
  while (std::chrono::steady_clock::now() < deadline) {
    int wstatus = 0;
    if (::waitpid(server->pid_, &wstatus, WNOHANG) == server->pid_) {
      server->pid_ = -1;
      return Status::IoError(binary + " exited at start (port " + std::to_string(*port) + "); see " + dir + "/redis.log");
    }
    auto c = RedisClient::Connect(*port);
    if (c.ok() && (last = (*c)->Ping()).ok()) {
      auto version = RunCapture({binary, "--version"}, dir + "/redis.log");
      if (version.ok()) {
        const auto at = version->find("v=");
        if (at != std::string::npos) server->version_ = version->substr(at + 2, version->find(' ', at) - at - 2);
      }
      return server;
    }
    if (!c.ok()) last = c.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::IoError("redis-server did not answer PING within 10 s: " + last.ToString());
}

RedisServer::~RedisServer() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 200; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

Result<std::unique_ptr<RedisClient>> RedisClient::Connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::FromErrno(e, "connecting to redis at 127.0.0.1:" + std::to_string(port));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // as flatkv's client and redis-benchmark do
  return std::unique_ptr<RedisClient>(new RedisClient(fd));
}

RedisClient::~RedisClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status RedisClient::Send(const std::string& command) {
  for (size_t off = 0; off < command.size();) {
    const ssize_t n = ::send(fd_, command.data() + off, command.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "sending to redis");
    off += size_t(n);
  }
  return Status::Ok();
}

Status RedisClient::Fill() {
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "reading from redis");
    if (n == 0) return Status::IoError("redis closed the connection");
    buf_.append(chunk, size_t(n));
    return Status::Ok();
  }
}

Result<std::string> RedisClient::ReadLine() {
  for (;;) {
    const size_t end = buf_.find("\r\n", pos_);
    if (end != std::string::npos) {
      std::string line = buf_.substr(pos_, end - pos_);
      pos_ = end + 2;
      return line;
    }
    if (buf_.size() - pos_ > 1024) return Status::Corruption("redis reply line over 1 KiB");
    if (Status st = Fill(); !st.ok()) return st;
  }
}

Status RedisClient::ReadReply(std::string* bulk, bool* nil) {
  auto line = ReadLine();
  if (!line.ok()) return line.status();
  if (line->empty()) return Status::Corruption("empty redis reply");
  const char type = (*line)[0];
  const std::string rest = line->substr(1);
  if (type == '+') return Status::Ok();
  if (type == '-') return Status::IoError("redis error: " + rest);
  if (type != '$') return Status::Corruption("unexpected redis reply type '" + std::string(1, type) + "'");
  char* end = nullptr;
  const long long len = std::strtoll(rest.c_str(), &end, 10);
  if (end == rest.c_str() || *end != '\0' || len < -1 || len > (64 << 20))
    return Status::Corruption("bad redis bulk length '" + rest + "'");
  if (len == -1) {
    *nil = true;
    return Status::Ok();
  }
  while (buf_.size() - pos_ < size_t(len) + 2)
    if (Status st = Fill(); !st.ok()) return st;
  if (buf_.compare(pos_ + size_t(len), 2, "\r\n") != 0) return Status::Corruption("redis bulk string not ended by CRLF");
  bulk->assign(buf_, pos_, size_t(len));
  pos_ += size_t(len) + 2;
  return Status::Ok();
}

Status RedisClient::Set(const std::string& key, const std::string& value) {
  if (Status st = Send(Command({"SET", key, value})); !st.ok()) return st;
  std::string ignored;
  bool nil = false;
  return ReadReply(&ignored, &nil);
}

Result<std::string> RedisClient::Get(const std::string& key) {
  if (Status st = Send(Command({"GET", key})); !st.ok()) return st;
  std::string value;
  bool nil = false;
  if (Status st = ReadReply(&value, &nil); !st.ok()) return st;
  if (nil) return Status::NotFound("redis has no key " + key);
  return value;
}

Status RedisClient::Ping() {
  if (Status st = Send(Command({"PING"})); !st.ok()) return st;
  std::string ignored;
  bool nil = false;
  return ReadReply(&ignored, &nil);
}

Result<RedisBenchmarkResult> RunRedisBenchmark(uint16_t port, uint32_t clients, uint32_t value_bytes,
                                               uint64_t requests) {
  auto binary = FindOnPath("redis-benchmark");
  if (!binary.ok()) return binary.status();
  auto out = RunCapture({*binary, "-h", "127.0.0.1", "-p", std::to_string(port), "-c", std::to_string(clients), "-n",
                         std::to_string(requests), "-d", std::to_string(value_bytes), "-t", "set,get", "--csv"},
                        "/dev/null");
  if (!out.ok()) return out.status();
  // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
  std::stringstream lines(*out);
  std::vector<std::string> header;
  for (std::string line; std::getline(lines, line);) {
    auto f = SplitCsv(line);
    if (!f.empty() && f[0] == "test") header = f;
    if (f.empty() || f[0] != "GET" || header.size() != f.size()) continue;
    RedisBenchmarkResult r;
    for (size_t i = 1; i < f.size(); ++i) {
      const double v = std::strtod(f[i].c_str(), nullptr);
      if (header[i] == "rps") r.rps = v;
      if (header[i] == "p50_latency_ms") r.p50_us = v * 1e3;
      if (header[i] == "p99_latency_ms") r.p99_us = v * 1e3;
    }
    if (r.rps > 0) return r;
  }
  return Status::Corruption("redis-benchmark printed no GET row with a header: " + out->substr(0, 200));
}

}  // namespace flatkv::tools
