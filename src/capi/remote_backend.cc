// The daemon backend: flatkv::service::Client connections to `flatkv serve`.
//
// A Client serves one request at a time, so the backend keeps a pool of
// connections: a call takes an idle one (or connects a new one) and gives
// it back when done; a connection that saw a transport error, or that the
// daemon closed while it was idle (a restart), is dropped.
// With a shared-memory window configured, each connection registers its own
// window and restores that fit in it go through it.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "capi/capi_internal.h"
#include "service/client.h"

namespace flatkv::capi {
namespace {

using service::Client;
using service::ShmWindow;

struct Connection {
  std::unique_ptr<Client> client;
  ShmWindow window;  // bytes == 0: none
};

// A transport error leaves a Client broken; other errors are answers.
bool Broken(const Status& s) { return s.code() == Code::kIoError || s.code() == Code::kAborted; }

class Pool {
 public:
  Pool(std::string address, service::ClientOptions options, uint64_t shm_bytes)
      : address_(std::move(address)), options_(std::move(options)), shm_bytes_(shm_bytes) {}

  Result<std::unique_ptr<Connection>> Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return Status::FailedPrecondition("the connection to " + address_ + " is closed");
      while (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        if (!c->client->PeerClosed()) return c;  // else the daemon went away: drop it, try the next
      }
    }
    auto c = std::make_unique<Connection>();
    FLATKV_ASSIGN_OR_RETURN(c->client, Client::Connect(address_, options_));
    if (shm_bytes_ > 0) {
      FLATKV_ASSIGN_OR_RETURN(c->window, c->client->RegisterShmWindow(shm_bytes_));
    }
    return c;
  }

  void Release(std::unique_ptr<Connection> c, const Status& last) {
    if (c == nullptr || Broken(last)) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) idle_.push_back(std::move(c));
  }

  void Close() {
    std::vector<std::unique_ptr<Connection>> idle;
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    idle.swap(idle_);
  }

 private:
  const std::string address_;
  const service::ClientOptions options_;
  const uint64_t shm_bytes_;
  std::mutex mu_;
  bool closed_ = false;
  std::vector<std::unique_ptr<Connection>> idle_;
};

// Copies one arriving layer (`blocks` slices of this layer) to a caller
// destination. `data` is block-major over the socket and in the window alike
// (one layer's blocks back to back).
void Place(std::byte* dst, flatkv_layout layout, const Geometry& g, uint64_t n, uint32_t layer, uint32_t blocks,
           std::span<const std::byte> data) {
  const uint64_t lb = g.block_layer_bytes;
  if (layout == FLATKV_LAYOUT_LAYER_MAJOR) {
    std::memcpy(Destination(dst, layout, g, n, layer, 0), data.data(), uint64_t{blocks} * lb);
    return;
  }
  for (uint32_t b = 0; b < blocks; ++b) std::memcpy(Destination(dst, layout, g, n, layer, b), data.data() + b * lb, lb);
}

// A restore streamed by a worker thread; the consumer waits per layer.
// Every layer is kept (in the caller's destination, the connection's
// shared-memory window, or a buffer of the whole prefix) until the restore
// is destroyed, so the consumer never holds the stream back.
class RemoteRestore : public BackendRestore {
 public:
  RemoteRestore(Pool* pool, const Geometry& g, std::vector<BlockKey> keys, std::byte* dst, flatkv_layout layout)
      : pool_(pool), g_(g), keys_(std::move(keys)), dst_(dst), layout_(layout), blocks_(g.layers, 0) {}

  Status Start() {
    FLATKV_ASSIGN_OR_RETURN(conn_, pool_->Acquire());
    const uint64_t n = keys_.size();
    use_shm_ = conn_->window.bytes >= n * g_.block_bytes && conn_->window.base != nullptr;
    if (dst_ == nullptr && !use_shm_) buffer_.resize(n * g_.block_bytes);
    worker_ = std::thread([this] { Run(); });
    return Status::Ok();
  }

  ~RemoteRestore() override {
    if (worker_.joinable()) worker_.join();
    pool_->Release(std::move(conn_), status_);
  }

