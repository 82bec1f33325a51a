#include "service/client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/mutex.h"
#include "service/frames.h"
#include "service/wire.h"

namespace flatkv::service {
namespace {

constexpr uint64_t kPage = 4096;

class ClientImpl final : public Client {
 public:
  ClientImpl(std::unique_ptr<net::Conn> conn, ClientOptions options, std::shared_ptr<SSL_CTX> tls)
      : conn_(std::move(conn)), options_(std::move(options)), tls_(std::move(tls)) {}
  ~ClientImpl() override {
    for (const ShmWindow& w : windows_) ::munmap(w.base, w.bytes);
  }

  Status Hello() {
    MutexLock lock(&mu_);
    const auto deadline = Clock::now() + options_.connect_timeout;
    wire::Hello h;
    h.token = options_.token;
    h.client_name = options_.client_name;
    FLATKV_ASSIGN_OR_RETURN(auto reply, Call(wire::EncodeHello(NextId(), h), wire::Type::kHelloOk, deadline));
    FLATKV_ASSIGN_OR_RETURN(wire::HelloOk ok, wire::DecodeHelloOk(reply));
    info_.protocol_version = ok.version;
    info_.tenant = ok.tenant;
    info_.shape = ok.shape;
    info_.block_tokens = ok.block_tokens;
    info_.block_layer_bytes = ok.block_layer_bytes;
    info_.block_bytes = ok.block_layer_bytes * ok.shape.layers;
    info_.max_frame_bytes = ok.max_frame_bytes;
    return Status::Ok();
  }

  const ServerInfo& info() const override { return info_; }

  Result<uint32_t> Lookup(std::span<const BlockKey> chain) override {
    MutexLock lock(&mu_);
    wire::Lookup m;
    m.deadline_ms = DeadlineMs();
    m.keys.assign(chain.begin(), chain.end());
    FLATKV_ASSIGN_OR_RETURN(auto reply, Call(wire::EncodeLookup(NextId(), m), wire::Type::kLookupOk, Deadline()));
    return wire::DecodeU32(reply);
  }

  Status Put(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data, PutHint hint,
             uint32_t first_block) override {
    MutexLock lock(&mu_);
    // A daemon below protocol 5 places the blocks by its own rule (going on
    // from the session's last position), which a position only refines.
    if (info_.protocol_version < 5) first_block = kNoPosition;
    const uint64_t bb = info_.block_bytes;
    if (data.size() != keys.size() * bb) {
      return Status::InvalidArgument("put: " + std::to_string(data.size()) + " bytes for " + std::to_string(keys.size()) +
                                     " blocks of " + std::to_string(bb) + " bytes");
    }
    const uint64_t per_frame = (info_.max_frame_bytes > 64 ? info_.max_frame_bytes - 64 : 0) / (16 + bb);
    if (per_frame == 0) {
      return Status::InvalidArgument("put: one block of " + std::to_string(bb) + " bytes exceeds the daemon's frame limit of " +
                                     std::to_string(info_.max_frame_bytes));
    }
    for (size_t at = 0; at < keys.size(); at += per_frame) {
      const size_t n = std::min<size_t>(per_frame, keys.size() - at);
      wire::Put m;
      m.deadline_ms = DeadlineMs();
      m.session = session;
      m.hint = static_cast<uint8_t>(hint);
      if (first_block != kNoPosition) {  // each frame's keys[0] is `at` blocks further on
        m.has_first_block = true;
        m.first_block = first_block + static_cast<uint32_t>(at);
      }
      m.keys.assign(keys.begin() + at, keys.begin() + at + n);
      auto chunk = data.subspan(at * bb, n * bb);
      const auto deadline = Deadline();
      auto head = wire::EncodePutHead(NextId(), m, chunk.size());
      FLATKV_RETURN_IF_ERROR(Transport(conn_->Write(head, chunk, deadline)));
      FLATKV_ASSIGN_OR_RETURN(auto reply, ReadReply(wire::Type::kPutOk, deadline));
      FLATKV_RETURN_IF_ERROR(wire::DecodeU32(reply).status());
    }
    return Status::Ok();
  }

