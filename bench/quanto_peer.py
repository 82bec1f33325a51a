"""transformers' QuantizedCache (optimum-quanto backend) on the real-text workload, by the protocol
of src/eval/protocol.h (docs/eval.md): the peer `quanto:int4` / `quanto:int2` of `flatkv bench codecs
--model`, which runs this script with build/pyenv/kvpeers and reads its JSON from stdout.

Usage: quanto_peer.py --model-dir DIR --workload FILE.json [--nbits 4 2] [--threads 2]
  DIR: SmolLM2 as safetensors (build/models/smollm2-135m-hf); FILE: `flatkv workload --out` (token ids
  from the GGUF's own tokenizer, fed to transformers as they are).

The cache as its users deploy it: QuantizedCache(backend="quanto", config, nbits) with every other
setting at its default, as transformers 5.2.0 documents and codes them (transformers/cache_utils.py,
class QuantizedCache and QuantizedLayer.__init__; docs/source/en/kv_cache.md "Quantized cache"):
axis_key=0, axis_value=0, q_group_size=64, residual_length=128. Its update() quantizes the whole
prefill on the first call; later tokens wait in a full-precision residual of up to residual_length
tokens, then everything is requantized. Attention: sdpa, the model in float32.

Per prompt (C context tokens): prefill context[:-1] into the cache; then, from a copy of that state,
  ppl:    one pass over [context[-1]] + continuation[:-1]: the log-probabilities of continuation
          (the same tokens and positions as flatkv's protocol; this pass's own KV is exact);
  greedy: the full cache's 64 greedy tokens (a DynamicCache decode) teacher-forced the same way,
          the common prefix of the argmax with them;
  answer: retrieval prompts: [context[-1]] + question, then 8 greedy tokens.
The reference (nll_full, the greedy tokens) is transformers' own full-precision DynamicCache on the
same model, so every delta is against the same numerics.
"""
import argparse
import copy
import json
import math
import os
import sys
import time


def tensor_bytes(t):
    """Bytes of a (possibly quanto) tensor: the sum over its inner plain tensors."""
    import torch
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    assert isinstance(t, torch.Tensor)
    return t.numel() * t.element_size()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--nbits", type=int, nargs="+", default=[4, 2])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--greedy-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=8)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        sys.exit(f"quanto_peer: {args.model_dir} has no config.json; scripts/install-deps.sh pyenv:vllm converts "
                 "the GGUF into build/models/smollm2-135m-hf")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache, QuantizedCache
    import optimum.quanto
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    work = json.load(open(args.workload))

    def forward(ids, cache):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        return out.logits[0].float()

    def greedy(cache, feed, n):
        toks = []
        while len(toks) < n:
            logits = forward(feed, cache)
            toks.append(int(logits[-1].argmax()))
            feed = [toks[-1]]
        return toks

    # Token text for the retrieval check: the tokenizer saved beside the model.
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.model_dir)

    results = {"peer_settings": {"backend": "quanto", "axis_key": 0, "axis_value": 0, "q_group_size": 64,
                                 "residual_length": 128, "attn_implementation": "sdpa", "dtype": "float32",
                                 "transformers": transformers.__version__, "optimum_quanto": optimum.quanto.__version__,
                                 "torch": torch.__version__, "threads": args.threads},
               "runs": {str(b): [] for b in args.nbits}}
    for p in work["prompts"]:
        ctx, cont, question = p["context"], p["continuation"], p["question"]
        t0 = time.time()
        full = DynamicCache(config=model.config)
        forward(ctx[:-1], full)
        snap_full = copy.deepcopy(full)
        ref = {}
        if cont:
            lp = torch.log_softmax(forward([ctx[-1]] + cont[:-1], full), dim=-1)
            ref["logp"] = lp
            ref["nll"] = float(-lp[torch.arange(len(cont)), torch.tensor(cont)].double().sum())
        g = greedy(copy.deepcopy(snap_full), [ctx[-1]] + question, args.greedy_tokens)
        for b in args.nbits:
            cache = QuantizedCache(backend="quanto", config=model.config, nbits=b)
            forward(ctx[:-1], cache)
            qbytes = sum(tensor_bytes(l._quantized_keys) + tensor_bytes(l._quantized_values) for l in cache.layers)
            elements = sum(l._quantized_keys.numel() + l._quantized_values.numel() for l in cache.layers)
            # Dequantize speed, one thread, per bf16-equivalent byte of output.
            torch.set_num_threads(1)
            layer = cache.layers[0]
            reps, td = 0, time.perf_counter()
            while reps < 3 or time.perf_counter() - td < 0.2:
                layer._quantized_keys.dequantize()
                layer._quantized_values.dequantize()
                reps += 1
            td = time.perf_counter() - td
            torch.set_num_threads(args.threads)
            l0 = layer._quantized_keys.numel() + layer._quantized_values.numel()
            snap = copy.deepcopy(cache)
            r = {"id": p["id"], "kind": p["kind"], "context_tokens": len(ctx), "bits_per_element": 8.0 * qbytes / elements,
                 "decode_gbps": 2.0 * l0 * reps / td / 1e9}
            if cont:
                lp = torch.log_softmax(forward([ctx[-1]] + cont[:-1], copy.deepcopy(snap)), dim=-1)
                r["scored"] = len(cont)
                r["nll"] = float(-lp[torch.arange(len(cont)), torch.tensor(cont)].double().sum())
                r["nll_full"] = ref["nll"]
                r["kl_sum"] = float((ref["logp"].exp() * (ref["logp"] - lp)).sum(dim=-1).clamp(min=0).double().sum())
            feed = [ctx[-1]] + question + g[:-1]
            logits = forward(feed, copy.deepcopy(snap))
            q = 1 + len(question)
            common = 0
            while common < len(g) and int(logits[q - 1 + common].argmax()) == g[common]:
                common += 1
            r["greedy_common"], r["greedy_tokens"] = common, len(g)
            if p["kind"] == "retrieval":
                ans = g[:args.answer_tokens] if common >= args.answer_tokens else \
                    greedy(copy.deepcopy(snap), [ctx[-1]] + question, args.answer_tokens)
                text = tok.decode(ans)
                r["answer_text"] = text
                r["retrieval_correct"] = int(p["answer"] in text)
                r["reference_correct"] = int(p["answer"] in tok.decode(g[:args.answer_tokens]))
            results["runs"][str(b)].append(r)
        print(f"quanto_peer: {p['id']} done in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    json.dump(results, sys.stdout)
    print()


if __name__ == "__main__":
    main()
