// `flatkv bench remote`, against a local Redis Cluster it starts itself
// (scripts/redis-cluster.sh: 3 masters, 3 replicas on loopback) or the one
// --cluster names. One prefix of --blocks blocks is published, then, in
// interleaved repetitions:
//
//   remote_restore   the remote tier: Match (one pipelined round of index
//                    reads), then objects layer by layer, --inflight at
//                    once, verified and copied to the caller's layout
//   raw_get          the same objects as plain pipelined GETs by the same
//                    client, nothing verified or copied: the ceiling
//   per_chunk        LMCache's RedisConnector layout: one value per
//                    --chunk-tokens chunk holding every layer, beside a
//                    metadata key; lookup by EXISTS of each chunk's metadata
//                    in turn, then each chunk's metadata and bytes, all
//                    chunks at once (asyncio.gather), restored layer by
//                    layer once they are in: layer 0 needs every chunk
//
// First-layer times include the lookup. Then (own cluster only) a master is
// killed with kill -9 while restores run: restores that return the whole
// prefix, and blocks returned with wrong bytes (must be 0).
#include "bench/bench_remote.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "flatkv/keys.h"
#include "flatkv/shape.h"
#include "flatkv/store.h"
#include "remote/remote_tier.h"
#include "bench/bench_util.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

int Report(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv bench remote: %s\n", msg.c_str());
  return code;
}

std::string Script() { return std::string(FLATKV_SOURCE_DIR) + "/scripts/redis-cluster.sh"; }

// A local cluster, stopped when this goes out of scope.
struct LocalCluster {
  std::string dir;
  ~LocalCluster() {
    if (!dir.empty()) (void)!std::system(("bash '" + Script() + "' stop '" + dir + "' >/dev/null 2>&1").c_str());
  }
};

