#include "remote/cluster_client.h"

#include <algorithm>
#include <functional>
#include <thread>

#include "net/transport.h"

namespace flatkv::remote {
namespace {

// Errors after which the same command is tried again shortly: a slot in
// migration (TRYAGAIN), a cluster without a master for a slot while a
// failover runs (CLUSTERDOWN), a replica turned master still loading, a
// replica whose master is down.
bool IsTransient(const std::string& message) {
  for (const char* p : {"TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN"})
    if (message.rfind(p, 0) == 0) return true;
  return false;
}

struct Redirect {
  bool ask = false;
  uint16_t slot = 0;
  std::string node;
};

// "MOVED 3999 127.0.0.1:6381" or "ASK 3999 127.0.0.1:6381".
bool ParseRedirect(const std::string& message, Redirect* r) {
  const bool moved = message.rfind("MOVED ", 0) == 0, ask = message.rfind("ASK ", 0) == 0;
  if (!moved && !ask) return false;
  const size_t a = message.find(' '), b = message.find(' ', a + 1);
  if (b == std::string::npos) return false;
  const long slot = std::strtol(message.c_str() + a + 1, nullptr, 10);
  if (slot < 0 || slot >= long(kClusterSlots)) return false;
  r->ask = ask;
  r->slot = uint16_t(slot);
  r->node = message.substr(b + 1);
  return !r->node.empty();
}

Result<std::pair<std::string, uint16_t>> SplitNode(const std::string& node) {
  const size_t colon = node.rfind(':');
  if (colon == std::string::npos || colon + 1 == node.size())
    return Status::InvalidArgument("redis node '" + node + "' is not host:port");
  const long port = std::strtol(node.c_str() + colon + 1, nullptr, 10);
  if (port <= 0 || port > 65535) return Status::InvalidArgument("redis node '" + node + "' has no valid port");
  std::string host = node.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::make_pair(host, uint16_t(port));
}

void Backoff(int attempt) { std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20 * (attempt + 1), 200))); }

}  // namespace

uint16_t Crc16(std::string_view bytes) {
  uint16_t crc = 0;
  for (unsigned char c : bytes) {
    crc ^= uint16_t(c) << 8;
    for (int i = 0; i < 8; ++i) crc = (crc & 0x8000) ? uint16_t((crc << 1) ^ 0x1021) : uint16_t(crc << 1);
  }
  return crc;
}

uint16_t KeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return Crc16(key) % kClusterSlots;
}

ClusterClient::ClusterClient(const ClusterOptions& options) : options_(options) { slot_node_.fill(-1); }
ClusterClient::~ClusterClient() = default;

Result<std::unique_ptr<ClusterClient>> ClusterClient::Connect(const ClusterOptions& options) {
  if (options.seeds.empty()) return Status::InvalidArgument("remote: no cluster seed given (seeds = [\"host:port\", ...])");
  for (const auto& s : options.seeds)
    if (auto split = SplitNode(s); !split.ok()) return Status::InvalidArgument("remote: seed " + split.status().message());
  if (options.timeout.count() <= 0) return Status::InvalidArgument("remote: timeout must be positive");
  std::unique_ptr<ClusterClient> c(new ClusterClient(options));
  if (options.tls) {
    auto ctx = net::MakeClientTlsContext(options.tls_ca_file, options.tls_verify);
    if (!ctx.ok()) return ctx.status();
    c->tls_ = *ctx;
  }
  for (const auto& s : options.seeds) c->NodeIndex(s);
  if (Status st = c->RefreshSlots(); !st.ok()) return st;
  return c;
}

int ClusterClient::NodeIndex(const std::string& node) {
  auto it = std::find(nodes_.begin(), nodes_.end(), node);
  if (it != nodes_.end()) return int(it - nodes_.begin());
  nodes_.push_back(node);
  return int(nodes_.size() - 1);
}

Result<RespConnection*> ClusterClient::ConnectionTo(const std::string& node, Pool* pool) {
  if (!pool) pool = &conns_;
  if (auto it = pool->find(node); it != pool->end()) return it->second.get();
  auto split = SplitNode(node);
  if (!split.ok()) return split.status();
  RespConnectOptions o;
  o.timeout = options_.timeout;
  o.tls = tls_.get();
  o.user = options_.user;
  o.password = options_.password;
  auto conn = RespConnection::Connect(split->first, split->second, o);
  if (!conn.ok()) return conn.status();
  ++stats_.reconnects;
  RespConnection* raw = conn->get();
  (*pool)[node] = std::move(conn).value();
  return raw;
}

