"""Every store option of flatkv.Store(...) takes effect (read back through
store.options()), bad values name the option and the value, and put hints
pass through."""
import numpy as np
import pytest

import flatkv
from conftest import BLOCK_TOKENS, SHAPE, open_store, payload

# Every keyword with a value that differs from the default, and what
# store.options() must report for it (its StoreOptions field name).
SETTINGS = {
    "block_tokens": (32, "block_tokens", 32),
    "dram_bytes": (2 << 20, "dram_capacity_bytes", 2 << 20),
    "ssd_bytes": (8 << 20, "ssd_capacity_bytes", 8 << 20),
    "segment_bytes": (2 << 20, "segment_bytes", 2 << 20),
    "dram_extent_layer_bytes": (16 << 10, "dram_extent_layer_bytes", 16 << 10),
    "ssd_extent_layer_bytes": (64 << 10, "ssd_extent_layer_bytes", 64 << 10),
    "session_dram_share_bytes": (1 << 20, "session_dram_share_bytes", 1 << 20),
    "dram_idle_after_ms": (2500, "dram_idle_after_ms", 2500),
    "ssd_admission": ("on-reuse", "ssd_admission", "on-reuse"),
    "readmit_on_restore": (False, "readmit_on_restore", False),
    "sized_extents": (False, "sized_extents", False),
    "ssd_write_buffer_bytes": (3 << 20, "ssd_write_buffer_bytes", 3 << 20),
    "manifest_checkpoint_bytes": (5 << 20, "manifest_checkpoint_bytes", 5 << 20),
    "window_layers": (2, "window_layers", 2),
    "window_bytes": (1 << 20, "window_bytes", 1 << 20),
    "ssd_layers_in_flight": (5, "ssd_layers_in_flight", 5),
    "max_request_bytes": (1 << 20, "max_request_bytes", 1 << 20),
    "ssd_io": ("threadpool", "ssd_io", "threadpool"),
    "ssd_queue_depth": (8, "ssd_queue_depth", 8),
    "ssd_threads": (3, "ssd_threads", 3),
    "dram_threads": (1, "dram_threads", 1),
    "decode_threads": (2, "decode_threads", 2),
    "direct_io": (False, "use_direct_io", False),
    "sync_writes": (True, "sync_writes", True),
    "verify_dram_reads": (True, "verify_dram_reads", True),
}


def test_every_option_takes_effect(tmp_path):
    dirs = [str(tmp_path / "ssd0"), str(tmp_path / "ssd1")]
    kwargs = {k: v for k, (v, _, _) in SETTINGS.items()}
    with flatkv.Store(SHAPE, ssd_dirs=dirs, **kwargs) as s:
        got = s.options()
        for keyword, (_, field, want) in SETTINGS.items():
            assert got[field] == want, keyword
        assert got["ssd_dirs"] == dirs
        assert s.stats()["ssd_engine"] == "threadpool"
        assert s.block_tokens == 32


def test_extent_layer_bytes_sets_both_media(tmp_path):
    with open_store(tmp_path / "ssd") as s:
        o = s.options()
        assert o["dram_extent_layer_bytes"] == o["ssd_extent_layer_bytes"] == 8 << 10


def test_defaults_are_the_stores(tmp_path):
    """Absent options keep the store's defaults; derived sizes stay 0 (derived)."""
    with flatkv.Store(SHAPE, block_tokens=BLOCK_TOKENS) as s:
        o = s.options()
        assert o["session_dram_share_bytes"] == 0
        assert o["ssd_write_buffer_bytes"] == 0
        assert o["ssd_admission"] == "all"
        assert o["readmit_on_restore"] is True
        assert o["dram_idle_after_ms"] == 600000
        assert o["dram_capacity_bytes"] == 256 << 20
        assert o["ssd_dirs"] == []
    with flatkv.Store(SHAPE, block_tokens=BLOCK_TOKENS, dram_bytes=1 << 20, session_dram_share_bytes=None) as s:
        assert s.options()["session_dram_share_bytes"] == 0  # None: the default