std::vector<std::string> SplitSeeds(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    const std::string part = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

struct Timing {
  std::vector<double> first, total;
};

double Ms(const std::vector<double>& v) { return Summarize(v).median * 1e3; }

int RunChecked(const BenchRemoteArgs& a) {
  const uint32_t blocks = a.blocks ? a.blocks : (a.quick ? 4 : 16);
  const uint32_t reps = a.reps ? a.reps : (a.quick ? 2 : 5);
  constexpr uint32_t kBlockTokens = 64;
  if (a.chunk_tokens == 0 || a.chunk_tokens % kBlockTokens != 0)
    return Report(kExitUsage, "--chunk-tokens " + std::to_string(a.chunk_tokens) + " must be a positive multiple of 64");
  if (a.inflight == 0) return Report(kExitUsage, "--inflight must be positive");
  auto shape = FindShapePreset(a.shape);
  if (!shape.ok()) return Report(kExitUsage, "--shape: " + shape.status().ToString());
  const uint32_t layers = shape->layers;
  const uint64_t slice = shape->BytesPerTokenLayer() * kBlockTokens;
  const uint64_t prefix_bytes = slice * layers * blocks;

  LocalCluster local;
  std::vector<std::string> seeds = SplitSeeds(a.cluster);
  const bool own = seeds.empty();
  if (own) {
    auto parent = a.dir.empty() ? std::string("/var/tmp") : a.dir;
    local.dir = parent + "/flatkv-bench-remote-" + std::to_string(::getpid());
    const std::string cmd = "bash '" + Script() + "' start '" + local.dir + "' > /dev/null";
    if (std::system(cmd.c_str()) != 0) {
      local.dir.clear();
      return Report(kExitFailure, "could not start a local Redis Cluster with " + Script() +
                                      " (is redis-server installed? or pass --cluster HOST:PORT)");
    }
    std::ifstream in(local.dir + "/seeds");
    std::string line;
    std::getline(in, line);
    seeds = SplitSeeds(line);
  }

  remote::RemoteTierOptions o;
  o.cluster.seeds = seeds;
  o.cluster.timeout = std::chrono::milliseconds(2000);
  o.cluster.retry_for = std::chrono::milliseconds(15000);
  o.prefix = "fkvbench" + std::to_string(::getpid());
  o.object_bytes = a.object_mib << 20;
  o.max_inflight = a.inflight;
  auto tier_or = remote::RemoteTier::Open(o, layers, slice);
  if (!tier_or.ok()) return Report(kExitFailure, tier_or.status().ToString());
  remote::RemoteTier& tier = **tier_or;

  KeyHasher hasher;
  const BlockKey ns = hasher.NamespaceDigest({"bench-remote", "", ""});
  std::vector<uint32_t> tokens(size_t{blocks} * kBlockTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t((i * 7 + ::getpid()) % 32000);
  const auto keys = hasher.ChainKeys(ns, tokens, kBlockTokens);
  // The engine's layer-major layout: [layer][block] slices.
  std::vector<std::byte> payload(prefix_bytes);
  FillRandom(payload, 11);
  auto at = [&](std::vector<std::byte>& buf, uint32_t l, uint32_t b) { return buf.data() + (uint64_t{l} * blocks + b) * slice; };
  if (Status st = tier.Publish(ns, keys, [&](uint32_t l, uint32_t b) -> const std::byte* { return at(payload, l, b); }); !st.ok())
    return Report(kExitFailure, "publishing: " + st.ToString());

  // LMCache's layout: per chunk, "<key>kv_bytes" (all layers of the chunk's
  // tokens) and "<key>metadata".
  const uint32_t chunk_blocks = a.chunk_tokens / kBlockTokens;
  const uint32_t chunks = (blocks + chunk_blocks - 1) / chunk_blocks;
  std::vector<std::string> chunk_names;
  for (uint32_t c = 0; c < chunks; ++c) {
    const uint32_t b0 = c * chunk_blocks, n = std::min(chunk_blocks, blocks - b0);
    std::string value;
    value.reserve(n * slice * layers);
    for (uint32_t l = 0; l < layers; ++l)
      for (uint32_t j = 0; j < n; ++j) value.append(reinterpret_cast<const char*>(at(payload, l, b0 + j)), slice);
    const std::string name = o.prefix + ":lmc:" + keys[b0 + n - 1].ToHex();
    chunk_names.push_back(name);
    const std::string meta(28, 'm');  // RemoteMetadata: length, shape, dtype, format
    if (!tier.cluster().Command({"SET", name + "kv_bytes", value}).ok() ||
        !tier.cluster().Command({"SET", name + "metadata", meta}).ok())
      return Report(kExitFailure, "writing the per-chunk layout");
  }

  // Through the store: node A puts the prefix (published in the background),
  // node B, holding nothing locally, restores it layer by layer from the
  // cluster into caller memory (a RestoreTarget), as an engine would.
  auto node = [&](uint64_t dram) {
    StoreOptions so;
    so.shape = *shape;
    so.block_tokens = kBlockTokens;
    so.dram_capacity_bytes = dram;
    so.dram_extent_layer_bytes = std::max<uint64_t>(slice, 1 << 20);
    so.remote.seeds = seeds;
    so.remote.prefix = o.prefix + "s";
    so.remote.object_bytes = o.object_bytes;
    so.remote.max_inflight = a.inflight;
    so.remote.timeout = std::chrono::milliseconds(2000);
    return Store::Open(so);
  };
  auto node_a = node(2 * prefix_bytes + (64ull << 20));
  if (!node_a.ok()) return Report(kExitFailure, "node A: " + node_a.status().ToString());
  auto node_b = node(64ull << 20);
  if (!node_b.ok()) return Report(kExitFailure, "node B: " + node_b.status().ToString());
  {
    std::vector<std::byte> block_major(prefix_bytes);
    for (uint32_t b = 0; b < blocks; ++b)
      for (uint32_t l = 0; l < layers; ++l)
        std::memcpy(block_major.data() + (uint64_t{b} * layers + l) * slice, at(payload, l, b), slice);
    if (Status st = (*node_a)->Put(1, keys, block_major); !st.ok()) return Report(kExitFailure, "node A put: " + st.ToString());
    const double deadline = NowSeconds() + 60;
    while ((*node_a)->Stats().remote.published_blocks < blocks && NowSeconds() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if ((*node_a)->Stats().remote.published_blocks < blocks) return Report(kExitFailure, "node A did not publish the prefix");
  }

  std::vector<std::byte> out(prefix_bytes);
  Timing remote_t, tier_t, raw_t, chunk_t;
  uint64_t raw_bytes = 0;
  for (uint32_t r = 0; r < reps; ++r) {
    // remote_restore: through node B's store
    {
      std::memset(out.data(), 0, out.size());
      const double t0 = NowSeconds();
      double first = 0;
      RestoreTarget target;
      target.destination = [&](uint32_t l, uint32_t b) { return at(out, l, b); };
      auto restore = (*node_b)->StartRestore(keys, target);
      if (!restore.ok()) return Report(kExitFailure, "node B restore: " + restore.status().ToString());
      if ((*restore)->hit_blocks() != blocks)
        return Report(kExitFailure, "node B found " + std::to_string((*restore)->hit_blocks()) + " blocks in the cluster");
      for (uint32_t l = 0; l < layers; ++l) {
        auto view = (*restore)->WaitLayer(l);
        if (!view.ok()) return Report(kExitFailure, "node B layer " + std::to_string(l) + ": " + view.status().ToString());
        if (l == 0) first = NowSeconds() - t0;
        (*restore)->ReleaseLayer(l);
      }
      const uint32_t valid = (*restore)->Finish();
      remote_t.total.push_back(NowSeconds() - t0);
      remote_t.first.push_back(first);
      if (valid != blocks) return Report(kExitFailure, "node B restored " + std::to_string(valid) + " blocks");
      if (std::memcmp(out.data(), payload.data(), prefix_bytes) != 0) return Report(kExitFailure, "node B restored wrong bytes");
    }
    // tier_restore: the same through the tier alone
    {
      std::memset(out.data(), 0, out.size());
      const double t0 = NowSeconds();
      double first = 0;
      auto m = tier.Match(keys);
      if (!m.ok() || m->blocks != blocks) return Report(kExitFailure, "remote match found " + std::to_string(m.ok() ? m->blocks : 0) + " blocks");
      auto valid = tier.Restore(ns, keys, *m, [&](uint32_t l, uint32_t b) { return at(out, l, b); },
                                [&](uint32_t l, uint32_t) {
                                  if (l == 0) first = NowSeconds() - t0;
                                  return true;
                                });
      tier_t.total.push_back(NowSeconds() - t0);
      tier_t.first.push_back(first);
      if (!valid.ok() || *valid != blocks) return Report(kExitFailure, "remote restore returned " + std::to_string(valid.ok() ? *valid : 0) + " blocks");
      if (std::memcmp(out.data(), payload.data(), prefix_bytes) != 0) return Report(kExitFailure, "remote restore returned wrong bytes");
    }
    // raw_get: the same objects, in the same order and windows
    {
      std::vector<std::string> names;
      const uint32_t per = tier.blocks_per_object();
      for (uint32_t l = 0; l < layers; ++l)
        for (uint32_t b = 0; b < blocks; b += per) names.push_back(tier.ObjectName(keys[b], std::min(per, blocks - b), l));
      const double t0 = NowSeconds();
      double first = 0;
      raw_bytes = 0;
      const size_t per_layer = (blocks + per - 1) / per;
      std::vector<std::vector<std::string_view>> gets;
      for (const auto& n : names) gets.push_back({"GET", n});
      bool failed = false;
      tier.cluster().Stream(gets, a.inflight, [&](size_t i, Result<remote::RespValue> res) {
        if (!res.ok() || res->type != remote::RespValue::kString) {
          failed = true;
          return false;
        }
        raw_bytes += res->str.size();
        if (i + 1 == per_layer) first = NowSeconds() - t0;
        return true;
      });
      if (failed) return Report(kExitFailure, "raw GET failed");
      raw_t.total.push_back(NowSeconds() - t0);
      raw_t.first.push_back(first);
    }
    // per_chunk
    {
      std::memset(out.data(), 0, out.size());
      const double t0 = NowSeconds();
      for (const auto& n : chunk_names) {  // batched_async_contains: one EXISTS after another
        auto e = tier.cluster().Command({"EXISTS", n + "metadata"});
        if (!e.ok() || e->integer != 1) return Report(kExitFailure, "per-chunk lookup failed");
      }
      std::vector<std::string> meta_names, kv_names;
      for (const auto& n : chunk_names) {
        meta_names.push_back(n + "metadata");
        kv_names.push_back(n + "kv_bytes");
      }
      std::vector<std::string> values(chunks);
      for (size_t i = 0; i < chunks; i += a.inflight) {
        std::vector<std::vector<std::string_view>> gets;
        const size_t end = std::min<size_t>(chunks, i + a.inflight);
        for (size_t k = i; k < end; ++k) gets.push_back({"GET", meta_names[k]});
        for (size_t k = i; k < end; ++k) gets.push_back({"GET", kv_names[k]});
        auto res = tier.cluster().Pipeline(gets);
        for (size_t k = i; k < end; ++k) {
          auto& v = res[(end - i) + (k - i)];
          if (!v.ok() || v->type != remote::RespValue::kString) return Report(kExitFailure, "per-chunk GET failed");
          values[k] = std::move(v->str);
        }
      }
      double first = 0;
      for (uint32_t l = 0; l < layers; ++l) {
        for (uint32_t c = 0; c < chunks; ++c) {
          const uint32_t b0 = c * chunk_blocks, n = std::min(chunk_blocks, blocks - b0);
          std::memcpy(at(out, l, b0), values[c].data() + uint64_t{l} * n * slice, n * slice);
        }
        if (l == 0) first = NowSeconds() - t0;
      }
      chunk_t.total.push_back(NowSeconds() - t0);
      chunk_t.first.push_back(first);
      if (std::memcmp(out.data(), payload.data(), prefix_bytes) != 0) return Report(kExitFailure, "per-chunk restore returned wrong bytes");
    }
  }

  // Failover: kill -9 the master holding layer 0's first object while restores run.
  nlohmann::json failover = nlohmann::json::object();
  if (own && !a.no_failover) {
    const std::string victim = tier.cluster().NodeForSlot(
        remote::KeySlot(tier.ObjectName(keys[0], std::min(tier.blocks_per_object(), blocks), 0)));
    const std::string port = victim.substr(victim.rfind(':') + 1);
    std::ifstream pidf(local.dir + "/" + port + "/redis.pid");
    pid_t pid = 0;
    pidf >> pid;
    // Every write on its replica first.
    const std::string_view wait[] = {"WAIT", "1", "5000"};
    for (const auto& m : tier.cluster().Masters()) (void)tier.cluster().CommandAt(m, wait);
    uint64_t ok = 0, short_restores = 0, wrong_blocks = 0, errors = 0;
    std::atomic<bool> killed{false};
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      if (pid > 0) ::kill(pid, SIGKILL);
      killed = true;
    });
    const double t_end = NowSeconds() + 20;
    uint64_t ok_after = 0;
    while (NowSeconds() < t_end && ok_after < 3) {
      std::memset(out.data(), 0, out.size());
      auto m = tier.Match(keys);
      if (!m.ok()) {
        ++errors;
        continue;
      }
      auto valid = tier.Restore(ns, keys, *m, [&](uint32_t l, uint32_t b) { return at(out, l, b); });
      if (!valid.ok()) {
        ++errors;
        continue;
      }
      for (uint32_t l = 0; l < layers; ++l)
        for (uint32_t b = 0; b < *valid; ++b)
          if (std::memcmp(at(out, l, b), at(payload, l, b), slice) != 0) ++wrong_blocks;
      if (*valid == blocks) {
        ++ok;
        if (killed) ++ok_after;
      } else {
        ++short_restores;
        // A cut prefix deleted index entries: publish again, as the write path would.
        (void)tier.Publish(ns, keys, [&](uint32_t l, uint32_t b) -> const std::byte* { return at(payload, l, b); });
      }
    }
    killer.join();
    failover = {{"killed", victim}, {"restores_ok", ok}, {"restores_ok_after_kill", ok_after},
                {"short_restores", short_restores}, {"errors", errors}, {"wrong_blocks", wrong_blocks}};
    (void)!std::system(("bash '" + Script() + "' restart '" + local.dir + "' " + port + " >/dev/null 2>&1").c_str());
  } else {
    failover = {{"skipped", own ? "--no-failover" : "--cluster given: this run does not kill other people's nodes"}};
  }

  const double remote_gbps = prefix_bytes / Summarize(remote_t.total).median / 1e9;
  const double tier_gbps = prefix_bytes / Summarize(tier_t.total).median / 1e9;
  const double raw_gbps = raw_bytes / Summarize(raw_t.total).median / 1e9;
  const double chunk_gbps = prefix_bytes / Summarize(chunk_t.total).median / 1e9;
  nlohmann::json j;
  j["config"] = {{"shape", shape->ToString()}, {"blocks", blocks}, {"prefix_bytes", prefix_bytes}, {"reps", reps},
                 {"object_bytes", o.object_bytes}, {"blocks_per_object", tier.blocks_per_object()},
                 {"inflight", a.inflight}, {"chunk_tokens", a.chunk_tokens}, {"cluster", own ? "local 3+3" : a.cluster},
                 {"masters", tier.cluster().Masters().size()}, {"cpus", std::thread::hardware_concurrency()},
                 {"cores_note", "the shards, their replicas and this client share the machine's cores"}};
  j["remote_restore_gbps"] = remote_gbps;  // through the store (node B), layer by layer
  j["tier_restore_gbps"] = tier_gbps;      // RemoteTier::Restore alone, the store's fetch
  j["tier_first_layer_ms"] = Ms(tier_t.first);
  j["raw_get_gbps"] = raw_gbps;
  j["per_chunk_layout_gbps"] = chunk_gbps;
  j["remote_first_layer_ms"] = Ms(remote_t.first);
  j["raw_get_first_layer_ms"] = Ms(raw_t.first);
  j["per_chunk_first_layer_ms"] = Ms(chunk_t.first);
  j["remote_restore_ms"] = Ms(remote_t.total);
  j["per_chunk_restore_ms"] = Ms(chunk_t.total);
  j["failover"] = failover;
  if (failover.contains("wrong_blocks")) {
    j["failover_wrong_blocks"] = failover["wrong_blocks"];
    j["failover_restores_ok"] = failover["restores_ok"];
  }
  const bool fo_met = failover.contains("wrong_blocks") && failover["wrong_blocks"] == 0 && failover["restores_ok"].get<uint64_t>() > 0;
  j["goals"] = {{"remote_vs_raw_min", 0.8}, {"remote_vs_raw", raw_gbps > 0 ? remote_gbps / raw_gbps : 0},
                {"remote_vs_raw_met", raw_gbps > 0 && remote_gbps >= 0.8 * raw_gbps},
                {"first_layer_vs_per_chunk_max", 0.5},
                {"first_layer_vs_per_chunk", Ms(chunk_t.first) > 0 ? Ms(remote_t.first) / Ms(chunk_t.first) : 0},
                {"first_layer_met", Ms(remote_t.first) <= 0.5 * Ms(chunk_t.first)},
                {"failover_met", failover.contains("wrong_blocks") ? nlohmann::json(fo_met) : nlohmann::json()}};
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("flatkv bench remote: %s, prefix of %u blocks (%.1f MiB), %u reps, %s cluster, %u CPUs shared with it\n",
              shape->ToString().c_str(), blocks, prefix_bytes / 1048576.0, reps, own ? "a local 3+3" : "the given",
              std::thread::hardware_concurrency());
  std::printf("%-14s %8s %14s %12s\n", "layout", "GB/s", "first layer ms", "restore ms");
  std::printf("%-14s %8.2f %14.1f %12.1f\n", "store (node B)", remote_gbps, Ms(remote_t.first), Ms(remote_t.total));
  std::printf("%-14s %8.2f %14.1f %12.1f\n", "tier alone", tier_gbps, Ms(tier_t.first), Ms(tier_t.total));
  std::printf("%-14s %8.2f %14.1f %12.1f\n", "raw GET", raw_gbps, Ms(raw_t.first), Ms(raw_t.total));
  std::printf("%-14s %8.2f %14.1f %12.1f\n", "per chunk", chunk_gbps, Ms(chunk_t.first), Ms(chunk_t.total));
  if (failover.contains("wrong_blocks"))
    std::printf("failover (kill -9 %s): %llu whole restores (%llu after the kill), %llu short, %llu errors, %llu wrong blocks\n",
                failover["killed"].get<std::string>().c_str(), (unsigned long long)failover["restores_ok"].get<uint64_t>(),
                (unsigned long long)failover["restores_ok_after_kill"].get<uint64_t>(),
                (unsigned long long)failover["short_restores"].get<uint64_t>(),
                (unsigned long long)failover["errors"].get<uint64_t>(), (unsigned long long)failover["wrong_blocks"].get<uint64_t>());
  std::printf("goals: remote >= 0.8 x raw GET: %s (%.2f); first layer <= 0.5 x per chunk: %s (%.2f)\n",
              j["goals"]["remote_vs_raw_met"].get<bool>() ? "met" : "NOT met", j["goals"]["remote_vs_raw"].get<double>(),
              j["goals"]["first_layer_met"].get<bool>() ? "met" : "NOT met",
              j["goals"]["first_layer_vs_per_chunk"].get<double>());
  return kExitOk;
}

}  // namespace

