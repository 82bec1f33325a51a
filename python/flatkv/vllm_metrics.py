"""The vLLM connector's metrics, through vLLM's own KVConnectorStats and Prometheus hooks.

Both sides of the connector count: the scheduler its lookups (and why a lookup found nothing it
could use), the workers their loads and saves. vLLM aggregates the workers' stats with the
scheduler's (`Scheduler.update_from_output`), logs `reduce()` each interval and hands the data to
`build_prom_metrics`'s `observe`, so vLLM's `/metrics` shows `vllm:flatkv_*` counters and the
lookup latency histogram (docs/vllm.md, "Metrics").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

# Counter name -> help. Each is a running sum over the interval; `reduce` reports them as is.
COUNTERS = {
    "lookups": "Prefix lookups the scheduler asked flatkv",
    "lookup_blocks": "Blocks those lookups asked for (beyond vLLM's own prefix cache)",
    "hit_blocks": "Blocks flatkv held of those, in every parallel rank",
    "hit_tokens": "Tokens vLLM was told to load from flatkv",
    "miss_unreachable": "Lookups answered as misses because the daemon was absent or refused",
    "miss_deadline": "Lookups answered as misses because the daemon did not reply within the deadline",
    "miss_error": "Lookups answered as misses because the daemon's reply was an error",
    "lookup_retries": "Scheduler steps a request waited for its lookup ('ask again later')",
    "load_blocks": "Blocks restored into vLLM's cache (per rank)",
    "load_bytes": "Bytes restored into vLLM's cache",
    "load_failed_blocks": "Blocks a restore failed to bring (recomputed by vLLM)",
    "save_blocks": "Blocks stored from vLLM's cache (per rank)",
    "save_bytes": "Bytes stored from vLLM's cache",
    "save_failed_blocks": "Blocks whose store failed (not kept)",
    "lookup_latency_us_sum": "Sum of daemon lookup latencies, microseconds",
}
LATENCY_KEY = "lookup_latency_s"  # list of seconds, one per lookup answered by the daemon


@dataclass
class FlatkvConnectorStats(KVConnectorStats):
    def __post_init__(self):
        if not self.data:
            self.reset()

    def reset(self):
        self.data = {k: 0 for k in COUNTERS}
        self.data[LATENCY_KEY] = []

    def add(self, key: str, n: int | float = 1):
        self.data[key] = self.data.get(key, 0) + n

    def observe_lookup(self, seconds: float):
        self.data.setdefault(LATENCY_KEY, []).append(seconds)
        self.add("lookup_latency_us_sum", int(seconds * 1e6))

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            if k == LATENCY_KEY:
                self.data.setdefault(LATENCY_KEY, []).extend(v)
            else:
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        out = {k: self.data.get(k, 0) for k in COUNTERS if k != "lookup_latency_us_sum"}
        lat = sorted(self.data.get(LATENCY_KEY, []))
        if lat:
            out["lookup_p50_ms"] = round(lat[len(lat) // 2] * 1e3, 3)
            out["lookup_p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3, 3)
        return out

    def is_empty(self) -> bool:
        return not self.data.get(LATENCY_KEY) and not any(self.data.get(k, 0) for k in COUNTERS)


class FlatkvPromMetrics(KVConnectorPromMetrics):
    """vllm:flatkv_<counter>_total per engine, and vllm:flatkv_lookup_latency_seconds."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {}
        for name, doc in COUNTERS.items():
            c = self._counter_cls(name=f"vllm:flatkv_{name}", documentation=f"flatkv: {doc}",
                                  labelnames=labelnames)
            self._counters[name] = {i: c.labels(*v) for i, v in per_engine_labelvalues.items()}
        h = self._histogram_cls(name="vllm:flatkv_lookup_latency_seconds",
                                documentation="flatkv: daemon lookup latency, seconds",
                                buckets=[1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1,
                                         0.5, 1.0, 2.5, 10.0],
                                labelnames=labelnames)
        self._latency = {i: h.labels(*v) for i, v in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        for name, per_engine in self._counters.items():
            v = transfer_stats_data.get(name, 0)
            if v:
                per_engine[engine_idx].inc(v)
        for s in transfer_stats_data.get(LATENCY_KEY, []):
            self._latency[engine_idx].observe(s)
