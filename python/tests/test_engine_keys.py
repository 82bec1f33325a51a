"""Engine keys (docs/format_keys.md, "Engine keys") and content fingerprints (flatkv.identity)."""
import hashlib
import os
import shutil
import struct

import numpy as np
import pytest

import flatkv
from flatkv.identity import content_fingerprint


def _sha_key(seed, data):
    d = hashlib.sha256(struct.pack("<Q", seed) + data).digest()
    return struct.unpack("<QQ", d[:16])


def test_engine_keys_follow_the_format():
    ns = flatkv.Namespace(model_fingerprint="m", hash="sha256")
    hashes = [bytes(range(32)), bytes(range(1, 33))]
    keys = ns.engine_keys(hashes)
    assert keys.shape == (2, 2) and keys.dtype == np.uint64
    lo, hi = (int(x) for x in ns.digest[0])
    for i, h in enumerate(hashes):  # H("flatkv-engine-v1" || ns || u64 len || hash)
        want = _sha_key(flatkv.DEFAULT_HASH_SEED, b"flatkv-engine-v1" + struct.pack("<QQQ", lo, hi, 32) + h)
        assert tuple(int(x) for x in keys[i]) == want
    # The same hashes as a 2-D uint8 array; another namespace gives other keys.
    assert np.array_equal(keys, ns.engine_keys(np.frombuffer(b"".join(hashes), np.uint8).reshape(2, 32)))
    other = flatkv.Namespace(model_fingerprint="m|tp=1/2", hash="sha256")
    assert not np.array_equal(keys, other.engine_keys(hashes))
    assert ns.engine_keys([]).shape == (0, 2)


def test_engine_keys_refuse_what_is_not_a_hash_list():
    ns = flatkv.Namespace(model_fingerprint="m")
    with pytest.raises(ValueError, match="engine hash 1 has 31 bytes, the first had 32"):
        ns.engine_keys([bytes(32), bytes(31)])
    with pytest.raises(TypeError, match="engine hash 0 is int, not bytes"):
        ns.engine_keys([5])


def test_content_fingerprint_follows_the_weights_not_the_copy(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 8}')
    header = b'{"w": {"dtype": "F32", "shape": [262144], "data_offsets": [0, 1048576]}}'
    body = np.random.default_rng(0).bytes(1 << 20)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + body)
    fp = content_fingerprint(str(d))
    copy = tmp_path / "copy"
    shutil.copytree(d, copy)
    os.utime(copy / "model.safetensors", (1, 1))
    assert content_fingerprint(str(copy)) == fp  # same content: same namespace, whatever the path and mtime
    # Retrained in place: the same sizes and header, other weights.
    (copy / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header
                                             + np.random.default_rng(1).bytes(1 << 20))
    assert content_fingerprint(str(copy)) != fp
    with pytest.raises(FileNotFoundError):
        content_fingerprint(str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no weight files"):
        content_fingerprint(str(tmp_path / "empty"))
