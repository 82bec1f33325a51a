"""The flatkv module on an embedded store: round trips, restart, errors."""
import threading

import numpy as np
import pytest

import flatkv
from conftest import BLOCK_TOKENS, SHAPE, open_store, payload


def test_keys(ns):
    tokens = np.arange(100, 150, dtype=np.int64)
    keys = ns.keys(tokens, BLOCK_TOKENS)
    assert keys.shape == (3, 2) and keys.dtype == np.uint64  # the partial 4th block has no key
    assert np.array_equal(keys, ns.keys(list(range(100, 150)), BLOCK_TOKENS))
    other = flatkv.Namespace(model_fingerprint="pytest-model", tenant="t2")
    assert not np.array_equal(keys, other.keys(tokens, BLOCK_TOKENS))
    # Chaining on from a parent continues the chain.
    tail = ns.keys(tokens[16:48], BLOCK_TOKENS, parent=keys[0])
    assert np.array_equal(tail, keys[1:3])
    assert ns.digest.shape == (1, 2)
    with pytest.raises(ValueError, match="outside 0..2"):
        ns.keys([1, -2, 3], BLOCK_TOKENS)
    with pytest.raises(ValueError, match="hash must be"):
        flatkv.Namespace(hash="md5")


def test_round_trip(store, ns):
    assert (store.layers, store.block_tokens, store.block_layer_bytes, store.block_bytes) == (3, 16, 2048, 6144)
    assert store.dtype == SHAPE["dtype"]
    keys = ns.keys(np.arange(7 * BLOCK_TOKENS), BLOCK_TOKENS)
    data = payload(6, store.block_bytes, seed=1)
    assert store.match(keys) == 0
    store.put(1, keys[:6], data)
    assert store.match(keys) == 6

    out = np.zeros((7, store.block_bytes), dtype=np.uint8)
    assert store.restore(keys, out) == 6
    assert np.array_equal(out[:6], data)
    assert not out[6].any()  # past the stored prefix: untouched

    # Layer-major: [layer][block] slices, each layer contiguous.
    lm = np.zeros((store.layers, 6, store.block_layer_bytes), dtype=np.uint8)
    assert store.restore(keys[:6], lm, layout="layer") == 6
    for layer in range(store.layers):
        lb = store.block_layer_bytes
        assert np.array_equal(lm[layer], data[:, layer * lb:(layer + 1) * lb])

    # Bytes in, bytearray out.
    store.put(2, keys[6:7], payload(1, store.block_bytes, 2).tobytes())
    ba = bytearray(7 * store.block_bytes)
    assert store.restore(keys, ba) == 7
    assert bytes(ba[:6 * store.block_bytes]) == data.tobytes()

    stats = store.stats()
    assert stats["put_blocks"] == 7
    assert stats["ssd"]["blocks"] == 7  # every block has its SSD home
    assert stats["dram"]["blocks"] <= 7  # and at most one DRAM copy

    store.drop_session(2)
    assert store.match(keys) == 6


def test_restore_layer_by_layer(store, ns):
    keys = ns.keys(np.arange(4 * BLOCK_TOKENS), BLOCK_TOKENS)
    data = payload(4, store.block_bytes, seed=3)
    store.put(5, keys, data)
    lb = store.block_layer_bytes
    with store.restore_start(keys) as r:
        assert r.hit_blocks == 4
        for layer in range(store.layers):
            assert r.wait_layer(layer) == 4
            got = np.frombuffer(r.layer_data(layer), dtype=np.uint8).reshape(4, lb)
            assert np.array_equal(got, data[:, layer * lb:(layer + 1) * lb])
            assert np.array_equal(np.frombuffer(r.layer_view(layer), np.uint8).reshape(4, lb), got)
            r.release_layer(layer)
            with pytest.raises(ValueError, match="already released"):
                r.layer_data(layer)
        assert r.finish() == 4

    out = np.zeros((4, store.block_bytes), dtype=np.uint8)
    r = store.restore_start(keys, out=out)
    for layer in range(store.layers):
        assert r.wait_layer(layer) == 4
        assert np.array_equal(out[:, layer * lb:(layer + 1) * lb], data[:, layer * lb:(layer + 1) * lb])
        r.release_layer(layer)
    assert r.finish() == 4
    r.close()
    with pytest.raises(ValueError, match="closed"):
        r.finish()