  Result<RestoreResult> Restore(std::span<const BlockKey> chain, std::span<std::byte> out) override {
    if (out.size() < chain.size() * info_.block_bytes) {
      return Status::InvalidArgument("restore: output of " + std::to_string(out.size()) + " bytes cannot hold " +
                                     std::to_string(chain.size()) + " blocks of " + std::to_string(info_.block_bytes));
    }
    MutexLock lock(&mu_);
    const uint64_t lb = info_.block_layer_bytes, bb = info_.block_bytes;
    return StreamRestore(chain, [&](uint32_t layer, uint32_t first, uint32_t blocks) {
      std::vector<iovec> iov(blocks);
      for (uint32_t b = 0; b < blocks; ++b) iov[b] = {out.data() + (first + b) * bb + layer * lb, lb};
      return iov;
    }, nullptr);
  }

  Result<RestoreResult> RestoreLayers(std::span<const BlockKey> chain, const LayerCallback& on_layer) override {
    MutexLock lock(&mu_);
    const uint64_t lb = info_.block_layer_bytes;
    std::vector<std::byte> layer_buf(chain.size() * lb);
    return StreamRestore(chain, [&](uint32_t, uint32_t first, uint32_t blocks) {
      return std::vector<iovec>{{layer_buf.data() + first * lb, uint64_t{blocks} * lb}};
    }, [&](uint32_t layer, uint32_t valid) { return on_layer(layer, valid, std::span(layer_buf.data(), valid * lb)); });
  }

  Result<ShmWindow> RegisterShmWindow(uint64_t bytes) override {
    MutexLock lock(&mu_);
    if (!conn_->unix_socket()) return Status::NotSupported("shared-memory windows need a unix: connection");
    if (bytes == 0) return Status::InvalidArgument("shared-memory window of 0 bytes");
    bytes = (bytes + kPage - 1) / kPage * kPage;
    const int fd = ::memfd_create("flatkv-window", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return Status::FromErrno(errno, "memfd_create");
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    // Allocated here, not sparse: the pages are charged to this process, and
    // the daemon refuses a window whose blocks do not cover its size.
    if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
      return Status::FromErrno(rc, "fallocate(memfd, " + std::to_string(bytes) + ")");
    }
    // The daemon refuses a window that could shrink under it (SIGBUS).
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) return Status::FromErrno(errno, "sealing the memfd");
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) return Status::FromErrno(errno, "mmap of a " + std::to_string(bytes) + "-byte window");
    const auto deadline = Deadline();
    Status st = Transport(conn_->WriteWithFd(wire::EncodeRegisterShm(NextId(), {bytes}), fd, deadline));
    Result<std::vector<std::byte>> reply = st.ok() ? ReadReply(wire::Type::kShmOk, deadline) : Result<std::vector<std::byte>>(st);
    Result<uint64_t> id = reply.ok() ? wire::DecodeU64(*reply) : Result<uint64_t>(reply.status());
    if (!id.ok()) {
      ::munmap(base, bytes);
      return id.status();
    }
    ShmWindow w{*id, static_cast<std::byte*>(base), bytes};
    windows_.push_back(w);
    return w;
  }

  Result<RestoreResult> RestoreToShm(const ShmWindow& window, uint64_t offset, std::span<const BlockKey> chain,
                                     const LayerCallback& on_layer) override {
    MutexLock lock(&mu_);
    const uint64_t lb = info_.block_layer_bytes, n = chain.size();
    if (offset > window.bytes || window.bytes - offset < n * info_.block_bytes) {
      return Status::InvalidArgument("restore to window " + std::to_string(window.id) + ": " + std::to_string(n) +
                                     " blocks at offset " + std::to_string(offset) + " exceed its " +
                                     std::to_string(window.bytes) + " bytes");
    }
    wire::Restore m;
    m.deadline_ms = DeadlineMs();
    m.mode = wire::RestoreMode::kShm;
    m.shm_id = window.id;
    m.shm_offset = offset;
    m.keys.assign(chain.begin(), chain.end());
    const auto deadline = Deadline();
    FLATKV_ASSIGN_OR_RETURN(auto begin, Call(wire::EncodeRestore(NextId(), m), wire::Type::kRestoreBegin, deadline));
    RestoreResult result;
    FLATKV_ASSIGN_OR_RETURN(result.hit_blocks, wire::DecodeU32(begin));
    for (;;) {
      std::vector<std::byte> payload;
      FLATKV_ASSIGN_OR_RETURN(wire::Header h, ReadAny(&payload, deadline));
      if (h.type == wire::Type::kError) return wire::ErrorStatus(payload);
      if (h.type == wire::Type::kRestoreEnd) {
        FLATKV_ASSIGN_OR_RETURN(result.valid_blocks, wire::DecodeU32(payload));
        return result;
      }
      if (h.type != wire::Type::kRestoreLayer) return Broken("restore: unexpected " + std::string(wire::TypeName(h.type)) + " frame");
      FLATKV_ASSIGN_OR_RETURN(wire::RestoreLayer layer, wire::DecodeRestoreLayer(payload));
      if (layer.valid > n || layer.layer >= info_.shape.layers) return Broken("restore: layer frame out of range");
      if (on_layer) {
        Status st = on_layer(layer.layer, layer.valid,
                             std::span<const std::byte>(window.base + offset + layer.layer * n * lb, layer.valid * lb));
        if (!st.ok()) {
          (void)Broken("restore abandoned by the caller: " + st.ToString());
          return st;
        }
      }
    }
  }