void ClusterClient::DropConnection(const std::string& node, Pool* pool) { (pool ? pool : &conns_)->erase(node); }

Status ClusterClient::RefreshFrom(const std::string& node) {
  auto conn = ConnectionTo(node);
  if (!conn.ok()) return conn.status();
  auto reply = (*conn)->Call({"CLUSTER", "SLOTS"}, Clock::now() + options_.timeout);
  if (!reply.ok()) {
    DropConnection(node);
    return reply.status();
  }
  if (reply->is_error()) return ReplyError(node, reply->str);
  if (reply->type != RespValue::kArray) return Status::Corruption("CLUSTER SLOTS from " + node + " is not an array");
  const std::string asked_host = SplitNode(node)->first;
  std::array<int16_t, kClusterSlots> map;
  map.fill(-1);
  for (const RespValue& range : reply->elements) {
    if (range.type != RespValue::kArray || range.elements.size() < 3 || range.elements[0].type != RespValue::kInteger ||
        range.elements[1].type != RespValue::kInteger || range.elements[2].type != RespValue::kArray ||
        range.elements[2].elements.size() < 2 || range.elements[2].elements[1].type != RespValue::kInteger)
      return Status::Corruption("CLUSTER SLOTS from " + node + ": malformed slot range");
    const long long lo = range.elements[0].integer, hi = range.elements[1].integer;
    if (lo < 0 || hi < lo || hi >= kClusterSlots) return Status::Corruption("CLUSTER SLOTS from " + node + ": bad slot range");
    const RespValue& master = range.elements[2];
    std::string host = master.elements[0].type == RespValue::kString ? master.elements[0].str : "";
    if (host.empty() || host == "?") host = asked_host;  // "": the node asked
    const int idx = NodeIndex(host + ":" + std::to_string(master.elements[1].integer));
    for (long long s = lo; s <= hi; ++s) map[size_t(s)] = int16_t(idx);
  }
  slot_node_ = map;
  ++stats_.refreshes;
  return Status::Ok();
}