def test_restart_warm_from_ssd(tmp_path, ns):
    keys = ns.keys(np.arange(5 * BLOCK_TOKENS), BLOCK_TOKENS)
    with open_store(tmp_path / "ssd", dram_bytes=0) as s:  # SSD only
        data = payload(5, s.block_bytes, seed=4)
        s.put(9, keys, data, one_shot=True)
    with open_store(tmp_path / "ssd", dram_bytes=0) as s:
        assert s.stats()["recovered_blocks"] == 5
        assert s.match(keys) == 5
        out = np.empty_like(data)
        assert s.restore(keys, out) == 5
        assert np.array_equal(out, data)


def test_errors_carry_the_c_message(store, ns, tmp_path):
    keys = ns.keys(np.arange(2 * BLOCK_TOKENS), BLOCK_TOKENS)
    with pytest.raises(flatkv.Error, match="expected 2 blocks x 6144 bytes") as e:
        store.put(1, keys, b"short")
    assert e.value.code == "InvalidArgument"
    with pytest.raises(flatkv.Error, match="need 2 x 6144"):
        store.restore(keys, np.zeros(100, dtype=np.uint8))
    with pytest.raises(TypeError, match="writable"):
        store.restore(keys, bytes(2 * store.block_bytes))
    with pytest.raises(TypeError, match="C-contiguous"):
        store.put(1, keys, np.zeros((store.block_bytes, 2), dtype=np.uint8).T)
    with pytest.raises(ValueError, match="shape"):
        store.match(np.zeros((2, 3), dtype=np.uint64))
    with pytest.raises(ValueError, match="layout"):
        store.restore(keys, np.zeros((2, store.block_bytes), np.uint8), layout="diagonal")
    with pytest.raises(flatkv.Error, match="unknown shape preset 'gpt-17'") as e:
        flatkv.Store("gpt-17")
    assert e.value.code == "InvalidArgument"
    with pytest.raises(flatkv.Error, match="block_tokens 8"):
        flatkv.Store(SHAPE, block_tokens=8)
    with pytest.raises(flatkv.Error, match="session 42"):
        store.drop_session(42)
    with pytest.raises(flatkv.Error, match="neither unix"):
        flatkv.Store.connect("http://example")
    store.close()
    with pytest.raises(flatkv.Error, match="closed") as e:
        store.put(1, keys, np.zeros((2, 6144), np.uint8))
    assert e.value.code == "FailedPrecondition"


def test_threads_release_the_gil(store, ns):
    """Concurrent puts and restores from threads; each checks its own bytes."""
    errors = []

    def worker(i):
        try:
            keys = ns.keys(np.arange(3 * BLOCK_TOKENS) + 10000 * (i + 1), BLOCK_TOKENS)
            data = payload(3, store.block_bytes, seed=100 + i)
            store.put(100 + i, keys, data)
            out = np.zeros_like(data)
            for _ in range(5):
                assert store.restore(keys, out) == 3
                assert np.array_equal(out, data)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_prefetch_brings_ssd_blocks_into_dram(tmp_path, ns):
    import time
    s = open_store(tmp_path / "ssd", dram_bytes=1 << 20)
    keys = ns.keys(np.arange(4 * BLOCK_TOKENS), BLOCK_TOKENS)
    data = payload(4, s.block_bytes, seed=5)
    s.put(7, keys, data, hint="one-shot")  # SSD homes only
    assert s.stats()["dram"]["blocks"] == 0
    assert s.prefetch(keys) == 4
    for _ in range(500):
        if s.stats()["readmitted_blocks"] == 4:
            break
        time.sleep(0.01)
    assert s.stats()["readmitted_blocks"] == 4 and s.stats()["prefetches"] == 1
    out = np.zeros_like(data)
    ssd_hits = s.stats()["ssd"]["hit_blocks"]
    assert s.restore(keys, out) == 4 and np.array_equal(out, data)
    assert s.stats()["ssd"]["hit_blocks"] == ssd_hits  # served from DRAM
    s.close()


def test_truncate_session_and_retain(tmp_path, ns):
    s = open_store(tmp_path / "ssd", dram_bytes=1 << 20)
    keys = ns.keys(np.arange(6 * BLOCK_TOKENS), BLOCK_TOKENS)
    data = payload(6, s.block_bytes, seed=9)
    s.put(3, keys, data)
    assert s.retain(keys, 60) == 6
    assert s.stats()["retained_extents"] >= 1
    assert s.retain(keys, 0) == 0
    # The agent rewrites its history after block 2: the tail goes.
    assert s.truncate_session(3, 2) == 4
    assert s.match(keys) == 2 and s.stats()["truncated_blocks"] == 4
    out = np.zeros_like(data[:2])
    assert s.restore(keys[:2], out) == 2 and np.array_equal(out, data[:2])
    with pytest.raises(flatkv.Error) as e:
        s.truncate_session(99, 0)
    assert e.value.code == "NotFound"
    s.close()


