// `flatkv bench serve` workloads, all against one daemon started in this
// process (a Server on loopback addresses) holding one chain in DRAM:
//
//   inproc_restore   the store itself: StartRestore into caller memory
//                    (layer-major, pre-faulted) — the baseline
//   shm_restore      a client over the Unix socket restoring into its
//                    registered memfd window (the daemon fills it directly)
//   unix_restore     a client over the Unix socket, bytes streamed
//   tcp_restore      a client over loopback TCP, bytes streamed
//   chain lookup     --clients connections in parallel (one thread each),
//                    closed loop, a --lookup-keys chain per lookup, over TCP
//                    and over the Unix socket; latency percentiles
//   paced lookup     the same clients over TCP, each once per
//                    --lookup-interval-us (an engine looks up when a request
//                    arrives, not in a tight loop)
//   1-key lookup     the same clients, one key per lookup over TCP,
//   vs redis GET     interleaved with the same harness GETting a 32-byte
//                    value from a redis-server started here (when one is
//                    installed); redis-benchmark on that server checks the
//                    harness is not the bottleneck
//
// Restore bandwidth is chain bytes / median time of --reps restores.
#include "bench/bench_serve.h"

#include <algorithm>
#include <cstring>
#include <atomic>
#include <cstdio>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>

#include "flatkv/keys.h"
#include "service/client.h"
#include "service/server.h"
#include "bench/bench_peers.h"
#include "bench/bench_redis.h"
#include "bench/bench_util.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

int Report(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv bench serve: %s\n", msg.c_str());
  return code;
}

struct PathResult {
  double gbps = 0, p50_us = 0, p99_us = 0;
};

PathResult FromSamples(const std::vector<double>& seconds, uint64_t bytes) {
  PathResult r;
  const SampleSummary s = Summarize(seconds);
  r.gbps = s.median > 0 ? double(bytes) / s.median / 1e9 : 0;
  r.p50_us = Percentile(seconds, 0.5) * 1e6;
  r.p99_us = Percentile(seconds, 0.99) * 1e6;
  return r;
}

struct LookupResult {
  double p50_us = 0, p99_us = 0, p999_us = 0, per_second = 0;
  uint64_t count = 0, errors = 0;
};

// The daemon's one tenant (TCP is served only with tenants configured).
constexpr const char* kBenchToken = "bench-serve-token-0123456789";

service::ClientOptions BenchClientOptions() {
  service::ClientOptions o;
  o.token = kBenchToken;
  return o;
}

// The closed-loop harness: `clients` threads, each calling its own `op`
// (one connection's request) for `seconds`: back to back (closed loop) when
// interval_us is 0, else each at most once per interval_us (random phase),
// as engines do when requests arrive. The daemon's lookups and the Redis
// GET baseline both run through it.
LookupResult RunClosedLoop(std::vector<std::function<bool()>> ops, double seconds, double interval_us) {
  LookupResult out;
  std::vector<std::vector<double>> lat(ops.size());
  std::atomic<uint64_t> errors{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ops.size(); ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      const double start = NowSeconds(), end = start + seconds;
      double next = start + interval_us * 1e-6 * double(i % 97) / 97.0;
      lat[i].reserve(1 << 16);
      while (NowSeconds() < end) {
        if (interval_us > 0) {
          const double wait = next - NowSeconds();
          if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
          next += interval_us * 1e-6;
        }
        const double t0 = NowSeconds();
        const bool ok = ops[i]();
        lat[i].push_back((NowSeconds() - t0) * 1e6);
        if (!ok) errors++;
      }
    });
  }
  const double t_start = NowSeconds();
  go.store(true);
  for (auto& t : threads) t.join();
  const double elapsed = NowSeconds() - t_start;
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  out.count = all.size();
  out.errors += errors.load();
  out.p50_us = Percentile(all, 0.5);
  out.p99_us = Percentile(all, 0.99);
  out.p999_us = Percentile(all, 0.999);
  out.per_second = elapsed > 0 ? double(all.size()) / elapsed : 0;
  return out;
}

