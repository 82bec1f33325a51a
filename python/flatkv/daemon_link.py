"""A flatkv daemon connection that a serving engine leans on without ever waiting on it.

An engine's scheduler must not stall behind a slow or absent daemon, and an engine must start
without one. `DaemonLink` holds one `flatkv.Store.connect` client:
- it connects lazily and in the background: a daemon that is absent at start, or goes away, is
  retried with exponential backoff (from `backoff_s[0]` to `backoff_s[1]`), one warning per
  outage, and meanwhile `store` is None, which callers count as a miss;
- `check(store)` runs on every new connection (the engine's shape against the daemon's); a
  daemon that fails it is refused on that connection, logged, and treated as absent;
- each request has a deadline (`deadline_ms`): the daemon abandons a request past it and the
  call raises, so a stopped daemon costs one deadline per caller, never a hang.

`Lookups` answers prefix lookups asynchronously on a thread of its own over its own link: an
engine submits the key chains of a request and polls; the answer is None while the daemon has not
replied and the request's deadline has not passed, then the leading block count stored in every
chain (a request whose blocks are sharded over parallel ranks hits only where every rank's shard
is stored), or 0 past the deadline. Requests that arrive while the daemon is stopped wait in
order and are answered as soon as it answers again, if still inside their deadlines.

Neither imports an engine; the vLLM connector (flatkv.vllm) and the SGLang backend build on them.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import flatkv

logger = logging.getLogger("flatkv.daemon")


def normalize_address(address: str) -> str:
    if "://" not in address and not address.startswith(("unix:", "tcp:")):
        return "unix:" + address
    return address


class DaemonLink:
    """One daemon client, (re)connected in the background. Thread-safe."""

    def __init__(self, address: str, token: str = "", *, shm_window_bytes: int = 0,
                 deadline_ms: int = 10000, connect_timeout_ms: int = 1000,
                 check: Callable[[object], None] | None = None,
                 backoff_s: tuple[float, float] = (0.25, 30.0), name: str = "flatkv"):
        self.address = normalize_address(address)
        self._token = token
        self._shm = shm_window_bytes
        self._deadline_ms = int(deadline_ms)
        self._connect_timeout_ms = int(connect_timeout_ms)
        self._check = check
        self._backoff = backoff_s
        self.name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._store = None
        self._closed = False
        self._down_since: float | None = None
        self._delay = backoff_s[0]
        self.connects = 0  # connections made
        self.refusals = 0  # connections refused by `check`
        self.failures = 0  # calls that failed against the daemon
        self._thread = threading.Thread(target=self._run, name=f"{name}-connect", daemon=True)

    def start(self, wait_s: float = 0.0) -> "DaemonLink":
        """Starts connecting; waits up to wait_s for a first connection (or a refusal)."""
        self._thread.start()
        if wait_s > 0:
            deadline = time.monotonic() + wait_s
            with self._lock:
                while self._store is None and self.refusals == 0 and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
        return self

    def connect_now(self):
        """Connects in the caller's thread: the store, or raises flatkv.Error (absent daemon) or
        ValueError (refused by `check`). For callers that must fail at start."""
        try:
            s = self._open()
        except flatkv.Error:
            with self._lock:  # the caller says so; the background thread does not say it again
                self._down_since = self._down_since or time.monotonic()
            raise
        with self._lock:
            if self._store is None:
                self._store = s
                self.connects += 1
                self._wake.notify_all()
            else:
                s.close()
        return self._store

    @property
    def store(self):
        """The connected store, or None while the daemon is absent (never blocks)."""
        return self._store

    def failed(self, error: Exception) -> None:
        """A call on `store` failed. Transport failures are retried by the client itself on the
        next call (a fresh connection), so the link only counts them; a daemon that keeps failing
        is noticed by the background thread's probe."""
        self.failures += 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            s, self._store = self._store, None
            self._wake.notify_all()
        if s is not None:
            try:
                s.close()
            except Exception:  # noqa: BLE001 - the daemon may be gone
                pass

    def _open(self):
        s = flatkv.Store.connect(self.address, token=self._token, shm_window_bytes=self._shm,
                                 deadline_ms=self._deadline_ms,
                                 connect_timeout_ms=self._connect_timeout_ms)
        if self._check is not None:
            try:
                self._check(s)
            except ValueError:
                s.close()
                raise
        return s

    def _run(self):
        while True:
            with self._lock:
                while self._store is not None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            try:
                s = self._open()
            except (flatkv.Error, ValueError) as e:
                refused = isinstance(e, ValueError)
                now = time.monotonic()
                with self._lock:
                    if refused:
                        self.refusals += 1
                        self._wake.notify_all()
                    first = self._down_since is None
                    if first:
                        self._down_since = now
                if first or refused:
                    logger.warning("%s: %s the flatkv daemon at %s: %s; treating it as absent "
                                   "(every lookup a miss) and retrying with backoff", self.name,
                                   "refusing" if refused else "cannot reach", self.address, e)
                with self._lock:
                    if self._closed:
                        return
                    self._wake.wait(self._delay)
                    self._delay = min(self._delay * 2, self._backoff[1])
                continue
            with self._lock:
                if self._closed:
                    s.close()
                    return
                self._store = s
                self.connects += 1
                if self._down_since is not None:
                    logger.warning("%s: connected to the flatkv daemon at %s after %.1f s", self.name,
                                   self.address, time.monotonic() - self._down_since)
                self._down_since = None
                self._delay = self._backoff[0]
                self._wake.notify_all()


