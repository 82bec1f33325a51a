"""Forward pass, greedy text and llama.cpp agreement on real text.

Prompts: 8 of PROMPT_TOKENS tokens, the opening of 8 standard-library files of
stdlib_texts.sha256 as llama.cpp tokenizes them.

  forward   teacher-forced logits of every prompt position, `flatkv model
            score`, against transformers loading the same GGUF in fp32 with
            eager attention on the CPU: max |diff| <= TOL per prompt.
  greedy    GREEDY_STEPS tokens of `flatkv model greedy` against transformers'
            greedy argmax: identical up to the first divergence, which passes
            only where transformers' two top logits are within TOL. Along the
            shared prefix transformers' greedy tokens are the argmaxes of one
            teacher-forced pass over the prompt and flatkv's tokens (what its
            step-by-step loop computes, without 128 sequential calls); after a
            divergence its own loop with its KV cache continues to
            GREEDY_STEPS. Then logits continue teacher-forced on transformers'
            tokens: the prompt plus its first GREEDY_STEPS - 1 tokens are
            scored once by each side (causal: the prompt positions of that one
            pass are the forward check's), and every step's max |diff| is
            reported and asserted <= TOL.
  llama.cpp greedy tokens of llama.cpp (which quantizes activations) on the
            same prompts: agreement with transformers' tokens, reported only.
"""
import json
import os
import sys
import tempfile

import numpy as np

import refcommon

PROMPTS = 8
PROMPT_TOKENS = 512
GREEDY_STEPS = 128
TOL = 1e-3
THREADS = int(os.environ.get("FLATKV_REF_THREADS", "2"))
# A quicker look while developing: FLATKV_REF_PROMPTS=2 checks the first 2
# prompts only, and says so; the ctest run uses all 8.
RUN_PROMPTS = int(os.environ.get("FLATKV_REF_PROMPTS", str(PROMPTS)))
# Preferred files (varied: prose with Unicode, tables of digits and names,
# code); others from the list fill in when one is skipped.
PREFERRED = ["pydoc_data/topics.py", "re/_casefix.py", "html/entities.py", "locale.py", "textwrap.py",
             "email/_header_value_parser.py", "stringprep.py", "datetime.py"]


