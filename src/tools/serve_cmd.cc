#include "tools/serve_cmd.h"

#include <signal.h>

#include <cstdio>
#include <exception>

#include "service/config.h"
#include "service/server.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

int Report(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv serve: %s\n", msg.c_str());
  return code;
}

std::string Disabled(const std::string& v) { return v == "none" ? "" : v; }

// Builds the effective configuration: defaults, file, flags.
Result<service::ServerConfig> BuildConfig(const ServeArgs& a) {
  service::ServerConfig c = service::DefaultServerConfig();
  if (!a.config.empty()) FLATKV_RETURN_IF_ERROR(service::LoadConfigFile(a.config, &c));
  if (!a.unix_path.empty()) c.unix_path = Disabled(a.unix_path);
  if (!a.tcp.empty()) c.tcp_address = Disabled(a.tcp);
  if (!a.http.empty()) c.http_address = Disabled(a.http);
  if (!a.ssd_dirs.empty()) c.store.ssd_dirs = a.ssd_dirs;
  if (!a.ssd_bytes.empty()) {
    FLATKV_ASSIGN_OR_RETURN(uint64_t b, service::ParseByteSize(a.ssd_bytes));
    c.ssd_bytes = b;
  }
  if (!a.dram_bytes.empty()) {
    FLATKV_ASSIGN_OR_RETURN(uint64_t b, service::ParseByteSize(a.dram_bytes));
    c.dram_bytes = b;
  }
  if (!a.shape.empty()) {
    auto s = FindShapePreset(a.shape);
    if (!s.ok()) return s.status().WithContext("--shape");
    c.store.shape = *s;
  }
  for (const auto& [key, value] : a.store_knobs)
    if (!value.empty()) FLATKV_RETURN_IF_ERROR(service::ApplyStoreKnobFlag(key, value, &c));
  FLATKV_RETURN_IF_ERROR(service::FinalizeConfig(&c));
  return c;
}

void PrintConfig(const service::ServerConfig& c, FILE* out) {
  std::string dirs;
  for (const auto& d : c.store.ssd_dirs) dirs += (dirs.empty() ? "" : ", ") + d;
  std::fprintf(out,
               "shape         %s, %u tokens per block\n"
               "dram          %.2f GiB\n"
               "ssd           %s (%.2f GiB each)\n"
               "unix socket   %s\n"
               "tcp           %s%s\n"
               "http          %s\n"
               "tenants       %zu%s\n",
               c.store.shape.ToString().c_str(), c.store.block_tokens, c.store.dram_capacity_bytes / double(1 << 30),
               dirs.empty() ? "(none)" : dirs.c_str(), c.store.ssd_capacity_bytes / double(1 << 30),
               c.unix_path.empty() ? "(off)" : c.unix_path.c_str(), c.tcp_address.empty() ? "(off)" : c.tcp_address.c_str(),
               c.tls_cert_file.empty() ? "" : " (TLS)", c.http_address.empty() ? "(off)" : c.http_address.c_str(),
               c.tenants.size(), c.tenants.empty() ? " (one implicit 'default' tenant, empty token; Unix socket only)" : "");
  std::fprintf(out, "metrics       tenant labels %s; /stats %s\n", c.metrics_tenant_labels ? "by name" : "by index",
               c.stats_token.empty() ? "off (no metrics.stats_token)" : "with metrics.stats_token");
  // Every store knob as its TOML line (0 for a derived size: the store derives it at Open).
  std::fprintf(out, "[store]\n");
  for (const auto& k : service::StoreKnobs())
    std::fprintf(out, "  %s = %s\n", std::string(k.key).c_str(), service::StoreKnobValue(k.key, c).c_str());
}

int RunChecked(const ServeArgs& a) {
  auto config = BuildConfig(a);
  if (!config.ok()) return Report(kExitUsage, config.status().ToString());
  if (a.print_config) {
    PrintConfig(*config, stdout);
    return kExitOk;
  }
  // Block the stop signals in every thread; this one waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  auto server = service::Server::Start(*config);
  if (!server.ok()) return Report(kExitFailure, server.status().ToString());
  PrintConfig(*config, stderr);
  std::fprintf(stderr, "flatkv serve: listening on %s %s%s%s\n", (*server)->unix_address().c_str(),
               (*server)->tcp_address().c_str(), (*server)->http_address().empty() ? "" : ", metrics on http://",
               (*server)->http_address().c_str());
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "flatkv serve: %s: finishing in-flight requests and closing the store\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  Status st = (*server)->Stop();
  if (!st.ok()) return Report(kExitFailure, "closing the store: " + st.ToString());
  std::fprintf(stderr, "flatkv serve: stopped cleanly\n");
  return kExitOk;
}

}  // namespace

CLI::App* AddServeCommand(CLI::App& app, ServeArgs& a) {
  CLI::App* cmd = app.add_subcommand("serve", "Run the flatkv daemon (Unix socket, TCP, HTTP metrics) until SIGTERM");
  cmd->add_option("--config", a.config, "TOML configuration file (docs/service.md)")->check(CLI::ExistingFile);
  cmd->add_option("--unix", a.unix_path, "Unix socket path ('none' disables)");
  cmd->add_option("--tcp", a.tcp, "TCP HOST:PORT ('none' disables); loopback unless listen.allow_remote");
  cmd->add_option("--http", a.http, "HTTP HOST:PORT for /metrics, /healthz, /stats ('none' disables)");
  cmd->add_option("--ssd-dir", a.ssd_dirs, "SSD directory (repeat for several)");
  cmd->add_option("--ssd-bytes", a.ssd_bytes, "SSD capacity per directory, e.g. 64GiB");
  cmd->add_option("--dram-bytes", a.dram_bytes, "DRAM tier capacity, e.g. 8GiB (0 disables)");
  cmd->add_option("--shape", a.shape, "KV shape preset (e.g. Llama-3.1-8B, stories260K, smollm2-135m)");
  for (const auto& k : service::StoreKnobs())
    cmd->add_option(k.flag, a.store_knobs[std::string(k.key)], "store." + std::string(k.key) + ": " + std::string(k.help));
  cmd->add_flag("--print-config", a.print_config, "Print the effective configuration and exit");
  return cmd;
}

int RunServe(const ServeArgs& args) { return RunCatching("serve", [&] { return RunChecked(args); }); }

}  // namespace flatkv::tools