  Result<std::string> StatsJson() override {
    MutexLock lock(&mu_);
    FLATKV_ASSIGN_OR_RETURN(auto reply, Call(wire::EncodeEmpty(wire::Type::kStats, NextId()), wire::Type::kStatsOk, Deadline()));
    return std::string(reinterpret_cast<const char*>(reply.data()), reply.size());
  }

  Status DropSession(SessionId session) override {
    MutexLock lock(&mu_);
    FLATKV_RETURN_IF_ERROR(NeedProtocol(2, "drop_session"));
    return Call(wire::EncodeU64(wire::Type::kDropSession, NextId(), session), wire::Type::kDropSessionOk, Deadline())
        .status();
  }

  Result<uint32_t> Prefetch(std::span<const BlockKey> chain) override {
    MutexLock lock(&mu_);
    FLATKV_RETURN_IF_ERROR(NeedProtocol(3, "prefetch"));
    wire::Lookup m;
    m.deadline_ms = DeadlineMs();
    m.keys.assign(chain.begin(), chain.end());
    FLATKV_ASSIGN_OR_RETURN(auto reply, Call(wire::EncodePrefetch(NextId(), m), wire::Type::kPrefetchOk, Deadline()));
    return wire::DecodeU32(reply);
  }

  Result<uint32_t> Retain(std::span<const BlockKey> chain, std::chrono::milliseconds ttl) override {
    MutexLock lock(&mu_);
    FLATKV_RETURN_IF_ERROR(NeedProtocol(4, "retain"));
    if (ttl.count() < 0 || ttl.count() > UINT32_MAX)
      return Status::InvalidArgument("retain: ttl " + std::to_string(ttl.count()) + " ms is outside 0..4294967295");
    wire::Retain m;
    m.ttl_ms = static_cast<uint32_t>(ttl.count());
    m.chain.deadline_ms = DeadlineMs();
    m.chain.keys.assign(chain.begin(), chain.end());
    FLATKV_ASSIGN_OR_RETURN(auto reply, Call(wire::EncodeRetain(NextId(), m), wire::Type::kRetainOk, Deadline()));
    return wire::DecodeU32(reply);
  }

  Result<uint32_t> TruncateSession(SessionId session, uint32_t keep_blocks) override {
    MutexLock lock(&mu_);
    FLATKV_RETURN_IF_ERROR(NeedProtocol(4, "truncate_session"));
    FLATKV_ASSIGN_OR_RETURN(auto reply, Call(wire::EncodeTruncateSession(NextId(), {session, keep_blocks}),
                                             wire::Type::kTruncateSessionOk, Deadline()));
    return wire::DecodeU32(reply);
  }

  Result<PruneResult> Prune(std::span<const BlockKey> chain, std::span<const TokenRange> ranges, PutHint hint) override {
    MutexLock lock(&mu_);
    FLATKV_RETURN_IF_ERROR(NeedProtocol(6, "prune"));
    wire::Prune m;
    m.deadline_ms = DeadlineMs();
    m.hint = static_cast<uint8_t>(hint);
    m.ranges.assign(ranges.begin(), ranges.end());
    m.keys.assign(chain.begin(), chain.end());
    FLATKV_ASSIGN_OR_RETURN(auto reply, Call(wire::EncodePrune(NextId(), m), wire::Type::kPruneOk, Deadline()));
    return wire::DecodePruneOk(reply);
  }