def pruned_view(data, layers, layer_bytes, bt, ranges):
    """The kept tokens' K and V rows of `data` (blocks x block bytes), packed in order, zero padded."""
    blocks = data.shape[0]
    row = layer_bytes // (2 * bt)
    gone = set()
    for b, e in ranges:
        gone.update(range(b, e))
    kept = [p for p in range(blocks * bt) if p not in gone]
    out = np.zeros(((len(kept) + bt - 1) // bt, data.shape[1]), dtype=np.uint8)
    for j, p in enumerate(kept):
        for l in range(layers):
            src, dst = data[p // bt, l * layer_bytes:], out[j // bt, l * layer_bytes:]
            dst[(j % bt) * row:(j % bt + 1) * row] = src[(p % bt) * row:(p % bt + 1) * row]
            dst[(bt + j % bt) * row:(bt + j % bt + 1) * row] = src[(bt + p % bt) * row:(bt + p % bt + 1) * row]
    return out


def test_prune(store, ns):
    keys = ns.keys(np.arange(5 * BLOCK_TOKENS), BLOCK_TOKENS)
    data = payload(5, store.block_bytes, seed=4)
    store.put(6, keys, data)
    ranges = [(2, 10), (30, 60)]
    r = store.prune(keys, ranges)
    assert r["kept_tokens"] == 80 - 38 and r["view_blocks"] == 3 and r["stored_blocks"] == 3
    view = flatkv.prune_view_keys(keys[-1], len(keys), ranges, BLOCK_TOKENS)
    assert view.shape == (3, 2) and store.match(view) == 3
    assert r["view_session"] == flatkv.chunk_session(view[0])
    store.drop_session(6)  # the unpruned blocks go, the view stays
    assert store.match(keys) == 0
    out = np.zeros((3, store.block_bytes), dtype=np.uint8)
    assert store.restore(view, out) == 3
    assert np.array_equal(out, pruned_view(data, store.layers, store.block_layer_bytes, BLOCK_TOKENS, ranges))
    assert store.match(flatkv.prune_view_keys(keys[-1], len(keys), [(2, 10)], BLOCK_TOKENS)) == 0
    with pytest.raises(flatkv.Error, match="overlaps or precedes") as e:
        store.prune(keys, [(30, 60), (2, 10)])
    assert e.value.code == "InvalidArgument"
    assert store.prune(keys, ranges)["stored_blocks"] == 0  # the view exists: nothing to write
    with pytest.raises(flatkv.Error, match="0 of the chain's 5 blocks") as e:
        store.prune(keys, [(0, 3)])  # another view needs the chain, which is gone
    assert e.value.code == "NotFound"
    with pytest.raises(ValueError, match="shape"):
        store.prune(keys, [1, 2, 3])


def test_an_fp8_store_keeps_its_bytes(tmp_path, ns):
    """An fp8 KV cache (vLLM's --kv-cache-dtype fp8) is stored as its bytes: one byte an element."""
    shape = dict(SHAPE, dtype="fp8_e4m3")
    store = flatkv.Store(shape, block_tokens=BLOCK_TOKENS, dram_bytes=1 << 20, ssd_dir=str(tmp_path / "ssd"),
                         ssd_bytes=4 << 20, segment_bytes=1 << 20, extent_layer_bytes=8 << 10)
    assert store.dtype == "fp8_e4m3" and store.block_layer_bytes == 2 * 16 * 2 * 16
    keys = ns.keys(np.arange(3 * BLOCK_TOKENS), BLOCK_TOKENS)
    data = payload(3, store.block_bytes, seed=9)  # every byte value: fp8 NaNs included
    store.put(1, keys, data)
    out = np.zeros_like(data)
    assert store.restore(keys, out) == 3 and np.array_equal(out, data)
    store.close()
    with pytest.raises(ValueError, match="dtype must be"):
        flatkv.Store(dict(SHAPE, dtype="fp8"), block_tokens=BLOCK_TOKENS, dram_bytes=1 << 20)
