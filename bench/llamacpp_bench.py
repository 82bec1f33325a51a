#!/usr/bin/env python3
"""llama.cpp beside flatkv's engine: prefill and decode tokens/s on one GGUF.

Run by `flatkv bench engine` (src/bench/bench_engine_inputs.cc) with the refs
environment's interpreter (build/pyenv/refs/bin/python, llama-cpp-python):

  llamacpp_bench.py --model FILE.gguf --threads N --decode-tokens D --reps R --prompts PROMPTS.json

PROMPTS.json is {"prompts": [[token ids], ...]}: the engine's own prompt ids,
so both tokenizers are out of the comparison. For each prompt and rep, on a
cleared KV cache: prefill = the whole prompt through llama_decode in n_batch
pieces, timed to the last piece's logits; then D greedy tokens, the first from
the prefill's logits and each later one after one llama_decode of the token
before it (so D - 1 decode steps are timed, as the engine's decode_tok_s).

Context settings are llama.cpp's own defaults, read from
llama_context_default_params() (n_batch 2048, n_ubatch 512, flash attention
"auto" in the vendored llama.cpp), except n_ctx (8192, the model's context)
and n_threads = n_threads_batch = --threads. Prints one JSON object:
{"settings": {...}, "runs": [{"prompt_tokens", "prefill_tok_s": [per rep],
"decode_tok_s": [per rep], "tokens": [greedy tokens of rep 0]}]}.
"""
import argparse
import json
import sys
import time

import numpy as np

import llama_cpp as L


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n-ctx", type=int, default=8192)
    args = ap.parse_args()
    with open(args.prompts) as f:
        prompts = json.load(f)["prompts"]
    for p in prompts:
        if len(p) + args.decode_tokens > args.n_ctx:
            print(f"llamacpp_bench: a prompt of {len(p)} tokens plus {args.decode_tokens} decoded exceeds "
                  f"n_ctx {args.n_ctx}", file=sys.stderr)
            return 2

    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        print(f"llamacpp_bench: llama.cpp could not load {args.model}", file=sys.stderr)
        return 1
    cparams = L.llama_context_default_params()
    defaults = {"n_batch": cparams.n_batch, "n_ubatch": cparams.n_ubatch,
                "flash_attn_type": cparams.flash_attn_type}
    cparams.n_ctx = args.n_ctx
    cparams.n_threads = args.threads
    cparams.n_threads_batch = args.threads
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        print("llamacpp_bench: llama_init_from_model failed", file=sys.stderr)
        return 1
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    n_batch = cparams.n_batch

    def decode(ids):
        arr = (L.llama_token * len(ids))(*ids)
        rc = L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} on a batch of {len(ids)} tokens")

    def argmax_last():
        ptr = L.llama_get_logits_ith(ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    runs = []
    for prompt in prompts:
        prefill, dec, first_tokens = [], [], None
        for rep in range(args.reps):
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            t0 = time.perf_counter()
            for i in range(0, len(prompt), n_batch):
                decode(prompt[i:i + n_batch])
            L.llama_synchronize(ctx)
            prefill.append(len(prompt) / (time.perf_counter() - t0))
            tokens = [argmax_last()]
            spent = 0.0
            for _ in range(args.decode_tokens - 1):
                t0 = time.perf_counter()
                decode([tokens[-1]])
                L.llama_synchronize(ctx)
                spent += time.perf_counter() - t0
                tokens.append(argmax_last())
            if args.decode_tokens > 1:
                dec.append((args.decode_tokens - 1) / spent)
            if first_tokens is None:
                first_tokens = tokens
        runs.append({"prompt_tokens": len(prompt), "prefill_tok_s": prefill, "decode_tok_s": dec,
                     "tokens": first_tokens})
        print(f"llamacpp_bench: {len(prompt)} tokens: prefill {np.median(prefill):.0f} tok/s, decode "
              f"{np.median(dec) if dec else 0:.1f} tok/s", file=sys.stderr)
    settings = {"llama_cpp_python": L.__version__, "n_ctx": args.n_ctx, "n_threads": args.threads,
                "n_threads_batch": args.threads, "reps": args.reps, "decode_tokens": args.decode_tokens,
                "defaults_used": defaults,
                "system_info": L.llama_print_system_info().decode(errors="replace").strip()}
    L.llama_free(ctx)
    L.llama_model_free(model)
    json.dump({"settings": settings, "runs": runs}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
