#include "remote/resp.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstring>

#include "net/transport.h"

namespace flatkv::remote {
namespace {

redisReader* R(void* p) { return static_cast<redisReader*>(p); }

// Replies are built as RespValues straight from the reader's buffer (one
// copy of a bulk string, not hiredis's reply and then ours): a child lives
// in its parent's `elements`, only the root is allocated.
RespValue* Slot(const redisReadTask* task) {
  if (!task->parent) return new RespValue();
  auto* parent = static_cast<RespValue*>(task->parent->obj);
  return &parent->elements[size_t(task->idx)];
}

void* CreateString(const redisReadTask* task, char* str, size_t len) {
  RespValue* v = Slot(task);
  v->type = task->type == REDIS_REPLY_ERROR ? RespValue::kError
            : task->type == REDIS_REPLY_STATUS ? RespValue::kStatus
                                               : RespValue::kString;
  // The root task carries the reader's privdata: Read's sink, if any.
  if (const auto* sink = static_cast<const BulkSink*>(task->privdata);
      sink && !task->parent && task->type == REDIS_REPLY_STRING) {
    (*sink)(std::string_view(str, len));
    v->sunk = true;
    return v;
  }
  v->str.assign(str, len);
  return v;
}

void* CreateArray(const redisReadTask* task, int elements) {
  RespValue* v = Slot(task);
  v->type = RespValue::kArray;
  v->elements.resize(size_t(std::max(elements, 0)));
  return v;
}

void* CreateInteger(const redisReadTask* task, long long value) {
  RespValue* v = Slot(task);
  v->type = RespValue::kInteger;
  v->integer = value;
  return v;
}

void* CreateNil(const redisReadTask* task) {
  RespValue* v = Slot(task);
  v->type = RespValue::kNil;
  return v;
}

void FreeObject(void* root) { delete static_cast<RespValue*>(root); }

redisReplyObjectFunctions kFunctions = {CreateString, CreateArray, CreateInteger, CreateNil, FreeObject};

}  // namespace

void AppendCommand(std::span<const std::string_view> args, std::string* out) {
  out->append("*").append(std::to_string(args.size())).append("\r\n");
  for (std::string_view a : args) out->append("$").append(std::to_string(a.size())).append("\r\n").append(a).append("\r\n");
}

std::string EncodeCommand(std::initializer_list<std::string_view> args) {
  std::string out;
  AppendCommand(std::span<const std::string_view>(args.begin(), args.size()), &out);
  return out;
}

bool IsPermissionError(const std::string& message) {
  return message.rfind("NOAUTH", 0) == 0 || message.rfind("NOPERM", 0) == 0 || message.rfind("WRONGPASS", 0) == 0;
}

RespConnection::~RespConnection() {
  if (reader_) redisReaderFree(R(reader_));
}

Result<std::unique_ptr<RespConnection>> RespConnection::Connect(const std::string& host, uint16_t port,
                                                                const RespConnectOptions& options) {
  net::IgnoreSigpipe();
  std::unique_ptr<RespConnection> c(new RespConnection());
  c->peer_ = host + ":" + std::to_string(port);
  net::Endpoint ep;
  ep.kind = net::Endpoint::kTcp;
  ep.host = host;
  ep.port = port;
  auto fd = net::ConnectSocket(ep, options.timeout);
  if (!fd.ok()) return Status::IoError("redis at " + c->peer_ + ": " + fd.status().message());
  c->conn_ = std::make_unique<net::Conn>(*fd, false);
  const auto deadline = Clock::now() + options.timeout;
  if (options.tls) {
    const std::string name = options.tls_server_name.empty() ? host : options.tls_server_name;
    if (Status st = c->conn_->TlsConnect(options.tls, name, deadline); !st.ok())
      return Status::IoError("redis at " + c->peer_ + ": TLS: " + st.message());
  }
  c->reader_ = redisReaderCreateWithFunctions(&kFunctions);
  if (!c->reader_) return Status::IoError("redisReaderCreate failed");
  R(c->reader_)->maxbuf = 0;  // keep the buffer between replies: values are large and frequent
  if (!options.password.empty()) {
    auto reply = options.user.empty() ? c->Call({"AUTH", options.password}, deadline)
                                      : c->Call({"AUTH", options.user, options.password}, deadline);
    if (!reply.ok()) return reply.status();
    if (reply->is_error()) {
      const std::string who = options.user.empty() ? "the default user" : "user '" + options.user + "'";
      return Status::PermissionDenied("redis at " + c->peer_ + " refused AUTH as " + who + ": " + reply->str);
    }
  }
  return c;
}

Status RespConnection::Send(std::string_view bytes, Clock::time_point deadline) {
  return conn_->Write(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), deadline);
}

Result<RespValue> RespConnection::Read(Clock::time_point deadline, const BulkSink* sink) {
  R(reader_)->privdata = const_cast<BulkSink*>(sink);  // reaches the reply's root task
  for (;;) {
    void* reply = nullptr;
    if (redisReaderGetReply(R(reader_), &reply) != REDIS_OK)
      return Status::Corruption("malformed reply from redis at " + peer_ + ": " + R(reader_)->errstr);
    if (reply) {
      std::unique_ptr<RespValue> v(static_cast<RespValue*>(reply));
      return std::move(*v);
    }
    if (chunk_.empty()) chunk_.resize(kReadChunk);
    auto n = conn_->ReadAvailable(chunk_.data(), chunk_.size(), deadline);
    if (!n.ok()) return Status::IoError("redis at " + peer_ + ": " + n.status().message());
    if (*n == 0) return Status::IoError("redis at " + peer_ + " closed the connection");
    if (redisReaderFeed(R(reader_), chunk_.data(), *n) != REDIS_OK)
      return Status::Corruption("malformed reply from redis at " + peer_ + ": " + R(reader_)->errstr);
  }
}

Result<RespValue> RespConnection::Call(std::initializer_list<std::string_view> args, Clock::time_point deadline) {
  if (Status st = Send(EncodeCommand(args), deadline); !st.ok()) return Status::IoError("redis at " + peer_ + ": " + st.message());
  return Read(deadline);
}

}  // namespace flatkv::remote