// `clients` connections to the daemon at `address` look up `keys`.
LookupResult RunLookups(const std::string& address, uint32_t clients, double seconds, const std::vector<BlockKey>& keys,
                        double interval_us) {
  std::vector<std::unique_ptr<service::Client>> conns;
  uint64_t connect_errors = 0;
  for (uint32_t i = 0; i < clients; ++i) {
    auto c = service::Client::Connect(address, BenchClientOptions());
    if (!c.ok()) {
      ++connect_errors;
      continue;
    }
    conns.push_back(std::move(c).value());
  }
  std::vector<std::function<bool()>> ops;
  for (auto& c : conns)
    ops.push_back([&keys, client = c.get()] {
      auto hit = client->Lookup(keys);
      return hit.ok() && *hit == keys.size();
    });
  LookupResult out = RunClosedLoop(std::move(ops), seconds, interval_us);
  out.errors += connect_errors;
  return out;
}

// The same harness against redis-server: each client GETs one small value.
LookupResult RunRedisGets(uint16_t port, uint32_t clients, double seconds, const std::string& key,
                          const std::string& value) {
  std::vector<std::unique_ptr<RedisClient>> conns;
  uint64_t connect_errors = 0;
  for (uint32_t i = 0; i < clients; ++i) {
    auto c = RedisClient::Connect(port);
    if (!c.ok()) {
      ++connect_errors;
      continue;
    }
    conns.push_back(std::move(c).value());
  }
  std::vector<std::function<bool()>> ops;
  for (auto& c : conns)
    ops.push_back([&key, &value, client = c.get()] {
      auto got = client->Get(key);
      return got.ok() && *got == value;
    });
  LookupResult out = RunClosedLoop(std::move(ops), seconds, 0);
  out.errors += connect_errors;
  return out;
}

// Medians over rounds of each percentile and rate.
LookupResult MedianOf(const std::vector<LookupResult>& rounds) {
  auto med = [&](double LookupResult::*field) {
    std::vector<double> v;
    for (const auto& r : rounds) v.push_back(r.*field);
    return Summarize(v).median;
  };
  LookupResult m;
  m.p50_us = med(&LookupResult::p50_us);
  m.p99_us = med(&LookupResult::p99_us);
  m.p999_us = med(&LookupResult::p999_us);
  m.per_second = med(&LookupResult::per_second);
  for (const auto& r : rounds) {
    m.count += r.count;
    m.errors += r.errors;
  }
  return m;
}