Status ClusterClient::RefreshSlots() {
  // The nodes known to serve slots first, then every address ever seen (the seeds).
  std::vector<std::string> order = Masters();
  for (const auto& n : nodes_)
    if (std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
  std::string errors;
  bool denied = false;
  for (const auto& n : order) {
    Status st = RefreshFrom(n);
    if (st.ok()) return st;
    denied |= st.code() == Code::kPermissionDenied;
    errors += (errors.empty() ? "" : "; ") + st.message();
  }
  const std::string msg = "remote: no cluster node answered CLUSTER SLOTS: " + errors;
  return denied ? Status::PermissionDenied(msg) : Status::IoError(msg);
}

std::vector<std::string> ClusterClient::Masters() const {
  std::vector<std::string> out;
  for (int16_t i : slot_node_)
    if (i >= 0 && std::find(out.begin(), out.end(), nodes_[size_t(i)]) == out.end()) out.push_back(nodes_[size_t(i)]);
  return out;
}

std::string ClusterClient::NodeForSlot(uint16_t slot) const {
  const int16_t i = slot_node_[slot % kClusterSlots];
  return i < 0 ? std::string() : nodes_[size_t(i)];
}

void ClusterClient::PointAllSlotsAtForTest(const std::string& node) { slot_node_.fill(int16_t(NodeIndex(node))); }

Status ClusterClient::ReplyError(const std::string& node, const std::string& message) const {
  if (IsPermissionError(message)) return Status::PermissionDenied("redis at " + node + ": " + message);
  return Status::IoError("redis at " + node + ": " + message);
}

Result<RespValue> ClusterClient::CommandAt(const std::string& node, std::span<const std::string_view> args) {
  auto conn = ConnectionTo(node);
  if (!conn.ok()) return conn.status();
  std::string bytes;
  AppendCommand(args, &bytes);
  const auto deadline = Clock::now() + options_.timeout;
  if (Status st = (*conn)->Send(bytes, deadline); !st.ok()) {
    DropConnection(node);
    return st;
  }
  auto reply = (*conn)->Read(deadline);
  if (!reply.ok()) {
    DropConnection(node);
    return reply.status();
  }
  if (reply->is_error()) return ReplyError(node, reply->str);
  return reply;
}

Result<RespValue> ClusterClient::Command(std::span<const std::string_view> args) {
  if (args.size() < 2) return Status::InvalidArgument("remote: a routed command needs a key (args[1])");
  const uint16_t slot = KeySlot(args[1]);
  std::string bytes;
  AppendCommand(args, &bytes);
  const auto give_up = Clock::now() + options_.retry_for;
  std::string ask_node;
  Status last = Status::IoError("remote: not sent");
  uint32_t redirects = 0;
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0 && Clock::now() >= give_up)
      return Status::IoError("remote: " + std::string(args[0]) + " gave up after " +
                             std::to_string(options_.retry_for.count()) + " ms: " + last.message());
    std::string node = ask_node.empty() ? NodeForSlot(slot) : ask_node;
    if (node.empty()) {
      if (Status st = RefreshSlots(); !st.ok()) last = st;
      node = NodeForSlot(slot);
      if (node.empty()) {
        Backoff(attempt);
        ++stats_.retries;
        continue;
      }
    }
    const bool asking = !ask_node.empty();
    ask_node.clear();
    auto conn = ConnectionTo(node);
    const auto deadline = Clock::now() + options_.timeout;
    Result<RespValue> reply = conn.status();
    if (conn.ok()) {
      Status st = asking ? (*conn)->Send(EncodeCommand({"ASKING"}) + bytes, deadline) : (*conn)->Send(bytes, deadline);
      if (st.ok() && asking) {
        auto ok = (*conn)->Read(deadline);
        if (!ok.ok()) st = ok.status();
      }
      reply = st.ok() ? (*conn)->Read(deadline) : Result<RespValue>(st);
    }
    if (!reply.ok()) {  // the node is gone or stalled: a failover may be under way
      last = reply.status();
      DropConnection(node);
      if (reply.status().code() == Code::kPermissionDenied || reply.status().code() == Code::kInvalidArgument)
        return reply.status();
      (void)RefreshSlots();
      Backoff(attempt);
      ++stats_.retries;
      continue;
    }
    if (!reply->is_error()) return reply;
    Redirect r;
    if (ParseRedirect(reply->str, &r)) {
      if (++redirects > options_.max_redirects)
        return Status::IoError("remote: more than " + std::to_string(options_.max_redirects) + " redirects for slot " +
                               std::to_string(slot) + " (last: " + reply->str + ")");
      if (r.ask) {
        ++stats_.ask;
        ask_node = r.node;
      } else {
        ++stats_.moved;
        slot_node_[r.slot] = int16_t(NodeIndex(r.node));
        (void)RefreshSlots();  // a slot moved: others probably did too
      }
      continue;
    }
    if (IsTransient(reply->str)) {
      last = ReplyError(node, reply->str);
      Backoff(attempt);
      ++stats_.retries;
      continue;
    }
    return ReplyError(node, reply->str);
  }
}

