"""A `flatkv serve` daemon for tests: python/tests/test_daemon.py and tests/vllm/ (which puts
this folder on sys.path). Needs the `flatkv` binary with `serve` (FLATKV_BINARY, set by ctest);
skipped when FLATKV_BINARY is unset, a failure when it names no such binary."""
import os
import signal
import subprocess
import time

import pytest

import flatkv

TOKEN_A = "python-tenant-a-token-0123"
TOKEN_B = "python-tenant-b-token-4567"


def serve_binary():
    binary = os.environ.get("FLATKV_BINARY", "")
    if not binary:
        pytest.skip("FLATKV_BINARY is not set (ctest sets it when the flatkv tool is built)")
    # Named (by ctest, the binary it built): it must be there, not skipped.
    if not os.access(binary, os.X_OK):
        pytest.fail(f"FLATKV_BINARY={binary} is not an executable")
    help_text = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True)
    if help_text.returncode != 0 or "--config" not in help_text.stdout:
        pytest.fail(f"{binary} has no `serve --config`")
    return binary


class Daemon:
    """A daemon on a Unix socket in `tmp`, SSD directory included."""

    def __init__(self, binary, tmp, store_settings="", shape="stories260k", block_tokens=16,
                 dram_bytes="8MiB", ssd_bytes="64MiB", segment_bytes="8MiB"):
        self.socket = str(tmp / "flatkv.sock")
        self.config = tmp / "flatkv.toml"
        if isinstance(shape, dict):  # [store.shape] as a table: kind, layers, kv_heads, head_dim, dtype
            shape_toml = "{ " + ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}"
                                          for k, v in shape.items()).replace("'", '"') + " }"
        else:
            shape_toml = f'"{shape}"'
        self.config.write_text(f"""
[store]
shape = {shape_toml}
block_tokens = {block_tokens}
dram_bytes = "{dram_bytes}"
ssd_dir = "{tmp / 'ssd'}"
ssd_bytes = "{ssd_bytes}"
segment_bytes = "{segment_bytes}"
{store_settings}
[listen]
unix = "{self.socket}"
tcp = ""
http = ""

[[tenants]]
name = "a"
token = "{TOKEN_A}"

[[tenants]]
name = "b"
token = "{TOKEN_B}"
""")
        self.binary = binary
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([self.binary, "serve", "--config", str(self.config)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("flatkv serve exited: " + self.proc.stdout.read())
            try:
                return flatkv.Store.connect("unix:" + self.socket, token=TOKEN_A)
            except flatkv.Error:
                time.sleep(0.05)
        pytest.fail("flatkv serve did not accept connections within 20 s")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode if self.proc else 0
        self.proc = None
        return code