  Status Health() override {
    MutexLock lock(&mu_);
    return Call(wire::EncodeEmpty(wire::Type::kPing, NextId()), wire::Type::kPong, Deadline()).status();
  }

  bool PeerClosed() override {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return true;
    // POLLRDHUP: the peer shut its side (a daemon that exited, even by kill -9). Readable data
    // alone is no sign (a TLS peer may send records unasked), so POLLIN is not asked for.
    pollfd p{conn_->fd(), POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
  }

 private:
  Status NeedProtocol(uint32_t version, const char* what) const FLATKV_REQUIRES(mu_) {
    if (info_.protocol_version >= version) return Status::Ok();
    return Status::NotSupported(std::string(what) + ": the daemon speaks protocol version " +
                                std::to_string(info_.protocol_version) + "; " + what + " needs " + std::to_string(version) +
                                " (a newer flatkv serve)");
  }

  using Placer = std::function<std::vector<iovec>(uint32_t layer, uint32_t first, uint32_t blocks)>;
  using LayerDone = std::function<Status(uint32_t layer, uint32_t valid)>;

  // Sends a stream restore and reads its layer frames; `place` says where
  // each frame's slices go, `done` (optional) runs when a layer is whole.
  Result<RestoreResult> StreamRestore(std::span<const BlockKey> chain, const Placer& place, const LayerDone& done)
      FLATKV_REQUIRES(mu_) {
    const uint64_t lb = info_.block_layer_bytes;
    wire::Restore m;
    m.deadline_ms = DeadlineMs();
    m.keys.assign(chain.begin(), chain.end());
    const auto deadline = Deadline();
    FLATKV_ASSIGN_OR_RETURN(auto begin, Call(wire::EncodeRestore(NextId(), m), wire::Type::kRestoreBegin, deadline));
    RestoreResult result;
    FLATKV_ASSIGN_OR_RETURN(result.hit_blocks, wire::DecodeU32(begin));
    if (result.hit_blocks > chain.size()) return Broken("restore: server claims more hits than keys");
    for (;;) {
      FLATKV_RETURN_IF_ERROR(broken_);
      std::byte head[wire::kHeaderBytes];
      FLATKV_RETURN_IF_ERROR(Transport(conn_->ReadFull(head, sizeof head, deadline)));
      auto h = wire::ParseHeader(head, MaxReply());
      if (!h.ok()) return Broken(h.status().message());
      std::vector<std::byte> payload;
      if (h->type != wire::Type::kRestoreLayer) {
        payload.resize(h->payload_bytes);
        FLATKV_RETURN_IF_ERROR(Transport(conn_->ReadFull(payload.data(), payload.size(), deadline)));
        if (h->type == wire::Type::kError) return wire::ErrorStatus(payload);
        if (h->type != wire::Type::kRestoreEnd) return Broken("restore: unexpected " + std::string(wire::TypeName(h->type)) + " frame");
        FLATKV_ASSIGN_OR_RETURN(result.valid_blocks, wire::DecodeU32(payload));
        return result;
      }
      std::byte meta[16];
      if (h->payload_bytes < sizeof meta) return Broken("restore: short layer frame");
      FLATKV_RETURN_IF_ERROR(Transport(conn_->ReadFull(meta, sizeof meta, deadline)));
      FLATKV_ASSIGN_OR_RETURN(wire::RestoreLayer layer, wire::DecodeRestoreLayer(meta));
      const uint64_t data_bytes = h->payload_bytes - sizeof meta;
      if (layer.layer >= info_.shape.layers || layer.valid > result.hit_blocks ||
          uint64_t{layer.first_block} + layer.blocks > layer.valid || data_bytes != uint64_t{layer.blocks} * lb) {
        return Broken("restore: layer frame out of range (layer " + std::to_string(layer.layer) + ", blocks " +
                      std::to_string(layer.first_block) + "+" + std::to_string(layer.blocks) + ")");
      }
      std::vector<iovec> iov = place(layer.layer, layer.first_block, layer.blocks);
      FLATKV_RETURN_IF_ERROR(Transport(conn_->ReadV(iov, deadline)));
      if (done && layer.first_block + layer.blocks == layer.valid) {
        Status st = done(layer.layer, layer.valid);
        if (!st.ok()) {
          (void)Broken("restore abandoned by the caller: " + st.ToString());
          return st;
        }
      }
    }
  }

  uint64_t MaxReply() const { return std::max<uint64_t>(info_.max_frame_bytes, 1 << 20) + 64; }
  uint32_t NextId() { return ++next_id_; }
  uint32_t DeadlineMs() const { return static_cast<uint32_t>(std::min<int64_t>(options_.deadline.count(), UINT32_MAX)); }
  // The client waits a little longer than the daemon, so the daemon's
  // deadline error, not a client timeout, reports a slow request.
  Clock::time_point Deadline() const { return Clock::now() + options_.deadline + std::chrono::seconds(1); }

  Status Broken(const std::string& why) {
    if (broken_.ok()) broken_ = Status::IoError("connection unusable: " + why);
    conn_->Shutdown();
    return broken_;
  }
  Status Transport(Status st) {
    if (st.ok()) return st;
    if (st.code() == Code::kAborted && st.message() == "closed") return Broken("the daemon closed the connection");
    return Broken(st.message());
  }

  Result<wire::Header> ReadAny(std::vector<std::byte>* payload, Clock::time_point deadline) {
    FLATKV_RETURN_IF_ERROR(broken_);
    auto h = ReadFrame(*conn_, payload, MaxReply(), deadline);
    if (!h.ok()) return Transport(h.status());
    return h;
  }
  Result<std::vector<std::byte>> ReadReply(wire::Type want, Clock::time_point deadline) {
    std::vector<std::byte> payload;
    FLATKV_ASSIGN_OR_RETURN(wire::Header h, ReadAny(&payload, deadline));
    if (h.type == wire::Type::kError) return wire::ErrorStatus(payload);
    if (h.type != want) {
      return Broken("expected " + std::string(wire::TypeName(want)) + ", got " + std::string(wire::TypeName(h.type)));
    }
    return payload;
  }
  Result<std::vector<std::byte>> Call(const std::vector<std::byte>& frame, wire::Type want, Clock::time_point deadline) {
    FLATKV_RETURN_IF_ERROR(broken_);
    FLATKV_RETURN_IF_ERROR(Transport(conn_->Write(frame, deadline)));
    return ReadReply(want, deadline);
  }

  Mutex mu_;
  std::unique_ptr<net::Conn> conn_;
  ClientOptions options_;
  std::shared_ptr<SSL_CTX> tls_;
  ServerInfo info_;
  uint32_t next_id_ = 0;
  Status broken_;
  std::vector<ShmWindow> windows_;
};

}  // namespace

