#include "service/connection.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "service/metrics.h"
#include "service/server.h"
#include "store/prune_view.h"

namespace flatkv::service {
namespace {

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// Counts a request in flight for the server's queue-depth gauge.
struct InFlight {
  std::atomic<uint64_t>& n;
  explicit InFlight(std::atomic<uint64_t>& g) : n(g) { n.fetch_add(1, std::memory_order_relaxed); }
  ~InFlight() { n.fetch_sub(1, std::memory_order_relaxed); }
};

}  // namespace

Connection::Connection(Server* server, std::unique_ptr<net::Conn> conn, bool tls, std::string peer)
    : server_(server),
      conn_(std::move(conn)),
      tls_(tls),
      peer_(std::move(peer)),
      login_deadline_(Clock::now() + server->config_.login_timeout) {
  server_->metrics_.connections_total.fetch_add(1, std::memory_order_relaxed);
  server_->metrics_.connections_active.fetch_add(1, std::memory_order_relaxed);
}

Connection::~Connection() {
  LeaveLogin();
  for (const Window& w : windows_) ::munmap(w.base, w.bytes);
  server_->metrics_.shm_windows.fetch_sub(windows_.size(), std::memory_order_relaxed);
  server_->metrics_.shm_bytes.fetch_sub(window_bytes_, std::memory_order_relaxed);
  server_->metrics_.connections_active.fetch_sub(1, std::memory_order_relaxed);
}

void Connection::LeaveLogin() {
  if (!in_login_) return;
  in_login_ = false;
  server_->LoggedInOrGone(peer_);
}

Clock::time_point Connection::WriteDeadline() const { return Clock::now() + server_->config_.io_timeout; }

Clock::time_point Connection::DeadlineOf(uint32_t deadline_ms, Clock::time_point arrival) const {
  const ServerConfig& c = server_->config_;
  return arrival + (deadline_ms ? std::min<std::chrono::milliseconds>(std::chrono::milliseconds(deadline_ms), c.max_deadline)
                                : c.default_deadline);
}

Status Connection::Send(const std::vector<std::byte>& frame, Clock::time_point deadline) {
  if (!on_loop_) return conn_->Write(frame, deadline);
  size_t sent = 0;
  if (pending_.empty()) {
    FLATKV_ASSIGN_OR_RETURN(sent, conn_->WriteNow(frame));
  }
  pending_.insert(pending_.end(), frame.begin() + static_cast<ptrdiff_t>(sent), frame.end());
  return Status::Ok();
}

Status Connection::Error(uint32_t id, const Status& status) {
  if (metrics_) metrics_->errors.fetch_add(1, std::memory_order_relaxed);
  return Reply(wire::EncodeError(id, status));
}

bool Connection::ServeRequest() {
  ServerMetrics& m = server_->metrics_;
  auto h = ReadFrame(*conn_, &payload_, server_->config_.max_frame_bytes, WriteDeadline());
  const auto arrival = Clock::now();
  if (!h.ok()) {
    const Status& st = h.status();
    if (st.code() == Code::kInvalidArgument || st.code() == Code::kNotSupported) {
      // A malformed or oversized header: answer, then close (the stream cannot be resynchronized).
      m.frame_errors.fetch_add(1, std::memory_order_relaxed);
      (void)Error(0, st);
    }
    return false;
  }
  InFlight in_flight(m.requests_in_flight);
  Status st = Dispatch(*h, payload_, arrival);
  conn_->DropFds();
  if (payload_.capacity() > (4u << 20)) payload_ = {};  // do not pin a large put's buffer while idle
  return st.ok();
}

Connection::Next Connection::OnReadable() {
  if (tls_) return Next::kWorker;  // OpenSSL does its own reads: the blocking path
  on_loop_ = true;
  // The loop's registration is edge-triggered: it hears of this socket again
  // only when more bytes come, so it reads until the socket is empty (a short
  // read or EAGAIN). What it cannot take (a full buffer) goes to a worker.
  bool drained = false, eof = false;
  for (;;) {
    auto got = conn_->FillBuffer();
    if (!got.ok()) {
      if (got.status().code() != Code::kAborted) return Next::kClose;  // a transport error
      drained = true;
      break;
    }
    if (*got == 0) {
      eof = !conn_->BufferFull();
      break;
    }
    if (conn_->Drained()) {  // a short read: no need for the EAGAIN read after it
      drained = true;
      break;
    }
  }
  if (eof && !conn_->Buffered()) return Next::kClose;
  // Nothing left to answer: the peer has gone, the socket is drained (the loop
  // waits for its next bytes), or bytes are still unread (a worker reads them).
  const auto settled = [&] { return eof ? Next::kClose : drained ? Next::kWait : Next::kWorker; };
  const uint64_t max_payload = logged_in() ? server_->config_.max_frame_bytes : wire::kMaxStringBytes * 2 + 64;
  // A few pipelined frames at most, then a worker takes the rest.
  for (int served = 0; served < 8; ++served) {
    wire::Header h{wire::Type::kPing, 0, 0};
    if (!FrameBuffered(*conn_, max_payload, &h)) return conn_->Buffered() ? Next::kWorker : settled();
    if (!logged_in()) {
      Status hello = Handshake();
      LeaveLogin();
      if (!hello.ok()) {
        if (hello.code() != Code::kAborted) LogInfo("flatkv serve: connection refused at hello: " + hello.ToString());
        return Next::kClose;
      }
    } else {
      if (h.type == wire::Type::kPut || h.type == wire::Type::kRestore || h.type == wire::Type::kPrune) return Next::kWorker;
      if (!ServeRequest()) return Next::kClose;
    }
    if (!pending_.empty()) return Next::kWorker;
    if (server_->stopping_.load()) return Next::kClose;
  }
  return conn_->Buffered() ? Next::kWorker : settled();
}

Connection::Next Connection::ServeOnWorker() {
  on_loop_ = false;
  if (!pending_.empty()) {
    Status st = conn_->Write(pending_, WriteDeadline());
    pending_.clear();
    if (!st.ok()) return Next::kClose;
  }
  // TLS: the socket is readable and OpenSSL reads it; else the loop buffered bytes.
  bool serve = tls_ || conn_->Buffered();
  if (serve && !logged_in()) {
    Status hello = Handshake();
    LeaveLogin();
    if (!hello.ok()) {
      if (hello.code() != Code::kAborted) LogInfo("flatkv serve: connection refused at hello: " + hello.ToString());
      return Next::kClose;
    }
    serve = conn_->Buffered();
  }
  while (serve && !server_->stopping_.load()) {
    if (!ServeRequest()) return Next::kClose;
    serve = conn_->Buffered();
  }
  return Next::kWait;
}

Status Connection::Handshake() {
  // The TLS handshake and the hello together, and the hello_ok reply.
  const auto deadline = login_deadline_;
  if (tls_) FLATKV_RETURN_IF_ERROR(conn_->TlsAccept(server_->tls_.get(), deadline));
  std::vector<std::byte> payload;
  auto read = ReadFrame(*conn_, &payload, wire::kMaxStringBytes * 2 + 64, deadline);
  // Counted out before any reply: a client that reads its hello_ok may connect again at once.
  LeaveLogin();
  if (!read.ok()) {
    const Code code = read.status().code();
    if (code == Code::kInvalidArgument || code == Code::kNotSupported) {
      server_->metrics_.frame_errors.fetch_add(1, std::memory_order_relaxed);
      (void)Error(0, read.status());
    }
    return read.status();
  }
  const wire::Header h = *read;
  if (h.type != wire::Type::kHello) {
    server_->metrics_.frame_errors.fetch_add(1, std::memory_order_relaxed);
    (void)Error(h.request_id, Status::FailedPrecondition("the first frame must be hello, got " + std::string(wire::TypeName(h.type))));
    return Status::InvalidArgument("no hello");
  }
  auto hello = wire::DecodeHello(payload);
  if (!hello.ok()) {
    (void)Error(h.request_id, hello.status());
    return hello.status();
  }
  if (hello->min_version > wire::kMaxProtocol || hello->max_version < wire::kMinProtocol ||
      hello->min_version > hello->max_version) {
    Status st = Status::NotSupported("client speaks protocol versions " + std::to_string(hello->min_version) + ".." +
                                     std::to_string(hello->max_version) + ", this daemon " +
                                     std::to_string(wire::kMinProtocol) + ".." + std::to_string(wire::kMaxProtocol));
    (void)Error(h.request_id, st);
    return st;
  }
  auto tenant = server_->tenants_->Authenticate(hello->token);
  if (!tenant.ok()) {
    server_->metrics_.auth_failures.fetch_add(1, std::memory_order_relaxed);
    (void)Error(h.request_id, tenant.status());
    return tenant.status();
  }
  tenant_ = *tenant;
  metrics_ = server_->tenant_metrics_[tenant_->index].get();
  FLATKV_ASSIGN_OR_RETURN(salter_, KeySalter::Make(*tenant_));
  const Store& store = *server_->store_;
  protocol_ = std::min(hello->max_version, wire::kMaxProtocol);
  wire::HelloOk ok;
  ok.version = protocol_;
  ok.shape = store.options().shape;
  ok.block_tokens = store.options().block_tokens;
  ok.block_layer_bytes = store.BlockLayerBytes();
  ok.max_frame_bytes = server_->config_.max_frame_bytes;
  ok.tenant = tenant_->name;
  return Send(wire::EncodeHelloOk(h.request_id, ok), deadline);
}

Status Connection::Dispatch(const wire::Header& h, std::span<const std::byte> payload, Clock::time_point arrival) {
  const uint32_t id = h.request_id;
  auto bad = [&](const Status& st) {
    server_->metrics_.frame_errors.fetch_add(1, std::memory_order_relaxed);
    return Error(id, st);
  };
  switch (h.type) {
    case wire::Type::kLookup: {
      auto m = wire::DecodeLookup(payload);
      return m.ok() ? Lookup(id, *m, arrival) : bad(m.status());
    }
    case wire::Type::kPut: {
      auto m = wire::DecodePut(payload);
      if (m.ok() && m->has_first_block && protocol_ < 5)
        return bad(Status::NotSupported("put with a first_block needs protocol version 5; this connection negotiated " +
                                        std::to_string(protocol_)));
      return m.ok() ? Put(id, *m, arrival) : bad(m.status());
    }
    case wire::Type::kRestore: {
      auto m = wire::DecodeRestore(payload);
      return m.ok() ? Restore(id, *m, arrival) : bad(m.status());
    }
    case wire::Type::kRegisterShm: {
      auto m = wire::DecodeRegisterShm(payload);
      return m.ok() ? RegisterShm(id, *m) : bad(m.status());
    }
    case wire::Type::kStats:
      if (!payload.empty()) return bad(Status::InvalidArgument("stats: payload must be empty"));
      return Reply(wire::EncodeText(wire::Type::kStatsOk, id, server_->StatsJson(tenant_)));
    case wire::Type::kPing:
      if (!payload.empty()) return bad(Status::InvalidArgument("ping: payload must be empty"));
      return Reply(wire::EncodeEmpty(wire::Type::kPong, id));
    case wire::Type::kHello:
      return bad(Status::FailedPrecondition("hello: already authenticated as tenant " + tenant_->name));
    case wire::Type::kDropSession: {
      if (protocol_ < 2)
        return bad(Status::NotSupported("drop_session needs protocol version 2; this connection negotiated " +
                                        std::to_string(protocol_)));
      auto session = wire::DecodeU64(payload);
      return session.ok() ? DropSession(id, *session) : bad(session.status().WithContext("drop_session"));
    }
    case wire::Type::kPrefetch: {
      if (protocol_ < 3)
        return bad(Status::NotSupported("prefetch needs protocol version 3; this connection negotiated " +
                                        std::to_string(protocol_)));
      auto m = wire::DecodePrefetch(payload);
      return m.ok() ? Prefetch(id, *m) : bad(m.status());
    }
    case wire::Type::kRetain:
    case wire::Type::kTruncateSession: {
      if (protocol_ < 4)
        return bad(Status::NotSupported(std::string(wire::TypeName(h.type)) +
                                        " needs protocol version 4; this connection negotiated " + std::to_string(protocol_)));
      if (h.type == wire::Type::kRetain) {
        auto m = wire::DecodeRetain(payload);
        return m.ok() ? Retain(id, *m) : bad(m.status());
      }
      auto m = wire::DecodeTruncateSession(payload);
      return m.ok() ? TruncateSession(id, *m) : bad(m.status());
    }
    case wire::Type::kPrune: {
      if (protocol_ < 6)
        return bad(Status::NotSupported("prune needs protocol version 6; this connection negotiated " + std::to_string(protocol_)));
      auto m = wire::DecodePrune(payload);
      return m.ok() ? Prune(id, *m, arrival) : bad(m.status());
    }
    default:
      // Reply types.
      return bad(wire::ValidateRequest(h.type, payload).ok()
                     ? Status::InvalidArgument("frame type " + std::string(wire::TypeName(h.type)) + " is not served")
                     : wire::ValidateRequest(h.type, payload));
  }
}

Status Connection::DropSession(uint32_t id, uint64_t session) {
  auto salted = salter_->SaltSession(session);
  if (!salted.ok()) return Error(id, salted.status());
  if (Status st = server_->store_->DropSession(*salted); !st.ok()) {
    // The store names the salted id; the client knows its own.
    if (st.code() == Code::kNotFound) st = Status::NotFound("session " + std::to_string(session) + " has no blocks");
    return Error(id, st.WithContext("drop_session"));
  }
  server_->tenants_->Release(*tenant_, *salted);
  return Reply(wire::EncodeEmpty(wire::Type::kDropSessionOk, id));
}

Status Connection::Prune(uint32_t id, const wire::Prune& m, Clock::time_point arrival) {
  Store& store = *server_->store_;
  if (m.keys.empty()) return Error(id, Status::InvalidArgument("prune: empty chain"));
  if (Clock::now() > DeadlineOf(m.deadline_ms, arrival)) {
    server_->metrics_.deadline_exceeded.fetch_add(1, std::memory_order_relaxed);
    return Error(id, Status::Aborted("prune: deadline of " + std::to_string(m.deadline_ms) + " ms exceeded before it started"));
  }
  const uint32_t bt = store.options().block_tokens, n = static_cast<uint32_t>(m.keys.size());
  if (Status st = ValidatePruneSet(m.ranges, n * bt); !st.ok()) return Error(id, st);
  // The view's keys and session as the client computes them (from its own,
  // unsalted chain), salted like every key and session of the tenant: a
  // lookup of PruneViewKeys finds the view, a drop_session of its
  // view_session drops it.
  const std::vector<BlockKey> view = PruneViewKeys(m.keys.back(), n, m.ranges, bt);
  const uint64_t client_session = PruneViewSession(view[0]);
  if (Status st = salter_->SaltKeys(m.keys, &salted_); !st.ok()) return Error(id, st);
  const std::vector<BlockKey> chain = salted_;
  if (Status st = salter_->SaltKeys(view, &salted_); !st.ok()) return Error(id, st);
  // Nothing is charged (or evicted for the charge) for a chain not wholly
  // stored, unless the view exists already (PruneInto then writes nothing).
  if (const uint32_t stored = store.Match(chain); stored < n && store.Match(salted_) < view.size())
    return Error(id, Status::NotFound("prune: " + std::to_string(stored) + " of the chain's " + std::to_string(n) +
                                      " blocks are stored"));
  auto session = salter_->SaltSession(client_session);
  if (!session.ok()) return Error(id, session.status());
  const uint64_t bb = store.BlockBytes();
  const uint64_t fresh = (view.size() - store.Match(salted_)) * bb;
  Status st = server_->tenants_->Charge(*tenant_, *session, fresh, [&](uint64_t victim) { return store.DropSession(victim); });
  if (!st.ok()) return Error(id, st.WithContext("prune"));
  PutOptions po;
  po.hint = static_cast<PutHint>(m.hint);
  po.tenant = tenant_->index + 1;
  auto r = PruneInto(store, chain, m.ranges, salted_, *session, po);
  if (!r.ok()) {
    server_->tenants_->Refund(*tenant_, *session, fresh);
    return Error(id, r.status());
  }
  r->view_session = client_session;
  return Reply(wire::EncodePruneOk(id, *r));
}

Status Connection::Prefetch(uint32_t id, const wire::Lookup& m) {
  if (Status st = salter_->SaltKeys(m.keys, &salted_); !st.ok()) return Error(id, st);
  auto hit = server_->store_->Prefetch(salted_);
  if (!hit.ok()) return Error(id, hit.status().WithContext("prefetch"));
  return Reply(wire::EncodeU32(wire::Type::kPrefetchOk, id, *hit));
}

Status Connection::Retain(uint32_t id, const wire::Retain& m) {
  if (Status st = salter_->SaltKeys(m.chain.keys, &salted_); !st.ok()) return Error(id, st);
  Store& store = *server_->store_;
  const auto ttl = std::min(std::chrono::milliseconds(m.ttl_ms), server_->config_.max_retain);
  if (salted_.empty()) return Reply(wire::EncodeU32(wire::Type::kRetainOk, id, 0));
  // The tenant's budget first (what it grants bounds the chain), then the store.
  uint32_t blocks = ttl.count() == 0 ? 0 : store.Match(salted_);
  const uint64_t bb = store.BlockBytes();
  const uint64_t granted = server_->tenants_->Retain(*tenant_, salted_[0], blocks * bb, Clock::now() + ttl,
                                                     server_->config_.tenant_pinned_bytes);
  blocks = static_cast<uint32_t>(granted / bb);
  auto retained = store.Retain(std::span(salted_).first(ttl.count() == 0 ? salted_.size() : blocks), ttl);
  if (!retained.ok()) {
    (void)server_->tenants_->Retain(*tenant_, salted_[0], 0, {}, 0);
    return Error(id, retained.status().WithContext("retain"));
  }
  if (*retained < blocks)  // the store kept fewer: charge only those
    (void)server_->tenants_->Retain(*tenant_, salted_[0], *retained * bb, Clock::now() + ttl,
                                    server_->config_.tenant_pinned_bytes);
  return Reply(wire::EncodeU32(wire::Type::kRetainOk, id, *retained));
}

Status Connection::TruncateSession(uint32_t id, const wire::TruncateSession& m) {
  auto salted = salter_->SaltSession(m.session);
  if (!salted.ok()) return Error(id, salted.status());
  auto released = server_->store_->TruncateSession(*salted, m.keep_blocks);
  if (!released.ok()) {
    Status st = released.status();
    if (st.code() == Code::kNotFound) st = Status::NotFound("session " + std::to_string(m.session) + " has no blocks");
    return Error(id, st.WithContext("truncate_session"));
  }
  // The released blocks were the session's own puts: its quota use shrinks by them.
  server_->tenants_->Refund(*tenant_, *salted, uint64_t{*released} * server_->store_->BlockBytes());
  return Reply(wire::EncodeU32(wire::Type::kTruncateSessionOk, id, *released));
}

Status Connection::Lookup(uint32_t id, const wire::Lookup& m, Clock::time_point arrival) {
  if (Status st = salter_->SaltKeys(m.keys, &salted_); !st.ok()) return Error(id, st);
  const uint32_t hit = server_->store_->Match(salted_);
  metrics_->lookups.fetch_add(1, std::memory_order_relaxed);
  metrics_->lookup_keys.fetch_add(m.keys.size(), std::memory_order_relaxed);
  metrics_->lookup_hit_blocks.fetch_add(hit, std::memory_order_relaxed);
  Status st = Reply(wire::EncodeU32(wire::Type::kLookupOk, id, hit));
  metrics_->lookup_us.Record(MicrosSince(arrival));
  return st;
}

Status Connection::Put(uint32_t id, const wire::Put& m, Clock::time_point arrival) {
  Store& store = *server_->store_;
  const uint64_t bb = store.BlockBytes();
  if (m.data.size() != m.keys.size() * bb) {
    return Error(id, Status::InvalidArgument("put: " + std::to_string(m.data.size()) + " payload bytes for " +
                                             std::to_string(m.keys.size()) + " blocks of " + std::to_string(bb)));
  }
  if (Clock::now() > DeadlineOf(m.deadline_ms, arrival)) {
    server_->metrics_.deadline_exceeded.fetch_add(1, std::memory_order_relaxed);
    return Error(id, Status::Aborted("put: deadline of " + std::to_string(m.deadline_ms) + " ms exceeded before it started"));
  }
  if (Status st = salter_->SaltKeys(m.keys, &salted_); !st.ok()) return Error(id, st);
  auto session = salter_->SaltSession(m.session);
  if (!session.ok()) return Error(id, session.status());
  // Charged: the blocks after the stored prefix. A put that fails partway
  // keeps the blocks it stored; only the charge for the others is refunded.
  const size_t prefix = store.Match(salted_);
  const uint64_t fresh = (m.keys.size() - prefix) * bb;
  Status st = server_->tenants_->Charge(*tenant_, *session, fresh, [&](uint64_t victim) { return store.DropSession(victim); });
  if (st.ok()) {
    PutOptions po;
    po.hint = static_cast<PutHint>(m.hint);
    po.tenant = tenant_->index + 1;  // DRAM is shared fairly between tenants
    if (m.has_first_block) po.first_block = m.first_block;
    st = store.Put(*session, salted_, m.data, po);
    if (!st.ok()) {
      uint64_t stored = 0;
      for (size_t i = prefix; i < salted_.size(); ++i) stored += store.Match({&salted_[i], 1});
      server_->tenants_->Refund(*tenant_, *session, fresh - std::min<uint64_t>(fresh, stored * bb));
    }
  }
  if (!st.ok()) return Error(id, st);
  metrics_->puts.fetch_add(1, std::memory_order_relaxed);
  metrics_->put_blocks.fetch_add(m.keys.size(), std::memory_order_relaxed);
  metrics_->put_bytes.fetch_add(m.data.size(), std::memory_order_relaxed);
  Status reply = Reply(wire::EncodeU32(wire::Type::kPutOk, id, static_cast<uint32_t>(m.keys.size())));
  metrics_->put_us.Record(MicrosSince(arrival));
  return reply;
}

Status Connection::Restore(uint32_t id, const wire::Restore& m, Clock::time_point arrival) {
  Store& store = *server_->store_;
  const uint32_t layers = store.options().shape.layers;
  const uint64_t lb = store.BlockLayerBytes(), n = m.keys.size();
  const auto deadline = DeadlineOf(m.deadline_ms, arrival);
  const bool shm = m.mode == wire::RestoreMode::kShm;
  RestoreTarget target;
  if (shm) {
    auto w = std::find_if(windows_.begin(), windows_.end(), [&](const Window& x) { return x.id == m.shm_id; });
    if (w == windows_.end()) {
      return Error(id, Status::NotFound("restore: no shared-memory window " + std::to_string(m.shm_id) + " on this connection"));
    }
    const uint64_t need = n * layers * lb;
    if (m.shm_offset > w->bytes || w->bytes - m.shm_offset < need) {
      return Error(id, Status::InvalidArgument("restore: " + std::to_string(n) + " blocks (" + std::to_string(need) +
                                               " bytes) at offset " + std::to_string(m.shm_offset) + " exceed window " +
                                               std::to_string(m.shm_id) + " of " + std::to_string(w->bytes) + " bytes"));
    }
    std::byte* base = w->base + m.shm_offset;
    target.destination = [base, n, lb](uint32_t l, uint32_t b) { return base + (uint64_t{l} * n + b) * lb; };
  }
  if (Status st = salter_->SaltKeys(m.keys, &salted_); !st.ok()) return Error(id, st);
  auto started = store.StartRestore(salted_, target);
  if (!started.ok()) return Error(id, started.status());
  flatkv::Restore& r = **started;
  const uint32_t hit = r.hit_blocks();
  // The restore pins its hit blocks' extents until it ends: bounded per
  // tenant in bytes, and in time (a slow reader is cut off).
  const ServerConfig& c = server_->config_;
  const uint64_t pinned = uint64_t{hit} * store.BlockBytes();
  if (Status st = server_->tenants_->Pin(*tenant_, pinned, c.tenant_pinned_bytes); !st.ok()) return Error(id, st.WithContext("restore"));
  struct Unpin {
    TenantRegistry* reg;
    const Tenant* t;
    uint64_t bytes;
    ~Unpin() { reg->Unpin(*t, bytes); }
  } unpin{server_->tenants_.get(), tenant_, pinned};
  const auto pin_deadline = arrival + c.max_restore_time;
  auto write_deadline = [&] { return std::min(WriteDeadline(), pin_deadline); };
  // An error frame that ends the restore is bounded the same way: a reader
  // that has not drained the layers is not waited for, with the pins held.
  auto fail = [&](const Status& st) {
    metrics_->errors.fetch_add(1, std::memory_order_relaxed);
    return conn_->Write(wire::EncodeError(id, st), write_deadline());
  };
  FLATKV_RETURN_IF_ERROR(conn_->Write(wire::EncodeU32(wire::Type::kRestoreBegin, id, hit), write_deadline()));
  const uint64_t per_frame = std::max<uint64_t>(1, (server_->config_.max_frame_bytes - 64) / lb);
  uint64_t bytes = 0;
  for (uint32_t l = 0; l < layers; ++l) {
    if (Clock::now() > deadline) {
      server_->metrics_.deadline_exceeded.fetch_add(1, std::memory_order_relaxed);
      return fail(Status::Aborted("restore: deadline exceeded at layer " + std::to_string(l) + " of " + std::to_string(layers)));
    }
    if (Clock::now() > pin_deadline) {
      server_->metrics_.deadline_exceeded.fetch_add(1, std::memory_order_relaxed);
      return fail(Status::Aborted("restore: held its blocks for limits.max_restore_ms = " +
                                  std::to_string(c.max_restore_time.count()) + " ms at layer " + std::to_string(l) + " of " +
                                  std::to_string(layers) + "; cut off"));
    }
    auto view = r.WaitLayer(l);
    if (!view.ok()) return fail(view.status());
    const uint32_t valid = view->blocks;
    if (shm || valid == 0) {
      FLATKV_RETURN_IF_ERROR(conn_->Write(wire::EncodeRestoreLayerHead(id, {l, 0, shm ? valid : 0, valid, {}}, 0), write_deadline()));
    } else {
      for (uint32_t first = 0; first < valid; first += static_cast<uint32_t>(per_frame)) {
        const uint32_t cnt = static_cast<uint32_t>(std::min<uint64_t>(per_frame, valid - first));
        auto head = wire::EncodeRestoreLayerHead(id, {l, first, cnt, valid, {}}, uint64_t{cnt} * lb);
        // A reader slower than max_restore_ms fails this write: the connection closes and the pins go.
        FLATKV_RETURN_IF_ERROR(conn_->Write(head, view->data.subspan(uint64_t{first} * lb, uint64_t{cnt} * lb), write_deadline()));
      }
    }
    bytes += uint64_t{valid} * lb;
    r.ReleaseLayer(l);
  }
  const uint32_t valid = r.Finish();
  uint64_t dram = 0, ssd = 0, remote = 0;
  for (uint32_t b = 0; b < valid; ++b) {
    const Medium m = r.locations()[b].layer0.medium();
    (m == Medium::kDram ? dram : m == Medium::kRemote ? remote : ssd)++;
  }
  metrics_->restores.fetch_add(1, std::memory_order_relaxed);
  metrics_->restore_keys.fetch_add(n, std::memory_order_relaxed);
  metrics_->restore_miss_blocks.fetch_add(n - valid, std::memory_order_relaxed);
  metrics_->restore_hit_dram.fetch_add(dram, std::memory_order_relaxed);
  metrics_->restore_hit_ssd.fetch_add(ssd, std::memory_order_relaxed);
  metrics_->restore_hit_remote.fetch_add(remote, std::memory_order_relaxed);
  (shm ? metrics_->restore_bytes_shm : metrics_->restore_bytes_stream).fetch_add(bytes, std::memory_order_relaxed);
  Status st = Reply(wire::EncodeU32(wire::Type::kRestoreEnd, id, valid));
  metrics_->restore_us.Record(MicrosSince(arrival));
  return st;
}

Status Connection::RegisterShm(uint32_t id, const wire::RegisterShm& m) {
  const int fd = conn_->TakeFd();
  if (fd < 0) {
    return Error(id, conn_->unix_socket() ? Status::InvalidArgument("register_shm: no file descriptor attached (SCM_RIGHTS)")
                                          : Status::NotSupported("register_shm: shared memory needs a unix: connection"));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const ServerConfig& c = server_->config_;
  if (windows_.size() >= c.max_shm_windows || m.bytes > c.max_shm_bytes - std::min(c.max_shm_bytes, window_bytes_)) {
    return Error(id, Status::NoSpace("register_shm: " + std::to_string(m.bytes) + " more bytes exceed this connection's limits (" +
                                     std::to_string(c.max_shm_windows) + " windows, " + std::to_string(c.max_shm_bytes) +
                                     " bytes: limits.max_shm_windows, limits.max_shm_bytes)"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Error(id, Status::FromErrno(errno, "register_shm: fstat"));
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < m.bytes) {
    return Error(id, Status::InvalidArgument("register_shm: the descriptor is not a memfd of at least " + std::to_string(m.bytes) +
                                             " bytes (size " + std::to_string(st.st_size) + ")"));
  }
  // A window that could shrink under a restore would SIGBUS the daemon.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    return Error(id, Status::FailedPrecondition("register_shm: the memfd must carry F_SEAL_SHRINK"));
  }
  // The client allocates the window's memory (fallocate), so it is charged
  // to the client; a sparse memfd would have the daemon fault in (and be
  // charged for) every page it writes. st_blocks counts 512-byte units.
  const uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  if (allocated < m.bytes) {
    return Error(id, Status::FailedPrecondition("register_shm: the memfd has " + std::to_string(allocated) + " of its " +
                                                std::to_string(m.bytes) +
                                                " bytes allocated; allocate them (fallocate) before registering it"));
  }
  // The daemon-wide cap (limits.max_shm_total_bytes), reserved before mapping.
  std::atomic<uint64_t>& total = server_->metrics_.shm_bytes;
  for (uint64_t now = total.load();;) {
    if (m.bytes > c.max_shm_total_bytes || now > c.max_shm_total_bytes - m.bytes) {
      return Error(id, Status::NoSpace("register_shm: " + std::to_string(m.bytes) + " more bytes exceed the daemon's " +
                                       std::to_string(c.max_shm_total_bytes) + " bytes of windows for all connections (" +
                                       std::to_string(now) + " mapped; limits.max_shm_total_bytes)"));
    }
    if (total.compare_exchange_weak(now, now + m.bytes)) break;
  }
  // No MAP_POPULATE: the pages are the client's, already allocated; the
  // daemon maps them lazily.
  // MAP_POPULATE: the window's pages are mapped here once, not faulted in by each restore's
  // first write (the client maps its side populated too).
  void* base = ::mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    total.fetch_sub(m.bytes);
    return Error(id, Status::FromErrno(err, "register_shm: mmap of " + std::to_string(m.bytes) + " bytes"));
  }
  windows_.push_back({next_window_id_++, static_cast<std::byte*>(base), m.bytes});
  window_bytes_ += m.bytes;
  server_->metrics_.shm_windows.fetch_add(1, std::memory_order_relaxed);
  return Reply(wire::EncodeU64(wire::Type::kShmOk, id, windows_.back().id));
}

}  // namespace flatkv::service
