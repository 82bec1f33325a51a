"""The flatkv module against a `flatkv serve` daemon started by the test.

Needs the `flatkv` binary with `serve` (FLATKV_BINARY, set by ctest);
skipped when FLATKV_BINARY is unset, a failure when it names no such binary.
"""

import numpy as np
import pytest

import flatkv
from conftest import payload
from daemon_util import TOKEN_A, TOKEN_B, Daemon, serve_binary


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(serve_binary(), tmp_path)
    yield d
    d.stop()


def test_client_round_trip_tenants_and_warm_restart(daemon):
    store = daemon.start()
    assert store.layers == 5 and store.block_tokens == 16 and store.dtype == "f32"  # stories260k, over the wire
    ns = flatkv.Namespace(model_fingerprint="stories260k")
    keys = ns.keys(np.arange(4 * 16), 16)
    data = payload(4, store.block_bytes, seed=5)
    store.put(1, keys, data, one_shot=True)  # one-shot: on SSD, so it survives a restart
    assert store.match(keys) == 4
    out = np.zeros_like(data)
    assert store.restore(keys, out) == 4
    assert np.array_equal(out, data)

    # Through a shared-memory window, layer by layer.
    shm = flatkv.Store.connect("unix:" + daemon.socket, token=TOKEN_A, shm_window_bytes=4 << 20)
    lb = shm.block_layer_bytes
    with shm.restore_start(keys) as r:
        for layer in range(shm.layers):
            assert r.wait_layer(layer) == 4
            got = np.frombuffer(r.layer_data(layer), np.uint8).reshape(4, lb)
            assert np.array_equal(got, data[:, layer * lb:(layer + 1) * lb])
            view = r.layer_view(layer)  # the window itself, no copy
            assert view.readonly and view.nbytes == 4 * lb
            assert np.array_equal(np.frombuffer(view, np.uint8).reshape(4, lb), got)
            r.release_layer(layer)
            with pytest.raises(ValueError, match="already released"):
                r.layer_view(layer)
        assert r.finish() == 4

    # Another tenant sends the same keys and reaches nothing.
    other = flatkv.Store.connect("unix:" + daemon.socket, token=TOKEN_B)
    assert other.match(keys) == 0
    with pytest.raises(flatkv.Error) as e:
        flatkv.Store.connect("unix:" + daemon.socket, token="wrong-token-wrong-token")
    assert e.value.code == "PermissionDenied"
    # drop_session through the daemon (protocol 2): that session's blocks go, session 1's stay.
    gone = ns.keys(np.arange(1000, 1000 + 2 * 16), 16)
    store.put(9, gone, payload(2, store.block_bytes, seed=6))
    assert store.match(gone) == 2
    store.drop_session(9)
    assert store.match(gone) == 0 and store.match(keys) == 4
    with pytest.raises(flatkv.Error, match="session 9 has no blocks") as e:
        store.drop_session(9)
    assert e.value.code == "NotFound"
    # retain and truncate_session through the daemon (protocol 4).
    tail = ns.keys(np.arange(2000, 2000 + 4 * 16), 16)
    store.put(11, tail, payload(4, store.block_bytes, seed=7))
    assert store.retain(tail, 30.0) == 4 and other.retain(tail, 30.0) == 0
    assert store.retain(tail, 0) == 0
    with pytest.raises(ValueError, match="ttl"):
        store.retain(tail, -1)
    assert store.truncate_session(11, 1) == 3
    assert store.match(tail) == 1
    with pytest.raises(flatkv.Error) as e:
        other.truncate_session(11, 0)
    assert e.value.code == "NotFound"
    # prune through the daemon (protocol 6): the view is built there, in this tenant's namespace.
    hist = ns.keys(np.arange(3000, 3000 + 4 * 16), 16)
    store.put(12, hist, payload(4, store.block_bytes, seed=8))
    r = store.prune(hist, [(5, 40)])
    assert r["view_blocks"] == 2 and r["kept_tokens"] == 29
    view = flatkv.prune_view_keys(hist[-1], 4, [(5, 40)], 16)
    assert store.match(view) == 2 and other.match(view) == 0
    store.drop_session(r["view_session"])
    assert store.match(view) == 0
    for s in (store, shm, other):
        s.close()

    assert daemon.stop() == 0
    store = daemon.start()  # warm: the SSD blocks are back
    assert store.match(keys) == 4
    out[:] = 0
    assert store.restore(keys, out) == 4
    assert np.array_equal(out, data)
    store.close()


def test_config_file_settings_reach_the_daemons_store(tmp_path):
    d = Daemon(serve_binary(), tmp_path, store_settings="""
session_dram_share_bytes = "2MiB"
dram_idle_after_ms = 1234
ssd_admission = "on-reuse"
readmit_on_restore = false
window_layers = 3
verify_dram_reads = true
""")
    try:
        store = d.start()
        o = store.options()
        assert o["session_dram_share_bytes"] == 2 << 20
        assert o["dram_idle_after_ms"] == 1234
        assert o["ssd_admission"] == "on-reuse"
        assert o["readmit_on_restore"] is False
        assert o["window_layers"] == 3
        assert o["verify_dram_reads"] is True
        assert o["ssd_write_buffer_bytes"] == 0  # not set: the store derives it
        assert o["ssd_dirs"] == 1  # the daemon's paths are not shown to tenants
        # Hints cross the wire.
        ns = flatkv.Namespace(model_fingerprint="stories260k")
        keys = ns.keys(np.arange(3 * 16), 16)
        data = payload(3, store.block_bytes, seed=6)
        for i, hint in enumerate(["auto", "hot", "one-shot"]):
            store.put(10 + i, keys[i:i + 1], data[i:i + 1], hint=hint)
        assert store.match(keys) == 3
        store.close()
    finally:
        assert d.stop() == 0