Result<std::unique_ptr<Client>> Client::Connect(const std::string& address, const ClientOptions& options) {
  FLATKV_ASSIGN_OR_RETURN(net::Endpoint ep, net::ParseEndpoint(address));
  std::shared_ptr<SSL_CTX> tls;
  if (options.tls) {
    if (ep.kind != net::Endpoint::kTcp) return Status::InvalidArgument("address '" + address + "': TLS needs a tcp: address");
    net::IgnoreSigpipe();
    FLATKV_ASSIGN_OR_RETURN(tls, net::MakeClientTlsContext(options.tls_ca_file, options.tls_verify));
  }
  FLATKV_ASSIGN_OR_RETURN(int fd, net::ConnectSocket(ep, options.connect_timeout));
  auto conn = std::make_unique<net::Conn>(fd, ep.kind == net::Endpoint::kUnix);
  if (tls) {
    const std::string name = options.tls_server_name.empty() ? ep.host : options.tls_server_name;
    FLATKV_RETURN_IF_ERROR(conn->TlsConnect(tls.get(), name, Clock::now() + options.connect_timeout));
  }
  auto client = std::make_unique<ClientImpl>(std::move(conn), options, tls);
  FLATKV_RETURN_IF_ERROR(client->Hello().WithContext("connecting to " + address));
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace flatkv::service