  uint32_t hit_blocks() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_ > 0 || done_; });
    return ready_ > 0 ? blocks_[0] : result_.hit_blocks;
  }

  Result<LayerView> WaitLayer(uint32_t layer) override {
    if (layer >= g_.layers)
      return Status::InvalidArgument("restore: layer " + std::to_string(layer) + " of a " +
                                     std::to_string(g_.layers) + "-layer model");
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_ > layer || done_; });
    if (ready_ <= layer) {
      if (!status_.ok()) return status_;
      return LayerView{layer, 0, {}};  // nothing hit: the daemon sent no layers
    }
    const uint32_t blocks = blocks_[layer];
    if (dst_ != nullptr) return LayerView{layer, blocks, {}};
    return LayerView{layer, blocks, std::span<const std::byte>(LayerBase(layer), uint64_t{blocks} * g_.block_layer_bytes)};
  }

  void ReleaseLayer(uint32_t) override {}

  Result<uint32_t> Finish() override {
    if (worker_.joinable()) worker_.join();
    if (!status_.ok()) return status_;
    return result_.valid_blocks;
  }

 private:
  // Layer-major storage of layer `layer` when there is no caller destination.
  std::byte* LayerBase(uint32_t layer) {
    const uint64_t off = uint64_t{layer} * keys_.size() * g_.block_layer_bytes;
    return use_shm_ ? conn_->window.base + off : buffer_.data() + off;
  }

  void Run() {
    auto on_layer = [this](uint32_t layer, uint32_t blocks, std::span<const std::byte> data) -> Status {
      if (layer >= g_.layers) return Status::Corruption("daemon sent layer " + std::to_string(layer));
      if (data.size() < uint64_t{blocks} * g_.block_layer_bytes || blocks > keys_.size())
        return Status::Corruption("daemon sent " + std::to_string(data.size()) + " bytes for " +
                                  std::to_string(blocks) + " blocks of layer " + std::to_string(layer));
      if (dst_ != nullptr)
        Place(dst_, layout_, g_, keys_.size(), layer, blocks, data);
      else if (!use_shm_)
        std::memcpy(LayerBase(layer), data.data(), uint64_t{blocks} * g_.block_layer_bytes);
      std::lock_guard<std::mutex> lock(mu_);
      blocks_[layer] = blocks;
      ready_ = layer + 1;
      cv_.notify_all();
      return Status::Ok();
    };
    Result<service::RestoreResult> r =
        use_shm_ ? conn_->client->RestoreToShm(conn_->window, 0, keys_, on_layer)
                 : conn_->client->RestoreLayers(keys_, on_layer);
    std::lock_guard<std::mutex> lock(mu_);
    if (r.ok())
      result_ = r.value();
    else
      status_ = r.status();
    done_ = true;
    cv_.notify_all();
  }

  Pool* const pool_;
  const Geometry g_;
  const std::vector<BlockKey> keys_;
  std::byte* const dst_;
  const flatkv_layout layout_;
  std::unique_ptr<Connection> conn_;
  bool use_shm_ = false;
  std::vector<std::byte> buffer_;
  std::thread worker_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint32_t> blocks_;  // valid blocks per arrived layer
  uint32_t ready_ = 0;            // layers [0, ready_) have arrived
  bool done_ = false;
  Status status_;
  service::RestoreResult result_;
};

class RemoteBackend : public Backend {
 public:
  RemoteBackend(std::unique_ptr<Pool> pool, const service::ServerInfo& info) : pool_(std::move(pool)) {
    g_.layers = info.shape.layers;
    g_.shape = info.shape;
    g_.block_tokens = info.block_tokens;
    g_.block_layer_bytes = info.block_layer_bytes;
    g_.block_bytes = info.block_bytes;
  }

  const Geometry& geometry() const override { return g_; }

  // Runs `f(client)` on a pooled connection.
  template <typename T, typename F>
  Result<T> With(F&& f) {
    FLATKV_ASSIGN_OR_RETURN(auto c, pool_->Acquire());
    Result<T> r = f(*c);
    pool_->Release(std::move(c), r.status());
    return r;
  }

  Result<uint32_t> Match(std::span<const BlockKey> keys) override {
    return With<uint32_t>([&](Connection& c) { return c.client->Lookup(keys); });
  }

  Status Put(uint64_t session, std::span<const BlockKey> keys, std::span<const std::byte> data,
             PutHint hint) override {
    return With<bool>([&](Connection& c) -> Result<bool> {
             FLATKV_RETURN_IF_ERROR(c.client->Put(session, keys, data, hint));
             return true;
           })
        .status();
  }

