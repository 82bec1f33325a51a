"""Content fingerprints of model and adapter files, for key namespaces (docs/format_keys.md).

flatkv keeps KV across restarts and shares it between processes and nodes, so a namespace must
change whenever the weights that computed the KV change, including a checkpoint rewritten in
place under the same name or an adapter re-pointed under the same LoRA name. Reading every byte
of a 140 GB checkpoint at start is not an option, so a file's fingerprint is its size, its
header (a safetensors file's JSON header names every tensor, dtype, shape and offset) and a
fixed set of sampled pages of its data (the first and last 64 KiB, and 4 KiB at 62 evenly
spaced offsets between): retraining changes essentially every weight, so it changes the
samples. Deterministic across copies, machines and mtimes (a copied checkpoint shares its KV).
No library beyond the standard one: the vLLM and SGLang integrations both use it.
"""
from __future__ import annotations

import hashlib
import os
import struct

# Files whose content computes KV (weights, and the config and tokenizer that shape them).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")
_CONFIG_NAMES = ("config.json", "adapter_config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "params.json")
_EDGE_BYTES = 64 << 10
_SAMPLE_BYTES = 4 << 10
_SAMPLES = 62


def _file_digest(path: str, h) -> None:
    size = os.path.getsize(path)
    h.update(struct.pack("<Q", size))
    with open(path, "rb") as f:
        if os.path.basename(path) in _CONFIG_NAMES or size <= 2 * _EDGE_BYTES + _SAMPLES * _SAMPLE_BYTES:
            h.update(f.read())  # small files whole
            return
        start = 0
        if path.endswith(".safetensors"):  # u64 LE header length, then the JSON header
            (n,) = struct.unpack("<Q", f.read(8))
            if 8 + n <= size:
                h.update(f.read(n))
                start = 8 + n
        f.seek(start)
        h.update(f.read(_EDGE_BYTES))
        span = size - start - 2 * _EDGE_BYTES
        for i in range(_SAMPLES):
            f.seek(start + _EDGE_BYTES + (span * (2 * i + 1)) // (2 * _SAMPLES))
            h.update(f.read(_SAMPLE_BYTES))
        f.seek(size - _EDGE_BYTES)
        h.update(f.read(_EDGE_BYTES))


def content_fingerprint(path: str) -> str:
    """A hex digest of the KV-relevant files at `path` (a directory of a checkpoint or an
    adapter, or one file such as a GGUF): their names, sizes, headers and sampled pages.
    Raises FileNotFoundError when `path` does not exist and ValueError when it holds no weights."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory (a model or adapter to fingerprint)")
    h = hashlib.sha256(b"flatkv-content-v1")
    if os.path.isfile(path):
        files = [path]
        base = os.path.dirname(path)
    else:
        base = path
        files = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for n in sorted(names):
                if n.endswith(_WEIGHT_SUFFIXES) or n in _CONFIG_NAMES:
                    files.append(os.path.join(root, n))
        if not any(f.endswith(_WEIGHT_SUFFIXES) for f in files):
            raise ValueError(f"{path}: no weight files ({', '.join(_WEIGHT_SUFFIXES)}) to fingerprint")
    for f in files:
        name = os.path.relpath(f, base).encode()
        h.update(struct.pack("<Q", len(name)) + name)
        _file_digest(f, h)
    return h.hexdigest()[:32]