int RunChecked(const BenchServeArgs& a) {
  const uint32_t blocks = a.blocks ? a.blocks : (a.quick ? 8 : 16);
  const uint32_t reps = a.reps ? a.reps : (a.quick ? 4 : 10);
  const double lookup_s = a.lookup_seconds > 0 ? a.lookup_seconds : (a.quick ? 0.5 : 2.0);
  const uint32_t redis_rounds_n = a.redis_rounds ? a.redis_rounds : (a.quick ? 1 : 3);
  if (a.clients == 0 || a.clients > 1024) return Report(kExitUsage, "--clients " + std::to_string(a.clients) + " is outside 1..1024");
  auto shape = FindShapePreset(a.shape);
  if (!shape.ok()) return Report(kExitUsage, "--shape: " + shape.status().ToString());
  auto scratch = ScratchDir::Create(a.dir.empty() ? "/var/tmp" : a.dir);
  if (!scratch.ok()) return Report(kExitFailure, scratch.status().ToString());

  service::ServerConfig c;
  c.store.shape = *shape;
  c.store.ssd_dirs = {scratch->path() + "/ssd"};
  const uint64_t block_bytes = shape->BytesPerToken() * c.store.block_tokens;
  const uint64_t chain_bytes = block_bytes * blocks;
  // A DRAM copy mirrors a whole SSD extent (ceil(ssd_extent_layer_bytes /
  // layer slice) blocks), and each chain's session has its own: DRAM for
  // both chains' copies, in whole extents, plus one to spare.
  const uint64_t layer_bytes = block_bytes / shape->layers;
  const uint64_t extent_bytes = (c.store.ssd_extent_layer_bytes + layer_bytes - 1) / layer_bytes * block_bytes;
  c.dram_bytes = (2 * ((chain_bytes + extent_bytes - 1) / extent_bytes) + 1) * extent_bytes;
  c.store.session_dram_share_bytes = *c.dram_bytes;  // a DRAM copy of both chains
  c.ssd_bytes = 1ull << 30;
  c.unix_path = scratch->path() + "/flatkv.sock";
  c.tcp_address = "127.0.0.1:0";
  c.http_address.clear();
  c.max_connections = a.clients * 2 + 16;
  c.max_unauthenticated_per_peer = c.max_connections;  // every client thread connects at once
  c.tenants = {{"bench", kBenchToken, "", 0}};         // TCP needs a tenant
  if (Status st = service::FinalizeConfig(&c); !st.ok()) return Report(kExitFailure, st.ToString());
  auto started = service::Server::Start(c);
  if (!started.ok()) return Report(kExitFailure, "starting the daemon: " + started.status().ToString());
  service::Server& server = **started;
  Store& store = server.store();

  KeyHasher hasher;
  std::vector<uint32_t> tokens(uint64_t{blocks} * c.store.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 % 32000);
  const auto keys = hasher.ChainKeys(hasher.NamespaceDigest({"bench-serve", "", ""}), tokens, c.store.block_tokens);
  std::vector<std::byte> payload(chain_bytes);
  FillRandom(payload, 7);

  auto unix_client = service::Client::Connect(server.unix_address(), BenchClientOptions());
  auto tcp_client = service::Client::Connect(server.tcp_address(), BenchClientOptions());
  if (!unix_client.ok() || !tcp_client.ok()) return Report(kExitFailure, "connecting: " + (unix_client.ok() ? tcp_client : unix_client).status().ToString());
  if (Status st = (*unix_client)->Put(1, keys, payload, PutHint::kHot); !st.ok()) return Report(kExitFailure, "put: " + st.ToString());
  if (Status st = store.Put(2, keys, payload); !st.ok()) return Report(kExitFailure, "in-process put: " + st.ToString());
  // Every block has its SSD home; the figures are for restores from DRAM
  // copies, so both chains (the daemon's tenant-salted one and the
  // in-process one) must have one.
  if (const StoreStats st = store.Stats(); st.dram.blocks != 2ull * blocks)
    return Report(kExitFailure, "the chains did not fit in DRAM: " + std::to_string(st.dram.blocks) + " of " +
                                    std::to_string(2ull * blocks) + " blocks have a DRAM copy");

  auto buffer = PrefaultedBuffer::Allocate(chain_bytes);
  if (!buffer.ok()) return Report(kExitFailure, buffer.status().ToString());
  const uint32_t layers = shape->layers;
  const uint64_t lb = store.BlockLayerBytes();
  std::vector<double> inproc, shm, unix_stream, tcp;
  for (uint32_t r = 0; r < reps; ++r) {
    RestoreTarget target;
    std::byte* base = buffer->data();
    target.destination = [&](uint32_t l, uint32_t b) { return base + (uint64_t{l} * blocks + b) * lb; };
    const double t0 = NowSeconds();
    auto restore = store.StartRestore(keys, target);
    if (!restore.ok()) return Report(kExitFailure, "in-process restore: " + restore.status().ToString());
    for (uint32_t l = 0; l < layers; ++l) {
      auto v = (*restore)->WaitLayer(l);
      if (!v.ok()) return Report(kExitFailure, "in-process restore: " + v.status().ToString());
      (*restore)->ReleaseLayer(l);
    }
    if ((*restore)->Finish() != blocks) return Report(kExitFailure, "in-process restore lost blocks");
    inproc.push_back(NowSeconds() - t0);
  }
  auto window = (*unix_client)->RegisterShmWindow(chain_bytes);
  if (!window.ok()) return Report(kExitFailure, "registering the window: " + window.status().ToString());
  for (uint32_t r = 0; r < reps; ++r) {
    const double t0 = NowSeconds();
    auto res = (*unix_client)->RestoreToShm(*window, 0, keys);
    if (!res.ok() || res->valid_blocks != blocks) return Report(kExitFailure, "shm restore: " + res.status().ToString());
    shm.push_back(NowSeconds() - t0);
  }
  for (auto* path : {&unix_stream, &tcp}) {
    service::Client& client = path == &tcp ? **tcp_client : **unix_client;
    for (uint32_t r = 0; r < reps; ++r) {
      const double t0 = NowSeconds();
      auto res = client.Restore(keys, buffer->first(chain_bytes));
      if (!res.ok() || res->valid_blocks != blocks) return Report(kExitFailure, "stream restore: " + res.status().ToString());
      path->push_back(NowSeconds() - t0);
    }
  }
  // The stream restore wrote Put's layout: check it is the payload.
  if (std::memcmp(buffer->data(), payload.data(), chain_bytes) != 0) return Report(kExitFailure, "tcp restore returned wrong bytes");

  const std::vector<BlockKey> lookup_keys(keys.begin(), keys.begin() + std::min<size_t>(keys.size(), a.lookup_keys));
  const LookupResult tcp_lookup = RunLookups(server.tcp_address(), a.clients, lookup_s, lookup_keys, 0);
  const LookupResult unix_lookup = RunLookups(server.unix_address(), a.clients, lookup_s, lookup_keys, 0);
  const LookupResult tcp_paced = RunLookups(server.tcp_address(), a.clients, lookup_s, lookup_keys, a.lookup_interval_us);
  if (tcp_lookup.errors || unix_lookup.errors || tcp_paced.errors) return Report(kExitFailure, "lookups failed");

  // The Redis GET baseline: a one-key lookup over TCP against a GET of a
  // 32-byte value from a redis-server started here, through the same
  // harness with the same clients, the two interleaved over --redis-rounds
  // rounds; medians of the rounds' percentiles. redis-benchmark on the same
  // server checks that the harness is not the bottleneck.
  const std::vector<BlockKey> one_key(keys.begin(), keys.begin() + 1);
  std::vector<LookupResult> one_rounds, redis_rounds;
  nlohmann::json redis_j = nlohmann::json::object();
  std::unique_ptr<RedisServer> redis;
  if (!a.no_redis) {
    auto binary = RedisServer::FindBinary();
    if (binary.ok()) {
      auto started_redis = RedisServer::Start(*binary, scratch->path());
      if (!started_redis.ok()) return Report(kExitFailure, "the Redis baseline: " + started_redis.status().ToString());
      redis = std::move(started_redis).value();
    } else {
      redis_j["skipped"] = binary.status().message();
    }
  } else {
    redis_j["skipped"] = "--no-redis";
  }
  const std::string redis_key = "key:__rand_int__", redis_value(32, 'x');  // redis-benchmark's key and -d 32
  if (redis) {
    auto setter = RedisClient::Connect(redis->port());
    if (!setter.ok()) return Report(kExitFailure, "the Redis baseline: " + setter.status().ToString());
    if (Status st = (*setter)->Set(redis_key, redis_value); !st.ok())
      return Report(kExitFailure, "the Redis baseline: SET: " + st.ToString());
  }
  for (uint32_t r = 0; r < redis_rounds_n; ++r) {
    one_rounds.push_back(RunLookups(server.tcp_address(), a.clients, lookup_s, one_key, 0));
    if (redis) redis_rounds.push_back(RunRedisGets(redis->port(), a.clients, lookup_s, redis_key, redis_value));
  }
  const LookupResult one = MedianOf(one_rounds);
  if (one.errors) return Report(kExitFailure, "one-key lookups failed");
  LookupResult redis_get;
  if (redis) {
    redis_get = MedianOf(redis_rounds);
    if (redis_get.errors) return Report(kExitFailure, "Redis GETs failed");
    redis_j["version"] = redis->version();
    redis_j["rounds"] = redis_rounds_n;
    redis_j["get_p50_us"] = redis_get.p50_us;
    redis_j["get_p99_us"] = redis_get.p99_us;
    redis_j["get_p999_us"] = redis_get.p999_us;
    redis_j["gets_per_second"] = redis_get.per_second;
    const uint64_t requests = std::max<uint64_t>(10000, uint64_t(redis_get.per_second * lookup_s));
    auto check = RunRedisBenchmark(redis->port(), a.clients, uint32_t(redis_value.size()), requests);
    if (check.ok()) {
      redis_j["redis_benchmark"] = {{"requests", requests}, {"get_p50_us", check->p50_us},
                                    {"get_p99_us", check->p99_us}, {"gets_per_second", check->rps}};
      redis_j["harness_rate_vs_redis_benchmark"] = check->rps > 0 ? redis_get.per_second / check->rps : 0;
    } else {
      redis_j["redis_benchmark"] = {{"skipped", check.status().ToString()}};
    }
    redis.reset();
  }
  // Mooncake Store's per-object get of the same 32-byte value (bench_peers.h):
  // its own mooncake_master and mooncake_client on loopback, a DummyClient, one
  // client in a closed loop (its Python API), as many gets as Redis answered in a round.
  const nlohmann::json mooncake_j =
      a.no_peers ? nlohmann::json{{"skipped", "--no-peers"}}
                 : MeasureMooncakeGets(scratch->path() + "/mooncake", uint32_t(redis_value.size()),
                                       uint32_t(std::clamp(redis_get.per_second * lookup_s, 2000.0, 20000.0)));

  const PathResult ri = FromSamples(inproc, chain_bytes), rs = FromSamples(shm, chain_bytes),
                   ru = FromSamples(unix_stream, chain_bytes), rt = FromSamples(tcp, chain_bytes);
  nlohmann::json j;
  j["config"] = {{"shape", shape->ToString()}, {"blocks", blocks}, {"chain_bytes", chain_bytes}, {"reps", reps},
                 {"clients", a.clients}, {"lookup_keys", lookup_keys.size()}, {"lookup_seconds", lookup_s},
                 {"cpus", std::thread::hardware_concurrency()}};
  j["inproc_restore_gbps"] = ri.gbps;
  j["shm_restore_gbps"] = rs.gbps;
  j["unix_restore_gbps"] = ru.gbps;
  j["tcp_restore_gbps"] = rt.gbps;
  j["shm_vs_inproc"] = ri.gbps > 0 ? rs.gbps / ri.gbps : 0;
  j["tcp_vs_inproc"] = ri.gbps > 0 ? rt.gbps / ri.gbps : 0;
  j["restore_p50_us"] = {{"inproc", ri.p50_us}, {"shm", rs.p50_us}, {"unix", ru.p50_us}, {"tcp", rt.p50_us}};
  j["restore_p99_us"] = {{"inproc", ri.p99_us}, {"shm", rs.p99_us}, {"unix", ru.p99_us}, {"tcp", rt.p99_us}};
  // lookup_*: one key per lookup, the shape of the Redis GET beside it.
  j["lookup_p50_us"] = one.p50_us;
  j["lookup_p99_us"] = one.p99_us;
  j["lookup_p999_us"] = one.p999_us;
  j["lookups_per_second"] = one.per_second;
  j["redis_get_p50_us"] = redis_get.p50_us;
  j["redis_get_p99_us"] = redis_get.p99_us;
  j["redis"] = redis_j;
  j["mooncake"] = mooncake_j;
  j["mooncake_get_p50_us"] = mooncake_j.contains("get_p50_us") ? mooncake_j["get_p50_us"] : nlohmann::json();
  j["mooncake_get_p99_us"] = mooncake_j.contains("get_p99_us") ? mooncake_j["get_p99_us"] : nlohmann::json();
  // chain_lookup_*: --lookup-keys keys per lookup (an engine's prefix match).
  j["chain_lookup_p50_us"] = tcp_lookup.p50_us;
  j["chain_lookup_p99_us"] = tcp_lookup.p99_us;
  j["chain_lookup_p999_us"] = tcp_lookup.p999_us;
  j["chain_lookups_per_second"] = tcp_lookup.per_second;
  j["paced_lookup_interval_us"] = a.lookup_interval_us;
  j["paced_lookup_p50_us"] = tcp_paced.p50_us;
  j["paced_lookup_p99_us"] = tcp_paced.p99_us;
  j["paced_lookups_per_second"] = tcp_paced.per_second;
  j["unix_lookup_p50_us"] = unix_lookup.p50_us;
  j["unix_lookup_p99_us"] = unix_lookup.p99_us;
  j["unix_lookups_per_second"] = unix_lookup.per_second;
  const bool have_redis = redis_get.p99_us > 0;
  j["goals"] = {{"shm_vs_inproc_min", 0.8},
                {"shm_met", ri.gbps > 0 && rs.gbps / ri.gbps >= 0.8},
                {"lookup_p99_vs_redis_get_p99_max", 1.0},
                {"lookup_vs_redis_met", have_redis ? nlohmann::json(one.p99_us <= redis_get.p99_us) : nlohmann::json()}};
  if (Status st = server.Stop(); !st.ok()) return Report(kExitFailure, "stopping: " + st.ToString());
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("flatkv bench serve: %s, chain of %u blocks (%.1f MiB) in DRAM, %u reps; %u CPUs\n", shape->ToString().c_str(),
              blocks, chain_bytes / 1048576.0, reps, std::thread::hardware_concurrency());
  std::printf("%-16s %10s %10s %10s %10s\n", "restore", "GB/s", "vs inproc", "p50 us", "p99 us");
  auto row = [&](const char* name, const PathResult& r) {
    std::printf("%-16s %10.2f %10.2f %10.0f %10.0f\n", name, r.gbps, ri.gbps > 0 ? r.gbps / ri.gbps : 0, r.p50_us, r.p99_us);
  };
  row("inproc", ri);
  row("shm (unix)", rs);
  row("stream (unix)", ru);
  row("stream (tcp)", rt);
  std::printf("%-16s %10s %10s %10s %10s %12s\n", "lookup (tcp)", "clients", "p50 us", "p99 us", "p99.9 us", "per s");
  auto lrow = [&](const char* name, const LookupResult& r, const char* note) {
    std::printf("%-16s %10u %10.0f %10.0f %10.0f %12.0f  %s\n", name, a.clients, r.p50_us, r.p99_us, r.p999_us,
                r.per_second, note);
  };
  lrow("1 key", one, "(median of rounds)");
  if (have_redis) lrow("redis GET", redis_get, "(32-byte value, same harness, interleaved)");
  lrow("chain", tcp_lookup, ("(" + std::to_string(lookup_keys.size()) + " keys)").c_str());
  lrow("chain, unix", unix_lookup, "");
  lrow("chain, paced", tcp_paced, ("(each client once per " + std::to_string(int(a.lookup_interval_us)) + " us)").c_str());
  if (redis_j.contains("redis_benchmark") && redis_j["redis_benchmark"].contains("get_p99_us"))
    std::printf("redis-benchmark on the same server: p50 %.0f us, p99 %.0f us, %.0f GETs/s (harness reached %.2f of its rate)\n",
                redis_j["redis_benchmark"]["get_p50_us"].get<double>(), redis_j["redis_benchmark"]["get_p99_us"].get<double>(),
                redis_j["redis_benchmark"]["gets_per_second"].get<double>(),
                redis_j["harness_rate_vs_redis_benchmark"].get<double>());
  if (redis_j.contains("skipped")) std::printf("Redis baseline skipped: %s\n", redis_j["skipped"].get<std::string>().c_str());
  if (mooncake_j.contains("get_p50_us"))
    std::printf("Mooncake Store get of the same value: p50 %.0f us, p99 %.0f us (%d gets, 1 client, DummyClient, Python API)\n",
                mooncake_j["get_p50_us"].get<double>(), mooncake_j["get_p99_us"].get<double>(), mooncake_j.value("gets", 0));
  else
    std::printf("Mooncake Store gets: %s\n", mooncake_j.value("error", mooncake_j.value("skipped", std::string("?"))).c_str());
  std::printf("goals: shm >= 0.8 x inproc: %s (%.2f); 1-key lookup p99 <= Redis GET p99 with %u clients: %s (%.0f vs %.0f us)\n",
              j["goals"]["shm_met"].get<bool>() ? "met" : "NOT met", j["shm_vs_inproc"].get<double>(), a.clients,
              !have_redis ? "no Redis" : (one.p99_us <= redis_get.p99_us ? "met" : "NOT met"), one.p99_us, redis_get.p99_us);
  return kExitOk;
}

}  // namespace

