"""Fixtures for the flatkv Python tests: a small shape and temp stores."""
import numpy as np
import pytest

import flatkv

# 3 layers x 2 KV heads x 16 dims x f16 = 128 bytes per token and layer;
# 16-token blocks: 2 KiB per layer slice, 6 KiB per block.
SHAPE = {"kind": "mha", "layers": 3, "kv_heads": 2, "head_dim": 16, "dtype": "f16"}
BLOCK_TOKENS = 16


def open_store(ssd_dir=None, dram_bytes=1 << 20):
    return flatkv.Store(SHAPE, block_tokens=BLOCK_TOKENS, dram_bytes=dram_bytes,
                        ssd_dir=None if ssd_dir is None else str(ssd_dir), ssd_bytes=4 << 20,
                        segment_bytes=1 << 20, extent_layer_bytes=8 << 10)


def payload(blocks, block_bytes, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(blocks, block_bytes), dtype=np.uint8)


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "ssd")
    yield s
    s.close()


@pytest.fixture
def ns():
    return flatkv.Namespace(model_fingerprint="pytest-model", tenant="t1")
