"""flatkv: a KV-cache store for LLM serving (DRAM + SSD, embedded or a daemon client).

The store, its keys and errors come from the C extension `flatkv._flatkv`, a thin pybind11 layer
over the C API (python/README.md). `flatkv.vllm` is flatkv as vLLM's KV connector
(`kv_connector_module_path "flatkv.vllm"`, docs/vllm.md); it imports vLLM only when imported.
"""
from flatkv._flatkv import *  # noqa: F401,F403  (Store, Restore, Namespace, Rope, Error, ...)
from flatkv._flatkv import DEFAULT_HASH_SEED  # noqa: F401

from flatkv import _flatkv

# The classes print as flatkv.Store, flatkv.Restore, ... (where they are used), not flatkv._flatkv.
for _obj in vars(_flatkv).values():
    if isinstance(_obj, type) and _obj.__module__ == "flatkv._flatkv":
        _obj.__module__ = "flatkv"
del _obj
