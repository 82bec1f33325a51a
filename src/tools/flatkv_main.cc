// The `flatkv` command-line tool: `bench restore`, `bench engine`, `bench blend`, `bench chain-cache`,
// `bench codecs`, `bench attention`, `bench sparse-prefill`, `bench rift`, `bench serve`, `bench metadata`,
// `bench remote`, `bench gpu`, `serve`, `stats`,
// `generate`, `perplexity`, `dump-kv`, `model tensors|tokenize|score|greedy`, `replay`, `crashtest` and `workload`.
// Exit codes: 0 success, 1 a failure while running, 2 a bad argument.
#include <CLI/CLI.hpp>

#include "bench/bench_attention.h"
#include "bench/bench_blend.h"
#include "bench/bench_chain.h"
#include "bench/bench_codecs.h"
#include "bench/bench_engine.h"
#include "bench/bench_gpu.h"
#include "bench/bench_metadata.h"
#include "bench/bench_remote.h"
#include "bench/bench_restore.h"
#include "bench/bench_serve.h"
#include "bench/bench_sparse_prefill.h"
#include "bench/bench_rift.h"
#include "crashtest/crashtest_cmd.h"
#include "flatkv/remote.h"
#include "tools/model_cmds.h"
#include "tools/model_ref_cmds.h"
#include "tools/replay_cmd.h"
#include "tools/serve_cmd.h"
#include "tools/stats_cmd.h"
#include "tools/workload_cmd.h"
#include "tools/tool_common.h"

int main(int argc, char** argv) {
  using namespace flatkv::tools;
  flatkv::RegisterRemoteMedium();  // the tool's stores may use every medium it links
  CLI::App app{"flatkv: a KV-cache store for LLM serving (DRAM and NVMe SSD as peer media)", "flatkv"};
  app.footer("Exit codes: 0 success, 1 failure while running, 2 bad argument.");
  app.require_subcommand(1);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks")->require_subcommand(1);
  BenchRestoreArgs restore_args;
  CLI::App* restore = AddBenchRestoreCommand(*bench, restore_args);
  BenchCodecsArgs codecs_args;
  CLI::App* bench_codecs = AddBenchCodecsCommand(*bench, codecs_args);
  BenchEngineArgs engine_args;
  CLI::App* bench_engine = AddBenchEngineCommand(*bench, engine_args);
  BenchBlendArgs blend_args;
  CLI::App* bench_blend = AddBenchBlendCommand(*bench, blend_args);
  BenchChainArgs chain_args;
  CLI::App* bench_chain = AddBenchChainCommand(*bench, chain_args);
  BenchAttentionArgs attention_args;
  CLI::App* bench_attention = AddBenchAttentionCommand(*bench, attention_args);
  BenchSparsePrefillArgs sparse_prefill_args;
  CLI::App* bench_sparse_prefill = AddBenchSparsePrefillCommand(*bench, sparse_prefill_args);
  BenchRiftArgs rift_args;
  CLI::App* bench_rift = AddBenchRiftCommand(*bench, rift_args);
  BenchServeArgs serve_bench_args;
  CLI::App* bench_serve = AddBenchServeCommand(*bench, serve_bench_args);
  BenchMetadataArgs metadata_args;
  CLI::App* bench_metadata = AddBenchMetadataCommand(*bench, metadata_args);
  BenchGpuArgs gpu_args;
  CLI::App* bench_gpu = AddBenchGpuCommand(*bench, gpu_args);
  BenchRemoteArgs remote_args;
  CLI::App* bench_remote = AddBenchRemoteCommand(*bench, remote_args);
  StatsArgs stats_args;
  CLI::App* stats = AddStatsCommand(app, stats_args);
  GenerateArgs generate_args;
  CLI::App* generate = AddGenerateCommand(app, generate_args);
  PerplexityArgs perplexity_args;
  CLI::App* perplexity = AddPerplexityCommand(app, perplexity_args);
  DumpKvArgs dump_args;
  CLI::App* dump = AddDumpKvCommand(app, dump_args);
  ModelRefArgs model_ref_args;
  CLI::App* model_ref = AddModelRefCommands(app, model_ref_args);
  ReplayArgs replay_args;
  CLI::App* replay = AddReplayCommand(app, replay_args);
  ServeArgs serve_args;
  CLI::App* serve = AddServeCommand(app, serve_args);
  CrashtestArgs crashtest_args;
  CLI::App* crashtest = AddCrashtestCommand(app, crashtest_args);
  WorkloadArgs workload_args;
  CLI::App* workload = AddWorkloadCommand(app, workload_args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error naming the argument
    return code == 0 ? kExitOk : kExitUsage;
  }
  if (restore->parsed()) return RunBenchRestore(restore_args);
  if (bench_engine->parsed()) return RunBenchEngine(engine_args);
  if (bench_blend->parsed()) return RunBenchBlend(blend_args);
  if (bench_attention->parsed()) return RunBenchAttention(attention_args);
  if (bench_chain->parsed()) return RunBenchChain(chain_args);
  if (bench_sparse_prefill->parsed()) return RunBenchSparsePrefill(sparse_prefill_args);
  if (bench_rift->parsed()) return RunBenchRift(rift_args);
  if (bench_codecs->parsed()) return RunBenchCodecs(codecs_args);
  if (stats->parsed()) return RunStats(stats_args);
  if (generate->parsed()) return RunGenerate(generate_args);
  if (perplexity->parsed()) return RunPerplexity(perplexity_args);
  if (dump->parsed()) return RunDumpKv(dump_args);
  if (model_ref->parsed()) return RunModelRef(*model_ref, model_ref_args);
  if (replay->parsed()) return RunReplay(replay_args);
  if (serve->parsed()) return RunServe(serve_args);
  if (bench_serve->parsed()) return RunBenchServe(serve_bench_args);
  if (bench_metadata->parsed()) return RunBenchMetadata(metadata_args);
  if (bench_remote->parsed()) return RunBenchRemote(remote_args);
  if (bench_gpu->parsed()) return RunBenchGpu(gpu_args);
  if (crashtest->parsed()) return RunCrashtest(crashtest_args);
  if (workload->parsed()) return RunWorkload(workload_args);
  return kExitUsage;
}
