"""Shared parts of the SmolLM2 reference checks (docs/models.md).

Every check drives the `flatkv model` commands of the build under test and
compares their output with an outside reference: the gguf package, llama.cpp
(llama-cpp-python) or transformers.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

STDLIB = "/usr/lib/python3.11"
HERE = os.path.dirname(os.path.abspath(__file__))


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--flatkv", required=True, help="the flatkv binary under test")
    p.add_argument("--model", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    return p.parse_args()


def flatkv(binary, *argv, capture=True):
    """Runs `flatkv ARGV...`; fails the check with its stderr when it fails."""
    r = subprocess.run([binary, *argv], capture_output=capture)
    if r.returncode != 0:
        sys.exit("flatkv %s failed (exit %d): %s" % (" ".join(argv), r.returncode,
                                                      r.stderr.decode(errors="replace").strip()))
    return r.stdout


def stdlib_texts(minimum_fraction=0.75):
    """The listed standard-library files whose SHA-256 matches, as (path, bytes).

    A file missing or with another SHA-256 is skipped and named, never
    replaced; fewer than `minimum_fraction` of the list remaining fails."""
    listed, kept = [], []
    with open(os.path.join(HERE, "stdlib_texts.sha256")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            digest, rel = line.split(None, 1)
            listed.append((digest, rel.strip()))
    for digest, rel in listed:
        path = os.path.join(STDLIB, rel)
        try:
            data = open(path, "rb").read()
        except OSError as e:
            print("SKIPPED %s: %s" % (path, e.strerror))
            continue
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            print("SKIPPED %s: SHA-256 %s, the list says %s" % (path, got, digest))
            continue
        kept.append((rel, data))
    if len(kept) < minimum_fraction * len(listed):
        sys.exit("only %d of %d listed files remain (need %.0f%%): see SKIPPED above" %
                 (len(kept), len(listed), 100 * minimum_fraction))
    print("texts: %d of %d listed files of %s" % (len(kept), len(listed), STDLIB))
    return kept


def llama_vocab(model):
    import llama_cpp
    return llama_cpp.Llama(model, vocab_only=True, verbose=False)


class Timer:
    def __init__(self, what):
        self.what = what

    def __enter__(self):
        self.t = time.time()
        return self

    def __exit__(self, *exc):
        print("time: %s %.1f s" % (self.what, time.time() - self.t))
        sys.stdout.flush()


def write_ids(path, ids):
    with open(path, "w") as f:
        json.dump([int(i) for i in ids], f)