CLI::App* AddBenchRemoteCommand(CLI::App& bench, BenchRemoteArgs& a) {
  CLI::App* cmd = bench.add_subcommand("remote", "Layer-wise restores from a Redis Cluster vs raw GETs and LMCache's per-chunk layout");
  cmd->add_option("--cluster", a.cluster, "Seeds host:port,... (default: start a local 3+3 cluster)");
  cmd->add_flag("--json", a.json, "Print JSON instead of the table");
  cmd->add_flag("--quick", a.quick, "A shorter prefix and fewer reps");
  cmd->add_option("--blocks", a.blocks, "Prefix length in 64-token blocks (default 16, quick 4)");
  cmd->add_option("--reps", a.reps, "Repetitions per layout, interleaved (default 5, quick 2)");
  cmd->add_option("--chunk-tokens", a.chunk_tokens, "The per-chunk layout's chunk (LMCache chunk_size, default 256)");
  cmd->add_option("--object-mib", a.object_mib, "The remote tier's object size in MiB (default 4)");
  cmd->add_option("--inflight", a.inflight, "Objects or chunks requested at once (default 32)");
  cmd->add_flag("--no-failover", a.no_failover, "Skip the master kill");
  cmd->add_option("--shape", a.shape, "KV shape preset (default llama-3.1-8b)");
  AddScratchDirOption(*cmd, a.dir);
  return cmd;
}

int RunBenchRemote(const BenchRemoteArgs& args) { return RunCatching("bench remote", [&] { return RunChecked(args); }); }

}  // namespace flatkv::tools