CLI::App* AddBenchServeCommand(CLI::App& bench, BenchServeArgs& a) {
  CLI::App* cmd = bench.add_subcommand("serve", "The daemon's restore bandwidth (shm, unix, tcp) and lookup latency vs the in-process store");
  cmd->add_option("--clients", a.clients, "Concurrent lookup clients (default 64)");
  cmd->add_flag("--json", a.json, "Print JSON instead of the table");
  cmd->add_flag("--quick", a.quick, "Smaller chain, fewer reps, shorter lookup phase");
  cmd->add_option("--blocks", a.blocks, "Chain length in blocks (default 16, quick 8)");
  cmd->add_option("--reps", a.reps, "Restores per path (default 10, quick 4)");
  cmd->add_option("--lookup-seconds", a.lookup_seconds, "Lookup phase per transport (default 2, quick 0.5)");
  cmd->add_option("--lookup-keys", a.lookup_keys, "Keys per lookup (default 16)");
  cmd->add_option("--lookup-interval-us", a.lookup_interval_us, "Paced phase: each client looks up once per this many us (default 5000)");
  cmd->add_option("--redis-rounds", a.redis_rounds, "Interleaved rounds of 1-key lookups and Redis GETs (default 3, quick 1)");
  cmd->add_flag("--no-redis", a.no_redis, "Skip the Redis GET baseline");
  cmd->add_flag("--no-peers", a.no_peers, "Skip Mooncake Store's gets (mooncake_get_p50_us, mooncake_get_p99_us)");
  cmd->add_option("--shape", a.shape, "KV shape preset (default llama-3.1-8b)");
  cmd->add_option("--dir", a.dir, "Parent of the scratch directory (default /var/tmp)");
  return cmd;
}

int RunBenchServe(const BenchServeArgs& args) { return RunCatching("bench serve", [&] { return RunChecked(args); }); }

}  // namespace flatkv::tools
