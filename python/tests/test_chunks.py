"""Chunk reuse from Python: position-independent chunk keys, chunk KV put
and found anywhere, restored with keys re-rotated to new positions."""
import numpy as np
import pytest

import flatkv
from conftest import BLOCK_TOKENS, SHAPE

HEADS, HEAD_DIM = SHAPE["kv_heads"], SHAPE["head_dim"]


def chunk_rows(n, seed):
    """A chunk's KV in chunk rows: (layers, K/V, n tokens, heads * head_dim) f16."""
    rng = np.random.default_rng(seed)
    return rng.uniform(-2, 2, size=(SHAPE["layers"], 2, n, HEADS * HEAD_DIM)).astype(np.float16)


def neox_reference(k, positions, theta):
    """Hugging Face's rotate_half RoPE in float64: x * cos + rotate_half(x) * sin."""
    k = k.astype(np.float64).reshape(len(positions), HEADS, HEAD_DIM)
    half = HEAD_DIM // 2
    inv_freq = theta ** (-np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rotated = np.concatenate([-k[..., half:], k[..., :half]], axis=-1)
    return (k * cos + rotated * sin).reshape(len(positions), HEADS * HEAD_DIM)


def test_chunk_keys_are_position_independent(ns):
    doc = np.arange(200, 240)
    keys = ns.chunk_keys(doc, BLOCK_TOKENS)
    assert keys.shape == (3, 2)  # 16 + 16 + a partial block of 8, which gets a key too
    assert not np.array_equal(keys[:2], ns.keys(doc, BLOCK_TOKENS))  # never a prefix chain key
    assert flatkv.chunk_session(keys[0]) == int(keys[0][0]) | (1 << 63)
    with pytest.raises(flatkv.Error, match="empty") as e:
        ns.chunk_keys([], BLOCK_TOKENS)
    assert e.value.code == "InvalidArgument"


def test_put_lookup_and_restore_at_new_positions(store, ns):
    assert store.token_layer_bytes == 2 * HEADS * HEAD_DIM * 2
    doc = np.arange(300, 337)  # 37 tokens: a partial last block
    rows = chunk_rows(len(doc), seed=3)
    store.put_chunk(ns, doc, rows)
    # Found behind any prefix, in any prompt; the rest is not.
    prompt = np.concatenate([np.arange(1, 11), doc, np.arange(500, 520)])
    assert store.lookup_chunks(ns, prompt, [(10, 37), (47, 20), (0, 10)]) == [37, 0, 0]
    other = flatkv.Namespace(model_fingerprint="pytest-model", tenant="t2")
    assert store.lookup_chunks(other, prompt, [(10, 37)]) == [0]

    out = np.zeros_like(rows)
    assert store.restore_chunk(ns, doc, out) == 37  # no rope: as stored, K before RoPE
    assert np.array_equal(out, rows)

    rope = flatkv.Rope(theta=500000.0, style="neox")
    assert store.restore_chunk(ns, doc, out, pos0=10, rope=rope) == 37
    positions = np.arange(10, 47)
    for layer in range(SHAPE["layers"]):
        np.testing.assert_allclose(out[layer, 0].astype(np.float64), neox_reference(rows[layer, 0], positions, 500000.0),
                                   rtol=2e-3, atol=2e-3)
        assert np.array_equal(out[layer, 1], rows[layer, 1])  # V as stored

    store.drop_session(flatkv.chunk_session(ns.chunk_keys(doc, BLOCK_TOKENS)[0]))
    assert store.lookup_chunks(ns, prompt, [(10, 37)]) == [0]


def test_chunk_errors_name_the_argument(store, ns):
    doc = np.arange(20)
    rows = chunk_rows(20, seed=4)
    with pytest.raises(flatkv.Error, match="bytes, a chunk of 20 tokens takes"):
        store.put_chunk(ns, doc, np.ascontiguousarray(rows[:, :, :10]))
    store.put_chunk(ns, doc, rows)
    with pytest.raises(ValueError, match="style must be one of"):
        flatkv.Rope(style="gptj")
    with pytest.raises(flatkv.Error, match="rope.rotary_dim is 5"):
        store.restore_chunk(ns, doc, np.zeros_like(rows), rope=flatkv.Rope(rotary_dim=5))
    with pytest.raises(flatkv.Error, match="needs"):
        store.restore_chunk(ns, doc, np.zeros((1, 2), dtype=np.float16))
    with pytest.raises(flatkv.Error, match="chunk 0 is tokens"):
        store.lookup_chunks(ns, doc, [(15, 10)])
    with pytest.raises(TypeError, match="pair"):
        store.lookup_chunks(ns, doc, [5])
    # What was stored is still there.
    assert store.lookup_chunks(ns, doc, [(0, 20)]) == [20]