def main():
    a = refcommon.args()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    torch.set_num_threads(THREADS)
    if RUN_PROMPTS != PROMPTS:
        print("REDUCED RUN: FLATKV_REF_PROMPTS=%d checks %d of the %d prompts" % (RUN_PROMPTS, RUN_PROMPTS, PROMPTS))

    texts = dict(refcommon.stdlib_texts())
    vocab = refcommon.llama_vocab(a.model)
    order = [r for r in PREFERRED if r in texts] + [r for r in texts if r not in PREFERRED]
    prompts = []
    for rel in order:
        ids = vocab.tokenize(texts[rel], add_bos=False, special=False)
        if len(ids) >= PROMPT_TOKENS:
            prompts.append((rel, ids[:PROMPT_TOKENS]))
        if len(prompts) == PROMPTS:
            break
    if len(prompts) < PROMPTS:
        sys.exit("only %d listed files have %d tokens" % (len(prompts), PROMPT_TOKENS))
    del vocab
    prompts = prompts[:RUN_PROMPTS]
    assert PROMPT_TOKENS + GREEDY_STEPS <= 8192

    with refcommon.Timer("transformers load (fp32, eager)"):
        hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(a.model)),
                                                  gguf_file=os.path.basename(a.model), dtype=torch.float32,
                                                  attn_implementation="eager")
        hf.eval()
    vocab_size = hf.config.vocab_size

    failures = []
    summary = []
    with tempfile.TemporaryDirectory(prefix="flatkv-forward-") as tmp, torch.no_grad():
        ids_path, logits_path = os.path.join(tmp, "ids.json"), os.path.join(tmp, "logits.f32")
        hf_greedy = []
        for k, (rel, prompt) in enumerate(prompts):
            print("prompt %d: %s, first %d tokens" % (k, rel, PROMPT_TOKENS), flush=True)
            # flatkv's greedy continuation.
            refcommon.write_ids(ids_path, prompt)
            with refcommon.Timer("flatkv model greedy %d steps" % GREEDY_STEPS):
                g = json.loads(refcommon.flatkv(a.flatkv, "model", "greedy", "--model", a.model, "--tokens-file",
                                                ids_path, "--steps", str(GREEDY_STEPS), "--ignore-eos", "--json"))
            ours = g["tokens"]
            print("  flatkv greedy: prefill %.0f ms, decode %.0f ms (%.1f tok/s)" %
                  (g["prefill_ms"], g["decode_ms"], (GREEDY_STEPS - 1) / max(g["decode_ms"], 1e-9) * 1e3))
            if len(ours) != GREEDY_STEPS:
                sys.exit("prompt %d: flatkv model greedy gave %d tokens, not %d" % (k, len(ours), GREEDY_STEPS))

            # transformers' greedy tokens. Along a prefix both sides share,
            # its greedy loop's token at step s is the argmax of its logits
            # at position P-1+s given that prefix, so one teacher-forced pass
            # over the prompt and flatkv's tokens gives transformers' tokens
            # up to the first divergence (and its top two logits there).
            # After a divergence transformers' own loop continues, with its
            # KV cache, and its tokens are scored again.
            seq = prompt + ours[:GREEDY_STEPS - 1]
            with refcommon.Timer("transformers forward %d tokens" % len(seq)):
                want = hf(input_ids=torch.tensor([seq])).logits[0].float()
            steps_logits = want[PROMPT_TOKENS - 1:]
            top = torch.topk(steps_logits, 2, dim=1)
            argmax = top.indices[:, 0].tolist()
            d = next((s for s in range(GREEDY_STEPS) if argmax[s] != ours[s]), None)
            if d is None:
                tokens = list(ours)
                greedy = "identical %d/%d" % (GREEDY_STEPS, GREEDY_STEPS)
            else:
                gap = float(top.values[d, 0] - top.values[d, 1])
                greedy = "identical up to step %d, where transformers' top two logits are %.2e apart" % (d, gap)
                if gap > TOL:
                    failures.append("prompt %d: greedy tokens diverge at step %d (flatkv %d, transformers %d) where "
                                    "transformers' top two logits are %.2e apart (> %g)" %
                                    (k, d, ours[d], argmax[d], gap, TOL))
                tokens = ours[:d] + [argmax[d]]
                with refcommon.Timer("transformers greedy loop, steps %d..%d" % (d + 1, GREEDY_STEPS - 1)):
                    out = hf(input_ids=torch.tensor([prompt + tokens]), use_cache=True)
                    while len(tokens) < GREEDY_STEPS:
                        tokens.append(int(out.logits[0, -1].argmax()))
                        if len(tokens) < GREEDY_STEPS:
                            out = hf(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values,
                                     use_cache=True)
                seq = prompt + tokens[:GREEDY_STEPS - 1]
                with refcommon.Timer("transformers forward %d tokens" % len(seq)):
                    want = hf(input_ids=torch.tensor([seq])).logits[0].float()
            print("  greedy: " + greedy)
            hf_greedy.append(tokens)

            # flatkv's teacher-forced logits over the same tokens.
            refcommon.write_ids(ids_path, seq)
            with refcommon.Timer("flatkv model score %d tokens" % len(seq)):
                refcommon.flatkv(a.flatkv, "model", "score", "--model", a.model, "--tokens-file", ids_path,
                                 "--out", logits_path)
            got = np.fromfile(logits_path, dtype=np.float32).reshape(len(seq), vocab_size)
            want = want.numpy()
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max(axis=1)
            fwd = float(diff[:PROMPT_TOKENS].max())
            steps = diff[PROMPT_TOKENS - 1:]
            print("  forward: max |logit diff| %.3e over %d prompt positions (at position %d)" %
                  (fwd, PROMPT_TOKENS, int(diff[:PROMPT_TOKENS].argmax())))
            print("  teacher-forced steps 0..%d max |diff|:" % (GREEDY_STEPS - 1))
            for r in range(0, len(steps), 16):
                print("    " + " ".join("%.1e" % v for v in steps[r:r + 16]))
            if fwd > TOL:
                failures.append("prompt %d: forward max |logit diff| %.3e > %g" % (k, fwd, TOL))
            if steps.max() > TOL:
                failures.append("prompt %d: teacher-forced step %d max |logit diff| %.3e > %g" %
                                (k, int(steps.argmax()), float(steps.max()), TOL))
            summary.append((rel, fwd, float(steps.max()), greedy))
            sys.stdout.flush()

        # llama.cpp's greedy tokens: reported, not asserted.
        import llama_cpp
        llm = llama_cpp.Llama(a.model, n_ctx=PROMPT_TOKENS + GREEDY_STEPS, n_batch=PROMPT_TOKENS,
                              n_threads=THREADS, verbose=False)
        agreement = []
        with refcommon.Timer("llama.cpp greedy, %d prompts" % len(prompts)):
            for k, (rel, prompt) in enumerate(prompts):
                llm.reset()
                llm.eval(prompt)
                toks = []
                for s in range(GREEDY_STEPS):
                    # The last evaluated token's logits (llama_get_logits_ith(ctx, -1)):
                    # without logits_all, llama-cpp-python keeps no scores of its own.
                    last = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(vocab_size,))
                    toks.append(int(np.argmax(last)))
                    if s + 1 < GREEDY_STEPS:
                        llm.eval([toks[-1]])
                ref = hf_greedy[k]
                same = sum(1 for x, y in zip(toks, ref) if x == y)
                prefix = next((s for s in range(GREEDY_STEPS) if toks[s] != ref[s]), GREEDY_STEPS)
                agreement.append(same / GREEDY_STEPS)
                print("llama.cpp prompt %d: %d/%d greedy tokens agree with transformers' (%.3f); identical for the "
                      "first %d" % (k, same, GREEDY_STEPS, same / GREEDY_STEPS, prefix))

    print("\nsummary (tolerance %g):" % TOL)
    for k, (rel, fwd, st, greedy) in enumerate(summary):
        print("  %d %-30s forward %.2e  steps %.2e  greedy %s  llama.cpp agreement %.3f" %
              (k, rel, fwd, st, greedy, agreement[k]))
    if failures:
        print("\n".join(failures))
        sys.exit("%d checks failed" % len(failures))
    print("PASS: forward and teacher-forced logits within %g of transformers on %d prompts; greedy tokens agree" %
          (TOL, len(prompts)))


if __name__ == "__main__":
    main()
