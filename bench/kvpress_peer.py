"""NVIDIA kvpress on the real-text workload, by the protocol of src/eval/protocol.h (docs/eval.md): the
peers `kvpress:<press>` of `flatkv bench attention --model`, which runs this script with
build/pyenv/kvpeers and reads its JSON from stdout.

Usage: kvpress_peer.py --model-dir DIR --workload FILE.json [--ratios 0.5 0.75] [--presses ...] [--threads 2]
  DIR: SmolLM2 as safetensors (build/models/smollm2-135m-hf); FILE: `flatkv workload --out` (token ids
  from the GGUF's own tokenizer, fed to transformers as they are).

The presses as kvpress 0.5.5 ships them, every setting at its default (kvpress/presses/*.py, the
dataclass fields): SnapKVPress(window_size=64, kernel_size=5), StreamingLLMPress(n_sink=4),
PyramidKVPress(window_size=64, kernel_size=5, beta=20), AdaKVPress(press, alpha_safeguard=0.20) over
SnapKV and over Expected Attention (kvpress's README pairs AdaKV with ExpectedAttentionPress),
ExpectedAttentionPress(n_future_positions=512, n_sink=4, use_covariance=True, use_vnorm=True),
TOVAPress(), KnormPress(); compression_ratio = the fraction of the context removed (0.5: 50% kept,
0.75: 25% kept). Attention: sdpa (no press here needs eager), the model in float32.

Compression as kvpress applies it: its presses are forward hooks on each attention layer that, in
the prefill pass only, replace that layer's cache by the compressed one *after* the layer's output
is computed, so every layer's input is the dense model's. This script therefore runs the dense
prefill of context[:-1] once per prompt and, at each layer, calls every press's own
`forward_hook` (BasePress.forward_hook: is_prefilling, extract_keys_and_values, compress, write
back) with that layer's real arguments on a cache of its own holding that layer's dense keys and
values; `post_init_from_model` and `rotary_emb` are set up as `press(model)` sets them. The result
is the cache `with press(model): model.model(context)` leaves (checked press by press, bit for
bit, by tests/kvpeers/test_kvpress_peer.py); one prefill instead of one per press and budget.
AdaKVPress masks rather than drops (module.masked_key_indices, honoured by kvpress's attention
patch at decode); each press's masks are kept and put back on the modules for its passes.

Then, per press and prompt (C context tokens), as kvpress's pipeline continues a compressed
context (generate_answer: explicit position_ids from the context length; _remove_answer_from_cache
between questions):
  ppl:    one pass over [context[-1]] + continuation[:-1] at positions C-1..: the log-probabilities
          of continuation (this pass's own KV is exact);
  greedy: the full cache's 64 greedy tokens teacher-forced the same way after [context[-1]] +
          question; the common prefix of the argmax with them;
  answer: retrieval prompts: [context[-1]] + question, then 8 greedy tokens.
The reference (nll_full, the greedy tokens) is transformers' own full DynamicCache on the same
model, so every delta is against the same numerics.
"""
import argparse
import json
import math
import os
import sys
import time

PRESSES = ["snapkv", "streaming_llm", "pyramidkv", "adakv_snapkv", "adakv_expected_attention",
           "expected_attention", "tova", "knorm"]


def make_press(name, ratio):
    import kvpress
    makers = {
        "snapkv": lambda: kvpress.SnapKVPress(compression_ratio=ratio),
        "streaming_llm": lambda: kvpress.StreamingLLMPress(compression_ratio=ratio),
        "pyramidkv": lambda: kvpress.PyramidKVPress(compression_ratio=ratio),
        "adakv_snapkv": lambda: kvpress.AdaKVPress(kvpress.SnapKVPress(compression_ratio=ratio)),
        "adakv_expected_attention": lambda: kvpress.AdaKVPress(kvpress.ExpectedAttentionPress(compression_ratio=ratio)),
        "expected_attention": lambda: kvpress.ExpectedAttentionPress(compression_ratio=ratio),
        "tova": lambda: kvpress.TOVAPress(compression_ratio=ratio),
        "knorm": lambda: kvpress.KnormPress(compression_ratio=ratio),
    }
    if name not in makers:
        sys.exit(f"kvpress_peer: unknown press '{name}' (known: {', '.join(PRESSES)})")
    return makers[name]()


