"""One vLLM process on SmolLM2 for tests/vllm/test_vllm_connector.py (a fresh process per call:
vLLM holds its engine for the process's life). Reads a JSON job on argv[1], writes results to argv[2].

job: {"model": DIR, "connector": null | {extra config}, "kv_space_gib": 1, "max_tokens": 16,
      "runs": [{"prompt_ids": [...], "cache_salt": null | "..."}, ...]}
result: {"runs": [{"output_ids": [...], "num_cached_tokens": N}, ...]}
"""
import json
import sys


def main():
    job = json.load(open(sys.argv[1]))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    kw = dict(model=job["model"], dtype="float32", enforce_eager=True,
              max_model_len=job.get("max_model_len", 2048), block_size=job.get("block_size", 64),
              enable_prefix_caching=job.get("prefix_caching", True), seed=0)
    if job.get("connector") is not None:
        from vllm.config import KVTransferConfig
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="FlatkvConnector", kv_connector_module_path="flatkv_vllm",
            kv_role="kv_both", kv_connector_extra_config=job["connector"])
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0, max_tokens=job.get("max_tokens", 16))
    out = []
    for run in job["runs"]:
        p = TokensPrompt(prompt_token_ids=run["prompt_ids"])
        if run.get("cache_salt"):
            p["cache_salt"] = run["cache_salt"]
        r = llm.generate([p], sp, use_tqdm=False)[0]
        out.append({"output_ids": list(r.outputs[0].token_ids),
                    "num_cached_tokens": r.num_cached_tokens or 0})
    json.dump({"runs": out}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
