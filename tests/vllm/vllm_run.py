"""One vLLM process on SmolLM2 for tests/vllm/test_vllm_connector.py (a fresh process per call:
vLLM holds its engine for the process's life). Reads a JSON job on argv[1], writes results to argv[2].

job: {"model": DIR, "connector": null | {extra config}, "max_tokens": 16, "prefix_caching": true,
      "runs": [step, ...]}
A step is one of:
  {"prompt_ids": [...], "cache_salt": null | "..."}: a greedy generation; its result is
      {"output_ids": [...], "num_cached_tokens": N};
  {"pause": NAME}: writes NAME.ready beside argv[2] and waits (at most 120 s) for NAME.go, so the
      test can act (kill or restart the daemon) between generations; its result is {};
  {"compare_with_store": true}: the worker's FlatkvConnector.compare_with_store(), byte for byte
      vLLM's cache blocks against the daemon's copies; its result is that dict.
result: {"runs": [result per step]}
"""
import json
import os
import sys
import time


def main():
    job = json.load(open(sys.argv[1]))
    # compare_with_store is sent to vLLM's engine process as a function (pickled).
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    kw = dict(model=job["model"], dtype="float32", enforce_eager=True,
              max_model_len=job.get("max_model_len", 2048), block_size=job.get("block_size", 64),
              enable_prefix_caching=job.get("prefix_caching", True), seed=0)
    if job.get("connector") is not None:
        from vllm.config import KVTransferConfig
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="FlatkvConnector", kv_connector_module_path="flatkv_vllm",
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
        if run.get("compare_with_store"):
            import flatkv_vllm
            out.append(llm.collective_rpc(flatkv_vllm.compare_with_store)[0])
            continue
        p = TokensPrompt(prompt_token_ids=run["prompt_ids"])
        if run.get("cache_salt"):
            p["cache_salt"] = run["cache_salt"]
        r = llm.generate([p], sp, use_tqdm=False)[0]
        out.append({"output_ids": list(r.outputs[0].token_ids),
                    "num_cached_tokens": r.num_cached_tokens or 0})
    json.dump({"runs": out}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