@dataclass
class _Lookup:
    chains: list[np.ndarray]
    submitted: float
    deadline: float
    hit: int | None = None  # leading blocks stored in every chain, once answered
    reason: str = ""  # why a lookup found nothing it could use: "", "unreachable", "deadline", "error"
    done: threading.Event = field(default_factory=threading.Event)
    latency_s: float = 0.0


class Lookups:
    """Asynchronous prefix lookups over a DaemonLink of their own. Thread-safe."""

    def __init__(self, link: DaemonLink, deadline_s: float):
        self._link = link
        self._deadline_s = deadline_s
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._queue: collections.deque[_Lookup] = collections.deque()
        self._closed = False
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="flatkv-lookups", daemon=True)
        self._thread.start()

    def submit(self, chains: list[np.ndarray]) -> _Lookup:
        now = time.monotonic()
        lk = _Lookup(chains, now, now + self._deadline_s)
        with self._lock:
            self._queue.append(lk)
            self._cv.notify()
        return lk

    @staticmethod
    def poll(lk: _Lookup, wait_s: float = 0.0) -> int | None:
        """The lookup's hit blocks, None while pending; 0 once its deadline has passed."""
        if lk.done.wait(wait_s) if wait_s > 0 else lk.done.is_set():
            return lk.hit
        if time.monotonic() >= lk.deadline:
            lk.reason = lk.reason or "deadline"
            return 0
        return None

    def close(self):
        """Stops the thread and closes the link (a lookup in flight ends with its deadline)."""
        with self._lock:
            self._closed = True
            self._cv.notify_all()
        self._link.close()

    def _run(self):
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                lk = self._queue.popleft()
            if time.monotonic() >= lk.deadline:  # answered 0 by poll already
                lk.hit, lk.reason = 0, lk.reason or "deadline"
                lk.done.set()
                continue
            store = self._link.store
            if store is None:
                lk.hit, lk.reason = 0, "unreachable"
                lk.done.set()
                continue
            t0 = time.monotonic()
            try:
                hit = None
                for keys in lk.chains:
                    if len(keys) == 0 or hit == 0:
                        hit = 0
                        break
                    n = int(store.match(keys))
                    hit = n if hit is None else min(hit, n)
                lk.hit = hit or 0
            except flatkv.Error as e:
                self._link.failed(e)
                lk.hit, lk.reason = 0, "error"
                if not self._failing:  # one warning per outage
                    logger.warning("%s: lookup failed, treating as a miss until the daemon answers "
                                   "again: %s", self._link.name, e)
                self._failing = True
            else:
                if self._failing:
                    logger.warning("%s: lookups answered again", self._link.name)
                self._failing = False
            lk.latency_s = time.monotonic() - t0
            if time.monotonic() > lk.deadline and lk.hit:
                lk.hit, lk.reason = 0, "deadline"  # poll may have answered 0 already: stay consistent
            lk.done.set()
