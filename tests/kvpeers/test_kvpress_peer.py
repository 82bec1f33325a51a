"""bench/kvpress_peer.py compresses a context the way `with press(model): model.model(context)` does:
for every press it runs, at both budgets, the cache it builds from one dense prefill (each press's own
forward_hook called per layer) equals, bit for bit, the cache kvpress's context manager leaves, and
AdaKV's masks are the same indices. Also: a pass over a PyramidKV cache (layers of different lengths)
gives the logits of feeding the same tokens one at a time (the mask-width patch is exact).

Usage: test_kvpress_peer.py MODEL_DIR   (build/models/smollm2-135m-hf; run with build/pyenv/kvpeers)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import kvpress_peer as kp  # noqa: E402


def main():
    model_dir = sys.argv[1]
    import torch
    from transformers import DynamicCache
    kp.patch_mask_width()
    run = kp.Runner(model_dir, 2)
    text = open("/usr/lib/python3.11/argparse.py").read()
    ctx = run.tok(text).input_ids[:200]
    failures = []
    for ratio in (0.5, 0.75):
        presses = {n: kp.make_press(n, ratio) for n in kp.PRESSES}
        _, ours = run.compress(ctx, presses)
        for name in kp.PRESSES:
            press = kp.make_press(name, ratio)
            cache = DynamicCache(config=run.model.config)
            with torch.no_grad(), press(run.model):
                run.model.model(input_ids=torch.tensor([ctx[:-1]]), past_key_values=cache)
            masks = [getattr(layer.self_attn, "masked_key_indices", None) for layer in run.layers]
            run.set_masks([None] * len(run.layers))
            mine, my_masks = ours[name]
            for l, (a, b) in enumerate(zip(cache.layers, mine.layers)):
                if a.keys.shape != b.keys.shape or not torch.equal(a.keys, b.keys) or not torch.equal(a.values, b.values):
                    failures.append(f"{name}@{ratio}: layer {l} cache differs ({tuple(a.keys.shape)} vs {tuple(b.keys.shape)})")
                    break
            for l, (a, b) in enumerate(zip(masks, my_masks)):
                if (a is None) != (b is None) or (a is not None and not all(torch.equal(x, y) for x, y in zip(a, b))):
                    failures.append(f"{name}@{ratio}: layer {l} AdaKV masks differ")
                    break
            kept = sum(layer.keys.shape[2] for layer in mine.layers) / (len(mine.layers) * (len(ctx) - 1))
            if name not in ("adakv_snapkv", "adakv_expected_attention") and abs(kept - (1 - ratio)) > 0.02:
                failures.append(f"{name}@{ratio}: kept {kept:.3f} of the context, expected {1 - ratio}")
    # The mask-width patch: a PyramidKV cache, one pass of 8 tokens against 8 single-token steps.
    _, out = run.compress(ctx, {"p": kp.make_press("pyramidkv", 0.5)})
    cache = out["p"][0]
    lengths = [layer.keys.shape[2] for layer in cache.layers]
    if len(set(lengths)) == 1:
        failures.append("pyramidkv left every layer the same length: the mask patch is not exercised")
    feed = ctx[-1:] + run.tok("def main():\n    pass").input_ids[:7]
    one = run.forward(feed, cache, len(ctx) - 1)
    run.trim(cache, lengths)
    steps = torch.cat([run.forward([t], cache, len(ctx) - 1 + i) for i, t in enumerate(feed)])
    err = float((one - steps).abs().max())
    if err > 1e-3:
        failures.append(f"pyramidkv: one pass vs steps differ by {err}")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"ok: {len(kp.PRESSES)} presses x 2 budgets equal kvpress's own context manager; "
          f"pyramid pass vs steps max |diff| {err:.2e}")


if __name__ == "__main__":
    main()