std::vector<Result<RespValue>> ClusterClient::Pipeline(const std::vector<std::vector<std::string_view>>& commands) {
  std::vector<Result<RespValue>> out(commands.size(), Result<RespValue>(Status::IoError("remote: not sent")));
  // Per node: its commands' indices, in order.
  std::map<std::string, std::vector<size_t>> by_node;
  std::vector<size_t> redo;
  for (size_t i = 0; i < commands.size(); ++i) {
    if (commands[i].size() < 2) {
      out[i] = Status::InvalidArgument("remote: a routed command needs a key (args[1])");
      continue;
    }
    const std::string node = NodeForSlot(KeySlot(commands[i][1]));
    if (node.empty()) redo.push_back(i);
    else by_node[node].push_back(i);
  }
  const auto deadline = Clock::now() + options_.timeout;
  std::map<std::string, RespConnection*> sent;
  for (auto& [node, idx] : by_node) {
    auto conn = ConnectionTo(node);
    std::string bytes;
    for (size_t i : idx) AppendCommand(commands[i], &bytes);
    if (conn.ok() && (*conn)->Send(bytes, deadline).ok()) {
      sent[node] = *conn;
    } else {
      DropConnection(node);
      redo.insert(redo.end(), idx.begin(), idx.end());
    }
  }
  for (auto& [node, conn] : sent) {
    const auto& idx = by_node[node];
    for (size_t k = 0; k < idx.size(); ++k) {
      auto reply = conn->Read(deadline);
      if (!reply.ok()) {  // the rest of this node's replies are lost with its connection
        DropConnection(node);
        redo.insert(redo.end(), idx.begin() + long(k), idx.end());
        break;
      }
      Redirect r;
      if (reply->is_error() && (ParseRedirect(reply->str, &r) || IsTransient(reply->str))) {
        redo.push_back(idx[k]);
      } else if (reply->is_error()) {
        out[idx[k]] = ReplyError(node, reply->str);
      } else {
        out[idx[k]] = std::move(reply).value();
      }
    }
  }
  // Redirected, transient or lost: one at a time, with Command's handling.
  std::sort(redo.begin(), redo.end());
  for (size_t i : redo) out[i] = Command(commands[i]);
  return out;
}

void ClusterClient::Stream(const std::vector<std::vector<std::string_view>>& commands, size_t window,
                           const std::function<bool(size_t, Result<RespValue>)>& each,
                           const std::function<void(size_t, std::string_view)>& sink) {
  const size_t n = commands.size();
  window = std::max<size_t>(window, 1);
  std::vector<std::string> node_of(n);
  std::vector<uint8_t> sent(n, 0);
  std::map<std::string, RespConnection*> live;  // this stream's working connections
  size_t next_send = 0;
  const auto deadline_for = [&] { return Clock::now() + options_.timeout; };
  auto send_upto = [&](size_t limit) {
    std::map<std::string, std::pair<std::string, std::vector<size_t>>> batch;
    for (size_t i = next_send; i < limit; ++i) {
      if (commands[i].size() < 2) continue;
      node_of[i] = NodeForSlot(KeySlot(commands[i][1]));
      if (node_of[i].empty()) continue;
      auto& b = batch[node_of[i]];
      AppendCommand(commands[i], &b.first);
      b.second.push_back(i);
    }
    next_send = limit;
    for (auto& [node, b] : batch) {
      RespConnection* conn = nullptr;
      if (auto it = live.find(node); it != live.end()) {
        conn = it->second;
      } else if (auto c = ConnectionTo(node, &stream_conns_); c.ok()) {
        conn = live[node] = *c;
      }
      if (!conn || !conn->Send(b.first, deadline_for()).ok()) {
        live.erase(node);
        DropConnection(node, &stream_conns_);
        continue;  // these are redone through Command
      }
      for (size_t i : b.second) sent[i] = 1;
    }
  };
  send_upto(std::min(n, window));
  bool stopped = false;
  for (size_t i = 0; i < n; ++i) {
    Result<RespValue> r = Status::IoError("remote: not sent");
    bool redo = !sent[i];
    if (sent[i]) {
      auto it = live.find(node_of[i]);
      if (it == live.end()) {
        redo = true;  // its connection failed earlier: the reply is lost
      } else if (const BulkSink bulk = [&](std::string_view b) { sink(i, b); };
                 r = it->second->Read(deadline_for(), sink ? &bulk : nullptr), !r.ok()) {
        live.erase(it);
        DropConnection(node_of[i], &stream_conns_);
        redo = true;
      } else if (Redirect rd; r->is_error() && (ParseRedirect(r->str, &rd) || IsTransient(r->str))) {
        redo = true;
      } else if (r->is_error()) {
        r = ReplyError(node_of[i], r->str);
      }
    }
    if (stopped) continue;  // draining
    if (redo) {
      if (commands[i].size() < 2) r = Status::InvalidArgument("remote: a routed command needs a key (args[1])");
      else r = Command(commands[i]);
    }
    if (!each(i, std::move(r))) {
      stopped = true;
      next_send = n;
      continue;
    }
    if (next_send < n) send_upto(next_send + 1);
  }
}

}  // namespace flatkv::remote
