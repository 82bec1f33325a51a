"""Dequantization: every tensor of the GGUF file, as `flatkv model tensors`
writes it, equals the gguf package's gguf.quants.dequantize bit for bit
(compared as uint32 views); the first mismatch is named by tensor and index."""
import importlib.metadata
import json
import os
import sys
import tempfile

import numpy as np
import gguf

import refcommon


def main():
    a = refcommon.args()
    reader = gguf.GGUFReader(a.model)
    with tempfile.TemporaryDirectory(prefix="flatkv-dequant-") as out:
        with refcommon.Timer("flatkv model tensors"):
            refcommon.flatkv(a.flatkv, "model", "tensors", "--model", a.model, "--out", out)
        index = json.load(open(os.path.join(out, "index.json")))
        names = [t.name for t in reader.tensors]
        if [e["name"] for e in index] != names:
            sys.exit("index.json lists %d tensors in another order or with other names than the file's %d" %
                     (len(index), len(names)))
        by_type = {}
        bad = []
        with refcommon.Timer("gguf dequantize and compare"):
            for t, e in zip(reader.tensors, index):
                want = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
                got = np.fromfile(os.path.join(out, e["file"]), dtype=np.float32)
                type_name = t.tensor_type.name
                shape = [int(x) for x in t.shape]
                if e["shape"] != shape or e["type_id"] != int(t.tensor_type):
                    bad.append("%s: index.json says type %s shape %s, the file type %s shape %s" %
                               (t.name, e["type"], e["shape"], type_name, shape))
                    continue
                if got.size != want.size:
                    bad.append("%s: %d values, gguf gives %d" % (t.name, got.size, want.size))
                    continue
                diff = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
                if diff.size:
                    i = int(diff[0])
                    bad.append("%s (%s): %d of %d values differ; first at index %d: flatkv %r (0x%08x), gguf %r (0x%08x)" %
                               (t.name, type_name, diff.size, want.size, i, float(got[i]), int(got.view(np.uint32)[i]),
                                float(want[i]), int(want.view(np.uint32)[i])))
                    continue
                n, v = by_type.get(type_name, (0, 0))
                by_type[type_name] = (n + 1, v + want.size)
                os.remove(os.path.join(out, e["file"]))  # keep the temporary directory small
    for k, (n, v) in sorted(by_type.items()):
        print("%-5s %4d tensors, %11d values: bit-identical to gguf %s" % (k, n, v, importlib.metadata.version("gguf")))
    if bad:
        print("\n".join(bad))
        sys.exit("%d tensors differ from gguf.quants.dequantize" % len(bad))
    print("PASS: all %d tensors equal gguf.quants.dequantize bit for bit" % len(names))


if __name__ == "__main__":
    main()