def patch_mask_width():
    """PyramidKV leaves each layer a cache of its own length, but transformers builds one attention
    mask for all layers from layer 0's length, so a pass of several tokens over such a cache fails in
    sdpa (kvpress's own pipeline feeds its question in one pass too). The mask's extra or missing
    columns are all context columns, which every new token sees: crop (or pad) them on the left,
    per layer, before the attention function (wrapped as kvpress's attention_patch wraps it)."""
    import torch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    inner = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
        if attention_mask is not None and attention_mask.shape[-1] != key.shape[-2]:
            extra = attention_mask.shape[-1] - key.shape[-2]
            if extra > 0:
                attention_mask = attention_mask[..., extra:]
            else:
                visible = torch.ones(1, dtype=torch.bool) if attention_mask.dtype == torch.bool else \
                    torch.zeros(1, dtype=attention_mask.dtype)
                pad = visible.expand(*attention_mask.shape[:-1], -extra).to(attention_mask.device)
                attention_mask = torch.cat([pad, attention_mask], dim=-1)
        return inner(module, query, key, value, attention_mask, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS["sdpa"] = wrapper


class Runner:
    """The model, and the passes of the protocol over a cache whose first `base` positions hold the
    (possibly compressed) context[:-1]."""

    def __init__(self, model_dir, threads):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        self.model.eval()
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.layers = self.model.model.layers

    def forward(self, ids, cache, pos0):
        torch = self.torch
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True,
                             position_ids=torch.arange(pos0, pos0 + len(ids)).unsqueeze(0))
        return out.logits[0].float()

    @staticmethod
    def trim(cache, lengths):
        """kvpress's _remove_answer_from_cache: back to the compressed context."""
        for layer, n in zip(cache.layers, lengths):
            layer.keys = layer.keys[:, :, :n]
            layer.values = layer.values[:, :, :n]

    def compress(self, ctx, presses):
        """Dense prefill of ctx[:-1]; returns the dense cache and, per press name, (cache, masks)."""
        torch = self.torch
        from transformers import DynamicCache
        model = self.model
        out = {name: (DynamicCache(config=model.config), [None] * len(self.layers)) for name in presses}
        for press in presses.values():
            press.post_init_from_model(model)
        for layer in self.layers:  # as BasePress.__call__ does
            layer.self_attn.rotary_emb = model.model.rotary_emb

        def hook(module, args, kwargs, output):
            l = module.layer_idx
            dense_layer = kwargs["past_key_values"].layers[l]
            for name, press in presses.items():
                cache, masks = out[name]
                cache.update(dense_layer.keys.clone(), dense_layer.values.clone(), l)
                kw = dict(kwargs)
                kw["past_key_values"] = cache
                module.masked_key_indices = None
                press.forward_hook(module, args, kw, output)
                masks[l] = getattr(module, "masked_key_indices", None)
            module.masked_key_indices = None
            return output

        dense = DynamicCache(config=model.config)
        hooks = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in self.layers]
        try:
            with torch.no_grad():
                model.model(input_ids=torch.tensor([ctx[:-1]]), past_key_values=dense)
        finally:
            for h in hooks:
                h.remove()
        return dense, out

    def set_masks(self, masks):
        for layer, m in zip(self.layers, masks):
            layer.self_attn.masked_key_indices = m

    def greedy(self, cache, feed, pos0, n):
        toks = []
        while len(toks) < n:
            logits = self.forward(feed, cache, pos0)
            pos0 += len(feed)
            toks.append(int(logits[-1].argmax()))
            feed = [toks[-1]]
        return toks

    def measure(self, p, cache, ref, greedy_tokens, answer_tokens):
        """The protocol's passes on `cache` (context[:-1] in it); `ref` None measures the reference."""
        torch = self.torch
        ctx, cont, question = p["context"], p["continuation"], p["question"]
        C = len(ctx)
        lengths = [layer.keys.shape[2] for layer in cache.layers]
        r = {"id": p["id"], "kind": p["kind"], "context_tokens": C,
             "kept_entries": int(sum(lengths)) * cache.layers[0].keys.shape[1],
             "dense_entries": (C - 1) * len(lengths) * cache.layers[0].keys.shape[1]}
        if cont:
            lp = torch.log_softmax(self.forward([ctx[-1]] + cont[:-1], cache, C - 1), dim=-1)
            self.trim(cache, lengths)
            r["scored"] = len(cont)
            r["nll"] = float(-lp[torch.arange(len(cont)), torch.tensor(cont)].double().sum())
            r["filter_nll_context"] = float(-lp[torch.arange(1, len(cont)), torch.tensor(cont[1:])].double().sum())
            if ref is None:
                r["logp"] = lp
            else:
                r["nll_full"] = ref["nll"]
                r["kl_sum"] = float((ref["logp"].exp() * (ref["logp"] - lp)).sum(dim=-1).clamp(min=0).double().sum())
        if ref is None:
            g = self.greedy(cache, [ctx[-1]] + question, C - 1, greedy_tokens)
            self.trim(cache, lengths)
            r["greedy"] = g
        else:
            g = ref["greedy"]
            logits = self.forward([ctx[-1]] + question + g[:-1], cache, C - 1)
            self.trim(cache, lengths)
            q = 1 + len(question)
            common = 0
            while common < len(g) and int(logits[q - 1 + common].argmax()) == g[common]:
                common += 1
            r["greedy_common"], r["greedy_tokens"] = common, len(g)
        if p["kind"] == "retrieval":
            common = r.get("greedy_common", len(g))
            ans = g[:answer_tokens] if common >= answer_tokens else \
                self.greedy(cache, [ctx[-1]] + question, C - 1, answer_tokens)
            self.trim(cache, lengths)
            text = self.tok.decode(ans)
            r["answer_text"] = text
            r["retrieval_correct"] = int(p["answer"] in text)
        return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75])
    ap.add_argument("--presses", nargs="+", default=PRESSES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--greedy-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=8)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        sys.exit(f"kvpress_peer: {args.model_dir} has no config.json; scripts/install-deps.sh pyenv:vllm converts "
                 "the GGUF into build/models/smollm2-135m-hf")
    for r in args.ratios:
        if not 0 <= r < 1:
            sys.exit(f"kvpress_peer: --ratios {r}: a compression ratio is in [0, 1)")
    import torch
    import transformers
    import kvpress
    patch_mask_width()
    run = Runner(args.model_dir, args.threads)
    work = json.load(open(args.workload))
    keys = [(name, ratio) for ratio in args.ratios for name in args.presses]
    results = {"peer_settings": {"kvpress": getattr(kvpress, "__version__", "0.5.5"), "transformers": transformers.__version__,
                                 "torch": torch.__version__, "attn_implementation": "sdpa", "dtype": "float32",
                                 "threads": args.threads,
                                 "presses": {name: repr(make_press(name, 0.5)) for name in args.presses}},
               "reference": [], "runs": {f"{n}@{r}": [] for n, r in keys}}
    for p in work["prompts"]:
        t0 = time.time()
        presses = {f"{n}@{r}": make_press(n, r) for n, r in keys}
        dense, compressed = run.compress(p["context"], presses)
        t1 = time.time()
        ref = run.measure(p, dense, None, args.greedy_tokens, args.answer_tokens)
        results["reference"].append({k: v for k, v in ref.items() if k != "logp"})
        del dense
        for key in presses:
            cache, masks = compressed[key]
            run.set_masks(masks)
            try:
                r = run.measure(p, cache, ref, args.greedy_tokens, args.answer_tokens)
            finally:
                run.set_masks([None] * len(run.layers))
            if any(m is not None for m in masks):  # AdaKV: entries masked, not dropped
                r["kept_entries"] -= int(sum(len(m[0]) for m in masks if m is not None))
            results["runs"][key].append(r)
            compressed[key] = None
        print(f"kvpress_peer: {p['id']} ({len(p['context'])} tokens): prefill+compress {t1 - t0:.1f} s, "
              f"all {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    json.dump(results, sys.stdout)
    print()


if __name__ == "__main__":
    main()