@pytest.mark.parametrize("kwargs, error, message", [
    ({"session_dram_share_bytes": -1}, ValueError, "session_dram_share_bytes must be >= 0, got -1"),
    ({"ssd_write_buffer_bytes": "1GiB"}, TypeError, "ssd_write_buffer_bytes must be an int, got str '1GiB'"),
    ({"dram_idle_after_ms": 1.5}, TypeError, "dram_idle_after_ms must be an int, got float 1.5"),
    ({"dram_idle_after_ms": -10}, ValueError, "dram_idle_after_ms must be >= 0, got -10"),
    ({"window_layers": 1 << 32}, ValueError, "window_layers must be at most 4294967295, got 4294967296"),
    ({"window_bytes": 1 << 64}, ValueError, "window_bytes must be at most 18446744073709551615"),
    ({"readmit_on_restore": 1}, TypeError, "readmit_on_restore must be True or False, got int 1"),
    ({"sync_writes": "yes"}, TypeError, "sync_writes must be True or False, got str 'yes'"),
    ({"window_bytes": True}, TypeError, "window_bytes must be an int, got bool True"),
    ({"ssd_admission": "sometimes"}, ValueError, "ssd_admission must be one of \"all\", \"on-reuse\", got 'sometimes'"),
    ({"ssd_admission": 1}, TypeError, "ssd_admission must be one of \"all\", \"on-reuse\", got int 1"),
    ({"ssd_io": "dma"}, ValueError, "ssd_io must be one of \"auto\", \"uring\", \"threadpool\", got 'dma'"),
    ({"ssd_dirs": "/one/dir"}, TypeError, "ssd_dirs must be a list of paths, got str '/one/dir'"),
    ({"ssd_bytes": -4}, ValueError, "ssd_bytes must be >= 0, got -4"),
    ({"session_share": 1}, TypeError, "unknown option 'session_share'"),
    # Checked by the C API, raised as flatkv.Error with its message:
    ({"window_layers": 0}, flatkv.Error, "window_layers is 0"),
    ({"ssd_layers_in_flight": 0}, flatkv.Error, "ssd_layers_in_flight is 0"),
    ({"ssd_threads": 0}, flatkv.Error, "ssd_threads is 0"),
    ({"dram_idle_after_ms": 1 << 63}, flatkv.Error, "dram_idle_after_ms 9223372036854775808 exceeds"),
    # ... and by the store when it opens:
    ({"max_request_bytes": 1000}, flatkv.Error, "max_request_bytes=1000"),
    # The remote tier:
    ({"remote_seeds": "127.0.0.1:7000"}, TypeError, "remote_seeds must be a list of \"host:port\", got str"),
    ({"remote_seeds": ["nohost"]}, flatkv.Error, "remote seed \"nohost\" is not host:port"),
    ({"remote_prefix": "a{b}"}, flatkv.Error, "remote prefix \"a{b}\" must be non-empty"),
    ({"remote_auth": "user"}, TypeError, "remote_auth must be a (user, password) tuple"),
    ({"remote_timeout_ms": 0}, flatkv.Error, "remote timeout_ms is 0"),
    ({"remote_seeds": ["127.0.0.1:1"], "remote_timeout_ms": 200}, flatkv.Error, "seeds 127.0.0.1:1"),
])
def test_bad_values_name_the_option_and_the_value(kwargs, error, message):
    with pytest.raises(error) as e:
        flatkv.Store(SHAPE, block_tokens=BLOCK_TOKENS, dram_bytes=1 << 20, **kwargs)
    assert message in str(e.value)


def test_remote_options_reach_the_store():
    """The remote keywords set StoreOptions::remote; a store without seeds has no remote tier."""
    with flatkv.Store(SHAPE, block_tokens=BLOCK_TOKENS, dram_bytes=1 << 20, remote_prefix="fkv-py",
                      remote_auth=("node-a", "pw"), remote_tls_ca="/etc/ca.crt", remote_timeout_ms=250,
                      remote_publish_buffer_bytes=1 << 20, remote_capacity_bytes=5 << 30) as s:
        r = s.options()["remote"]
        assert r["seeds"] == [] and r["prefix"] == "fkv-py" and r["user"] == "node-a"
        assert r["password_set"] is True and "pw" not in str(r)
        assert r["tls"] is True and r["tls_ca_file"] == "/etc/ca.crt"
        assert r["timeout_ms"] == 250 and r["publish_buffer_bytes"] == 1 << 20 and r["capacity_bytes"] == 5 << 30
        assert "remote" not in s.stats()


def test_shape_fields_are_checked():
    with pytest.raises(ValueError, match=r'shape\["layers"\] must be >= 0, got -3'):
        flatkv.Store({"kind": "mha", "layers": -3, "kv_heads": 2, "head_dim": 16})


def test_put_hints(tmp_path, ns):
    with open_store(tmp_path / "ssd") as s:
        keys = ns.keys(np.arange(4 * BLOCK_TOKENS), BLOCK_TOKENS)
        data = payload(4, s.block_bytes, seed=8)
        s.put(1, keys[0:1], data[0:1], hint="auto")
        s.put(2, keys[1:2], data[1:2], hint="hot")
        s.put(3, keys[2:3], data[2:3], hint="one-shot")
        s.put(4, keys[3:4], data[3:4], one_shot=True, hint="one-shot")
        assert s.match(keys) == 4
        assert s.stats()["ssd"]["blocks"] >= 2  # one-shot blocks go straight to SSD
        out = np.zeros_like(data)
        assert s.restore(keys, out) == 4 and np.array_equal(out, data)
        with pytest.raises(ValueError, match="hint must be one of \"auto\", \"one-shot\", \"hot\", got 'warm'"):
            s.put(5, keys[0:1], data[0:1], hint="warm")
        with pytest.raises(ValueError, match="one_shot=True contradicts hint='hot'"):
            s.put(5, keys[0:1], data[0:1], one_shot=True, hint="hot")
