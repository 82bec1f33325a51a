"""Converts SmolLM2-135M-Instruct's GGUF (build/models, from `scripts/install-deps.sh models`) to
a Hugging Face safetensors directory in fp32 for vLLM, whose CPU backend cannot load GGUF.

Usage: convert-smollm2-hf.py GGUF_FILE OUT_DIR   (run by scripts/install-deps.sh pyenv:vllm)
transformers dequantizes Q4_1/Q8_0 to fp32 on load; tie_word_embeddings stays as the GGUF has it.
Nothing is fetched: the tokenizer comes from the GGUF too.
"""
import os
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: convert-smollm2-hf.py GGUF_FILE OUT_DIR")
    gguf, out = sys.argv[1:]
    if not os.path.isfile(gguf):
        sys.exit(f"convert-smollm2-hf: {gguf} not found; install it with scripts/install-deps.sh models")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    assert model.config.tie_word_embeddings, "SmolLM2's embeddings are tied"
    model.hf_quantizer = None  # the weights are fp32 now; save them as plain safetensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out + ".tmp"
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    os.rename(tmp, out)
    print(f"convert-smollm2-hf: {out} written")


if __name__ == "__main__":
    main()