  Result<std::unique_ptr<BackendRestore>> StartRestore(std::span<const BlockKey> keys, std::byte* dst,
                                                       flatkv_layout layout) override {
    auto r = std::make_unique<RemoteRestore>(pool_.get(), g_, std::vector<BlockKey>(keys.begin(), keys.end()), dst,
                                             layout);
    FLATKV_RETURN_IF_ERROR(r->Start());
    return std::unique_ptr<BackendRestore>(std::move(r));
  }

  // Synchronous: Put's layout over the socket lands in `dst` directly; the
  // window and the layer-major layout are placed per layer as they arrive.
  Result<uint32_t> Restore(std::span<const BlockKey> keys, std::byte* dst, flatkv_layout layout) override {
    const uint64_t n = keys.size();
    return With<uint32_t>([&](Connection& c) -> Result<uint32_t> {
      auto place = [&](uint32_t layer, uint32_t blocks, std::span<const std::byte> data) -> Status {
        if (layer >= g_.layers || data.size() < uint64_t{blocks} * g_.block_layer_bytes || blocks > n)
          return Status::Corruption("daemon sent " + std::to_string(data.size()) + " bytes for " +
                                    std::to_string(blocks) + " blocks of layer " + std::to_string(layer));
        Place(dst, layout, g_, n, layer, blocks, data);
        return Status::Ok();
      };
      Result<service::RestoreResult> r = Status::Aborted("unreached");
      if (c.window.base != nullptr && c.window.bytes >= n * g_.block_bytes)
        r = c.client->RestoreToShm(c.window, 0, keys, place);
      else if (layout == FLATKV_LAYOUT_BLOCK_MAJOR)
        r = c.client->Restore(keys, std::span<std::byte>(dst, n * g_.block_bytes));
      else
        r = c.client->RestoreLayers(keys, place);
      if (!r.ok()) return r.status();
      return r->valid_blocks;
    });
  }

  Result<uint32_t> Prefetch(std::span<const BlockKey> keys) override {
    return With<uint32_t>([&](Connection& c) { return c.client->Prefetch(keys); });
  }
  Result<uint32_t> TruncateSession(uint64_t session, uint32_t keep_blocks) override {
    return With<uint32_t>([&](Connection& c) { return c.client->TruncateSession(session, keep_blocks); });
  }
  Result<uint32_t> Retain(std::span<const BlockKey> keys, std::chrono::milliseconds ttl) override {
    return With<uint32_t>([&](Connection& c) { return c.client->Retain(keys, ttl); });
  }
  Result<PruneResult> Prune(std::span<const BlockKey> keys, std::span<const TokenRange> ranges, PutHint hint) override {
    return With<PruneResult>([&](Connection& c) { return c.client->Prune(keys, ranges, hint); });
  }
  Status DropSession(uint64_t session) override {
    return With<bool>([&](Connection& c) -> Result<bool> {
             FLATKV_RETURN_IF_ERROR(c.client->DropSession(session));
             return true;
           })
        .status();
  }

  Result<StoreStats> Stats() override {
    FLATKV_ASSIGN_OR_RETURN(auto json, StatsJson());
    return StatsFromJson(json);
  }

  Result<std::string> StatsJson() override {
    return With<std::string>([&](Connection& c) { return c.client->StatsJson(); });
  }

  Result<std::string> OptionsJson() override {
    FLATKV_ASSIGN_OR_RETURN(auto json, StatsJson());
    return OptionsFromStatsJson(json);
  }

  Status Close() override {
    pool_->Close();
    return Status::Ok();
  }

 private:
  std::unique_ptr<Pool> pool_;
  Geometry g_;
};

}  // namespace

Result<std::unique_ptr<Backend>> ConnectRemote(const flatkv_options& options) {
  service::ClientOptions co;
  co.token = options.token;
  co.client_name = "flatkv-capi";
  co.deadline = std::chrono::milliseconds(options.server_deadline_ms);
  co.connect_timeout = std::chrono::milliseconds(options.server_connect_timeout_ms);
  auto pool = std::make_unique<Pool>(options.server, co, options.shm_window_bytes);
  // The first connection checks the address and token and tells the geometry.
  FLATKV_ASSIGN_OR_RETURN(auto first, pool->Acquire());
  const service::ServerInfo info = first->client->info();
  pool->Release(std::move(first), Status::Ok());
  return std::unique_ptr<Backend>(std::make_unique<RemoteBackend>(std::move(pool), info));
}

}  // namespace flatkv::capi
