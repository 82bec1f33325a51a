"""One vLLM process on SmolLM2 for tests/vllm/test_vllm_connector.py (a fresh process per call:
vLLM holds its engine for the process's life). Reads a JSON job on argv[1], writes results to argv[2].

job: {"model": DIR, "connector": null | {extra config}, "max_tokens": 16, "prefix_caching": true,
      "runs": [step, ...]}, and any of LLM's tensor_parallel_size, pipeline_parallel_size,
      max_num_seqs, kv_cache_memory_bytes, enable_prompt_embeds, distributed_executor_backend
A step is one of:
  {"prompt_ids": [...], "cache_salt": null | "..."}: a greedy generation; its result is
      {"output_ids": [...], "num_cached_tokens": N};
  {"pause": NAME}: writes NAME.ready beside argv[2] and waits (at most 120 s) for NAME.go, so the
      test can act (kill or restart the daemon) between generations; its result is {};
  {"compare_with_store": true}: the worker's FlatkvConnector.compare_with_store(), byte for byte
      vLLM's cache blocks against the daemon's copies; its result is that dict ({"ranks": [dict
      per rank]} under tensor or pipeline parallelism);
  {"prompt_ids": [...], "embeds": true}: the same as prompt embeds (the model's embedding rows);
  {"prompt_ids": [...], "lora": {"name", "id", "path"}}: with a LoRA adapter (make_lora writes one);
  {"batch": [[ids], ...]}: the prompts in one generate call; its result is {"outputs": [...],
      "num_cached_tokens": [...]};
  {"reset_prefix_cache": true}: empties vLLM's own prefix cache, so the next request of a prompt
      this process ran already asks flatkv; its result is {};
  {"kill_daemon": {"pidfile": PATH, "at": "start" | LAYER}}: arms the worker's connector to kill
      the daemon (SIGKILL, pid read from PATH then) once, when it next starts a load ("start":
      after the scheduler matched, before the restore is asked for) or before it waits for layer
      LAYER (the restore in flight); its result is {}.
result: {"runs": [result per step]}
"""
import json
import os
import signal
import sys
import time


def arm_daemon_kill(worker, pidfile, at):
    """Runs in vLLM's worker (collective_rpc): wraps its FlatkvConnector's start_load_kv (at =
    "start") or wait_for_layer_load (at = a layer index) so that the next such call first kills
    the daemon and waits until it is dead; the call then goes on against a dead daemon."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    conn = get_kv_transfer_group()

    def kill():
        pid = int(open(pidfile).read())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # dead once a zombie (the test reaps it) or gone
            try:
                if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
            except FileNotFoundError:
                return
            time.sleep(0.01)
        raise RuntimeError(f"the flatkv daemon {pid} did not die within 10 s of SIGKILL")

    name = "start_load_kv" if at == "start" else "wait_for_layer_load"
    orig = getattr(conn, name)

    def wrapped(*args, **kwargs):
        if at == "start" or conn._layer_of.get(args[0]) == at:
            setattr(conn, name, orig)  # once
            kill()
        return orig(*args, **kwargs)
    setattr(conn, name, wrapped)


def embedding_rows(model_dir, ids):
    """Rows of the model's input embedding (model.embed_tokens.weight) for `ids`, float32."""
    import torch
    from safetensors import safe_open
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        w = f.get_tensor("model.embed_tokens.weight")
    return w[torch.tensor(ids)].to(torch.float32).contiguous()


def make_lora(model_dir, path, seed, rank=8):
    """A random-weight LoRA adapter of q_proj and v_proj in every layer, in PEFT's file format."""
    import torch
    from safetensors.torch import save_file
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * hidden // cfg["num_attention_heads"]
    g = torch.Generator().manual_seed(seed)
    t = {}
    for i in range(layers):
        for name, out in (("q_proj", hidden), ("v_proj", kv)):
            pre = f"base_model.model.model.layers.{i}.self_attn.{name}"
            t[f"{pre}.lora_A.weight"] = torch.randn(rank, hidden, generator=g) * 0.02
            t[f"{pre}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.02
    os.makedirs(path, exist_ok=True)
    save_file(t, os.path.join(path, "adapter_model.safetensors"))
    json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none",
               "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": model_dir,
               "task_type": "CAUSAL_LM"}, open(os.path.join(path, "adapter_config.json"), "w"))


def main():
    job = json.load(open(sys.argv[1]))
    # compare_with_store is sent to vLLM's engine process as a function (pickled).
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    kw = dict(model=job["model"], dtype="float32", enforce_eager=True,
              max_model_len=job.get("max_model_len", 2048), block_size=job.get("block_size", 64),
              enable_prefix_caching=job.get("prefix_caching", True), seed=0)
    for k in ("tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs", "kv_cache_memory_bytes",
              "enable_prompt_embeds", "distributed_executor_backend", "enable_lora", "max_lora_rank"):
        if k in job:
            kw[k] = job[k]
    if job.get("connector") is not None:
        from vllm.config import KVTransferConfig
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="FlatkvConnector", kv_connector_module_path="flatkv.vllm",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config=job["connector"])
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0, max_tokens=job.get("max_tokens", 16))
    out = []
    here = os.path.dirname(os.path.abspath(sys.argv[2]))
    for run in job["runs"]:
        if "pause" in run:
            base = os.path.join(here, run["pause"])
            open(base + ".ready", "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(base + ".go"):
                if time.monotonic() > deadline:
                    sys.exit(f"vllm_run: nobody wrote {base}.go within 120 s")
                time.sleep(0.05)
            out.append({})
            continue
        if run.get("reset_prefix_cache"):
            if not llm.reset_prefix_cache():
                sys.exit("vllm_run: vLLM did not reset its prefix cache")
            out.append({})
            continue
        if "kill_daemon" in run:
            k = run["kill_daemon"]
            llm.collective_rpc(arm_daemon_kill, args=(k["pidfile"], k["at"]))
            out.append({})
            continue
        if run.get("compare_with_store"):
            from flatkv import vllm as flatkv_vllm
            per_rank = llm.collective_rpc(flatkv_vllm.compare_with_store)
            out.append(per_rank[0] if len(per_rank) == 1 else {"ranks": per_rank})
            continue
        if "batch" in run:  # several prompts in one generate call: vLLM batches (and may preempt) them
            ps = [TokensPrompt(prompt_token_ids=ids) for ids in run["batch"]]
            rs = llm.generate(ps, sp, use_tqdm=False)
            out.append({"outputs": [list(r.outputs[0].token_ids) for r in rs],
                        "num_cached_tokens": [r.num_cached_tokens or 0 for r in rs]})
            continue
        if run.get("embeds"):  # the prompt as embeddings: the model's own embedding rows of these ids
            from vllm.inputs import EmbedsPrompt
            p = EmbedsPrompt(prompt_embeds=embedding_rows(job["model"], run["prompt_ids"]))
        else:
            p = TokensPrompt(prompt_token_ids=run["prompt_ids"])
        if run.get("cache_salt"):
            p["cache_salt"] = run["cache_salt"]
        lora = None
        if run.get("lora"):
            from vllm.lora.request import LoRARequest
            lr = run["lora"]
            lora = LoRARequest(lora_name=lr["name"], lora_int_id=lr["id"], lora_path=lr["path"])
        r = llm.generate([p], sp, use_tqdm=False, lora_request=lora)[0]
        out.append({"output_ids": list(r.outputs[0].token_ids),
                    "num_cached_tokens": r.num_cached_tokens or 0})
    json.dump({"runs": out}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
