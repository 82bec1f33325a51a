#include "bench/bench_gpu.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "codec/dtype.h"
#include "flatkv/codec.h"
#include "flatkv/keys.h"
#include "flatkv/store.h"
#include "gpu/copy_backend.h"
#include "gpu/device_ops.h"
#include "gpu/gpu_window.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

using gpu::CopyBackend;
using gpu::GpuWindow;

std::vector<BlockKey> Chain(uint32_t blocks) {
  KeyHasher h;
  const BlockKey ns = h.NamespaceDigest({"bench-gpu", "", ""});
  std::vector<uint32_t> tokens(uint64_t{blocks} * 64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t(i * 7919 % 50000);
  return h.ChainKeys(ns, tokens, 64);
}

// Seconds to restore `keys` into device memory through a window of 4
// slots, with `compute_ns` of device compute per layer after it lands
// (0: none); *valid gets the blocks valid in every layer, *stats (if set)
// the window's. With `file_reads` false SSD hits bounce through the host
// window even where the backend reads files; with `decodes` false coded
// hits are decoded on the host even where the backend decodes them.
Result<double> RestoreToDevice(Store& store, CopyBackend& backend, gpu::DeviceOps* ops, std::span<const BlockKey> keys,
                               uint64_t compute_ns, uint32_t* valid, bool file_reads = true,
                               gpu::GpuWindowStats* stats = nullptr, bool decodes = true) {
  const double t0 = NowSeconds();
  const uint32_t layers = store.options().shape.layers;
  FLATKV_ASSIGN_OR_RETURN(auto w, GpuWindow::Start(&backend, store, keys, 4, file_reads, decodes));
  for (uint32_t l = 0; l < layers; ++l) {
    FLATKV_RETURN_IF_ERROR(w->WaitLayer(l).status());
    if (compute_ns > 0 && ops) {
      FLATKV_RETURN_IF_ERROR(ops->Spin(compute_ns));
      FLATKV_RETURN_IF_ERROR(ops->Sync());
    }
    w->ReleaseLayer(l);
  }
  *valid = w->Finish();
  const double seconds = NowSeconds() - t0;
  if (stats) *stats = w->Stats();
  if (*valid != keys.size())
    return Status::IoError("bench gpu: " + std::to_string(*valid) + " of " + std::to_string(keys.size()) +
                            " blocks restored into device memory");
  return seconds;
}

double Best(std::vector<double> v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

}  // namespace

CLI::App* AddBenchGpuCommand(CLI::App& bench, BenchGpuArgs& a) {
  CLI::App* cmd = bench.add_subcommand("gpu", "The GPU window: DRAM and SSD restores into device memory, decoder, overlap");
  cmd->add_option("--backend", a.backend, "Copy backend: cuda (default) or cpu")->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_option("--shape", a.shape, "KV shape preset (default llama-3.1-8b)");
  cmd->add_option("--blocks", a.blocks, "Restored prefix in 64-token blocks (default 64)")->check(CLI::Range(1u, 100000u));
  cmd->add_option("--reps", a.reps, "Repetitions, best kept (default 3)")->check(CLI::Range(1u, 100u));
  AddScratchDirOption(*cmd, a.dir);
  cmd->add_flag("--json", a.json, "Print JSON");
  return cmd;
}

int RunBenchGpu(const BenchGpuArgs& a) {
  return RunCatching("bench gpu", [&]() -> int {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "flatkv bench gpu: %s\n", s.ToString().c_str());
      return kExitFailure;
    };
    auto shape = FindShapePreset(a.shape);
    if (!shape.ok()) {
      std::fprintf(stderr, "flatkv bench gpu: --shape %s: no such preset\n", a.shape.c_str());
      return kExitUsage;
    }
    auto backend_or = gpu::MakeCopyBackend(a.backend);
    if (!backend_or.ok()) return fail(backend_or.status());
    CopyBackend& backend = **backend_or;
    nlohmann::json j;
    j["backend"] = a.backend;
    j["shape"] = a.shape;
    std::vector<std::string> errors;
    bool failed = false;  // a restore section failed (not a DeviceOps missing: the cpu backend has none)
    // Runs one restore section; a failure is listed by name and the rest still run.
    auto section = [&](const char* name, const std::function<Status()>& run) {
      if (Status s = run(); !s.ok()) {
        errors.push_back(std::string(name) + ": " + s.ToString());
        failed = true;
      }
    };
    std::unique_ptr<gpu::DeviceOps> ops;
    if (auto o = gpu::DeviceOps::Open(0); o.ok()) ops = std::move(o).value();
    else errors.push_back(o.status().ToString());

    auto scratch = ScratchDir::Create(a.dir.empty() ? "/var/tmp" : a.dir);
    if (!scratch.ok()) return fail(scratch.status());
    const auto keys = Chain(a.blocks);
    StoreOptions o;
    o.shape = *shape;
    o.block_tokens = 64;
    o.window_layers = 4;
    const uint64_t block_bytes = o.shape.BytesPerTokenLayer() * 64 * o.shape.layers;
    const uint64_t bytes = block_bytes * keys.size();
    j["restored_bytes"] = bytes;

    // Pinned host -> device, the ceiling of every path below.
    auto host = PrefaultedBuffer::Allocate(bytes);
    if (!host.ok()) return fail(host.status());
    FillRandom(host->first(bytes), 1);
    std::byte* dev = backend.AllocateDevice(bytes);
    if (dev == nullptr) return fail(Status::NoSpace("cannot allocate " + std::to_string(bytes) + " bytes of device memory"));
    auto h2d = [&](bool pinned) -> Result<double> {
      if (pinned) FLATKV_RETURN_IF_ERROR(backend.RegisterHost(host->data(), host->size()));
      std::vector<double> t;
      for (uint32_t r = 0; r < a.reps; ++r) {
        const double t0 = NowSeconds();
        FLATKV_RETURN_IF_ERROR(backend.EnqueueCopy(dev, host->data(), bytes));
        FLATKV_RETURN_IF_ERROR(backend.Wait(backend.Record()));
        t.push_back(NowSeconds() - t0);
      }
      if (pinned) backend.UnregisterHost(host->data());
      return bytes / Best(t) / 1e9;
    };
    if (auto g = h2d(false); g.ok()) j["h2d_pageable_gbps"] = *g; else errors.push_back(g.status().ToString());
    if (auto g = h2d(true); g.ok()) j["h2d_pinned_gbps"] = *g; else errors.push_back(g.status().ToString());

    // DRAM: a store whose DRAM holds the chain.
    section("dram", [&]() -> Status {
      StoreOptions d = o;
      d.dram_capacity_bytes = bytes + (256ull << 20);
      auto store = Store::Open(d);
      if (!store.ok()) return store.status();
      if (Status s = (*store)->Put(1, keys, host->first(bytes)); !s.ok()) return s;
      std::vector<double> t;
      uint32_t valid = 0;
      for (uint32_t r = 0; r <= a.reps; ++r) {  // the first pins the arena
        auto s = RestoreToDevice(**store, backend, nullptr, keys, 0, &valid);
        if (!s.ok()) {
          GpuWindow::UnpinStore(&backend, **store);
          return s.status();
        }
        if (r > 0) t.push_back(*s);
      }
      GpuWindow::UnpinStore(&backend, **store);
      j["dram_to_gpu_gbps"] = bytes / Best(t) / 1e9;
      j["dram_path"] = "dma-from-arena";  // DRAM hits copied by the backend from the pinned arena, no host copy
      j["dram_valid_blocks"] = valid;
      return Status::Ok();
    });

    // DRAM, kivi-coded (its default, 4 bits in groups of 32): decoded on the
    // device from the encoded slices carried over, and decoded on the host
    // and carried over decoded, in decoded bytes per second.
    section("dram_kivi", [&]() -> Status {
      StoreOptions d = o;
      d.dram_capacity_bytes = bytes + (256ull << 20);
      auto store = Store::Open(d);
      if (!store.ok()) return store.status();
      auto kivi = MakeCodec("kivi");
      if (!kivi.ok()) return kivi.status();
      PutOptions po;
      po.codec = std::shared_ptr<const Codec>(std::move(kivi).value());
      // KV-like values (a codec's input, not random bits: those are NaNs in bf16).
      auto kv = PrefaultedBuffer::Allocate(bytes);
      if (!kv.ok()) return kv.status();
      {
        std::vector<float> f(1 << 20);
        const uint64_t es = DTypeBytes(o.shape.dtype);
        for (uint64_t at = 0; at < bytes; at += f.size() * es) {
          const uint64_t n = std::min<uint64_t>(f.size(), (bytes - at) / es);
          for (uint64_t i = 0; i < n; ++i) f[i] = float(((at / es + i) * 2654435761u) % 2000) / 1000.0f - 1.0f;
          codec::FromFloat(o.shape.dtype, f.data(), kv->data() + at, n);
        }
      }
      if (Status s = (*store)->Put(1, keys, kv->first(bytes), po); !s.ok()) return s;
      std::vector<double> dev_t, host_t;
      uint32_t valid = 0, host_valid = 0;
      gpu::GpuWindowStats ws;
      for (uint32_t r = 0; r <= a.reps; ++r) {  // the first pins the arena
        auto sd = RestoreToDevice(**store, backend, nullptr, keys, 0, &valid, true, &ws, /*decodes=*/true);
        auto sh = sd.ok() ? RestoreToDevice(**store, backend, nullptr, keys, 0, &host_valid, true, nullptr, false) : sd;
        if (!sd.ok() || !sh.ok()) {
          GpuWindow::UnpinStore(&backend, **store);
          return !sd.ok() ? sd.status() : sh.status();
        }
        if (r > 0) {
          dev_t.push_back(*sd);
          host_t.push_back(*sh);
        }
      }
      GpuWindow::UnpinStore(&backend, **store);
      j["dram_kivi_to_gpu_gbps"] = bytes / Best(dev_t) / 1e9;
      j["dram_kivi_host_decode_to_gpu_gbps"] = bytes / Best(host_t) / 1e9;
      j["dram_kivi_path"] = ws.decoded_slices > 0 ? "device-decode" : "host-decode";
      j["dram_kivi_carried_bytes"] = ws.decoded_slices > 0 ? ws.decode_in_bytes : ws.copy_bytes;
      j["dram_kivi_valid_blocks"] = valid;
      j["dram_kivi_host_decode_valid_blocks"] = host_valid;
      return Status::Ok();
    });

    // SSD: an SSD-only store, page cache dropped before every read.
    section("ssd", [&]() -> Status {
      StoreOptions s = o;
      s.dram_capacity_bytes = 0;  // no DRAM copies: every hit is read from the SSD
      s.ssd_dirs = {scratch->path() + "/ssd"};
      std::filesystem::create_directories(s.ssd_dirs[0]);
      s.ssd_capacity_bytes = bytes * 2 + (1ull << 30);
      auto store = Store::Open(s);
      if (!store.ok()) return store.status();
      if (Status st = (*store)->Put(1, keys, host->first(bytes)); !st.ok()) return st;
      PageCacheEvictor evict(false);
      auto chunk = PrefaultedBuffer::Allocate(16ull << 20);
      if (!chunk.ok()) return chunk.status();
      // The raw read of the same directory's bytes: O_DIRECT, 16 MiB requests.
      // The restore by the backend's file reads (cuFile) where it has them,
      // and through the pinned host window (bounce) beside it.
      const bool file_reads = !backend.file_read_path().empty();
      std::vector<double> raw, t, bounce, both;
      uint64_t raw_bytes = 0;
      bool raw_direct = true;
      uint32_t valid = 0, bounce_valid = 0;
      gpu::GpuWindowStats ws;
      for (uint32_t r = 0; r < a.reps; ++r) {
        (void)evict.Evict({s.ssd_dirs[0]});
        raw_bytes = 0;
        const double t0 = NowSeconds();
        for (const auto& f : std::filesystem::directory_iterator(s.ssd_dirs[0])) {
          if (f.path().filename().string().rfind("seg-", 0) != 0) continue;
          int fd = ::open(f.path().c_str(), O_RDONLY | O_DIRECT);
          if (fd < 0 && errno == EINVAL) {  // a filesystem without O_DIRECT: buffered, from an evicted cache
            raw_direct = false;
            fd = ::open(f.path().c_str(), O_RDONLY);
          }
          if (fd < 0) return Status::FromErrno(errno, "open " + f.path().string());
          for (uint64_t off = 0;; off += chunk->size()) {
            const ssize_t n = ::pread(fd, chunk->data(), chunk->size(), off);
            if (n <= 0) break;
            raw_bytes += n;
          }
          ::close(fd);
        }
        raw.push_back(NowSeconds() - t0);
        (void)evict.Evict({s.ssd_dirs[0]});
        auto sec = RestoreToDevice(**store, backend, nullptr, keys, 0, &valid, true, &ws);
        if (!sec.ok()) return sec.status();
        t.push_back(*sec);
        if (file_reads) {
          (void)evict.Evict({s.ssd_dirs[0]});
          auto b = RestoreToDevice(**store, backend, nullptr, keys, 0, &bounce_valid, false);
          if (!b.ok()) return b.status();
          bounce.push_back(*b);
        }
      }
      raw_bytes = std::min(raw_bytes, bytes);
      j["raw_ssd_read_gbps"] = raw_bytes / Best(raw) / 1e9;
      j["raw_ssd_read_direct"] = raw_direct;  // false: the filesystem refused O_DIRECT (buffered reads of an evicted cache)
      j["ssd_to_gpu_gbps"] = bytes / Best(t) / 1e9;
      // As the driver says: "gds", "cufile-compat" (never counted as GDS), the CPU backend's
      // "cpu-pread", or "bounce" (read into the pinned host window, checked, copied).
      j["ssd_path"] = ws.file_reads == 0 ? std::string("bounce")
                                         : backend.file_read_path() + (ws.bounce_bytes > 0 ? "+bounce" : "");
      if (ws.file_reads == 0 && !backend.no_file_reads_why().empty()) j["ssd_no_file_reads"] = backend.no_file_reads_why();
      if (ws.files_refused > 0) j["ssd_files_refused"] = ws.files_refused;
      j["ssd_file_read_bytes"] = ws.file_read_bytes;
      j["ssd_bounce_bytes"] = ws.bounce_bytes;
      if (file_reads) {
        j["ssd_bounce_to_gpu_gbps"] = bytes / Best(bounce) / 1e9;
        j["ssd_bounce_valid_blocks"] = bounce_valid;
      }
      j["ssd_valid_blocks"] = valid;
      // What the restores delivered from the SSD and from DRAM (none: a DRAM copy would flatter the figure).
      const StoreStats ss = (*store)->Stats();
      j["ssd_delivered_bytes"] = ss.ssd.bytes_delivered;
      j["ssd_store_dram_delivered_bytes"] = ss.dram.bytes_delivered;
      // Overlap: per-layer compute sized to the per-layer load time.
      if (ops) {
        const double t_load = Best(t);
        const uint64_t per_layer_ns = uint64_t(t_load / o.shape.layers * 1e9);
        std::vector<double> comp;
        for (uint32_t r = 0; r < a.reps; ++r) {
          const double t0 = NowSeconds();
          for (uint32_t l = 0; l < o.shape.layers; ++l) {
            (void)ops->Spin(per_layer_ns);
            (void)ops->Sync();
          }
          comp.push_back(NowSeconds() - t0);
          (void)evict.Evict({s.ssd_dirs[0]});
          auto sec = RestoreToDevice(**store, backend, ops.get(), keys, per_layer_ns, &valid);
          if (!sec.ok()) return sec.status();
          both.push_back(*sec);
        }
        const double t_comp = Best(comp), t_both = Best(both);
        j["layer_compute_ms"] = per_layer_ns / 1e6;
        j["layer_overlap_ratio"] = (t_load + t_comp - t_both) / std::min(t_load, t_comp);
      }
      return Status::Ok();
    });

    // The int8 and kivi (its default: 4 bits, groups of 32) decoders, in decoded bytes per second.
    for (const char* spec : {"int8", "kivi"}) {
      if (!ops) break;
      const std::string prefix = std::string(spec) == "int8" ? "" : std::string(spec) + "_";
      auto codec = MakeCodec(spec);
      SliceLayout layout{o.shape, 64, 0};
      CodecContext ctx;
      std::vector<std::byte> raw(layout.Bytes()), enc((*codec)->MaxEncodedSize(layout));
      std::vector<float> f(layout.Elements());
      for (size_t i = 0; i < f.size(); ++i) f[i] = float((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
      codec::FromFloat(layout.shape.dtype, f.data(), raw.data(), f.size());
      auto n = (*codec)->Encode(ctx, layout, raw, enc);
      if (n.ok()) {
        enc.resize(*n);
        std::byte* din = backend.AllocateDevice(enc.size());
        std::byte* dout = backend.AllocateDevice(raw.size());
        (void)backend.EnqueueCopy(din, enc.data(), enc.size());
        (void)backend.Wait(backend.Record());
        const uint32_t slices = 256;
        std::vector<double> t;
        for (uint32_t r = 0; r < a.reps; ++r) {
          const double t0 = NowSeconds();
          for (uint32_t k = 0; k < slices; ++k)
            (void)(prefix.empty() ? ops->DecodeInt8(layout, enc, din, dout) : ops->DecodeKivi(layout, enc, din, dout));
          (void)ops->Sync();
          t.push_back(NowSeconds() - t0);
        }
        // Checked once against the CPU codec, so a figure is never of a wrong decode.
        std::vector<std::byte> want(raw.size()), got(raw.size());
        Status dec = DecodeSlice(ctx, layout, enc, want);
        if (dec.ok()) dec = backend.CopyToHost(got.data(), dout, got.size());
        if (dec.ok() && std::memcmp(got.data(), want.data(), want.size()) != 0)
          dec = Status::Corruption(std::string(spec) + ": the GPU decode differs from the CPU codec's");
        if (dec.ok()) {
          j["gpu_" + prefix + "decode_gbps"] = double(raw.size()) * slices / Best(t) / 1e9;
          j[prefix + "decode_ratio"] = double(raw.size()) / enc.size();
        } else {
          errors.push_back(dec.ToString());
        }
        backend.FreeDevice(din);
        backend.FreeDevice(dout);
      } else {
        errors.push_back(n.status().ToString());
      }
    }
    // Block checksums in device memory (what checks each cuFile read before
    // its layer is valid): one layer's slices of the restored prefix, from `dev`.
    if (ops) {
      const uint64_t lb = o.shape.BytesPerTokenLayer() * 64;
      const uint32_t n = static_cast<uint32_t>(keys.size());
      std::byte* sums = backend.AllocateDevice(uint64_t{n} * sizeof(uint64_t));
      if (sums == nullptr) {
        errors.push_back("gpu checksums: cannot allocate " + std::to_string(n * sizeof(uint64_t)) + " bytes");
      } else {
        const uint32_t layers = std::max<uint32_t>(1, o.shape.layers);
        std::vector<double> t;
        Status st;
        for (uint32_t r = 0; r < a.reps && st.ok(); ++r) {
          const double t0 = NowSeconds();
          for (uint32_t l = 0; l < layers && st.ok(); ++l)
            st = ops->Checksums(dev + uint64_t{l} * n * lb, n, lb, lb, reinterpret_cast<uint64_t*>(sums));
          if (st.ok()) st = ops->Sync();
          t.push_back(NowSeconds() - t0);
        }
        if (st.ok()) j["gpu_checksum_gbps"] = double(bytes) / Best(t) / 1e9;
        else errors.push_back(st.ToString());
        backend.FreeDevice(sums);
      }
    }
    backend.FreeDevice(dev);
    j["errors"] = errors;
    if (a.json) {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      for (auto& [k, v] : j.items()) std::printf("%-22s %s\n", k.c_str(), v.dump().c_str());
    }
    return failed ? kExitFailure : kExitOk;
  });
}

}  // namespace flatkv::tools
