"""A small passive-health tracker fed by the response path: LLMKube's quarantine, and first-byte latency.

Quarantine (LLMKube `spec.proxy.quarantineDuration`, `streamIdleTimeout`):
- a key (an endpoint `ip:port`, or an external backend) is quarantined after `threshold` failures in a row: two
  for a pod of a local backend, one for an external backend (LLMKube quarantines a whole backend at its first 5xx
  or network error, and a pod of an endpoint-resolved backend at its second);
- a failure is a 5xx status seen on the response path (Envoy's own 503 for a connection failure or a reset is one
  too), or a response that came from a fallback (Envoy retried: the first choice failed);
- a stream that goes silent past `streamIdleTimeout` (no response bytes, headers included) quarantines its key at
  once; Envoy's route idle timeout (the generated config sets it) ends such a stream;
- after `quarantine_s` the key is half-open: exactly one request (the probe) may go to it; the probe's success
  makes it healthy, its failure quarantines it again at once; a probe that ends without an answer (the client
  went away) lets the next request probe;
- a success resets the count. Keys with nothing to remember are not kept; a departed endpoint is forgotten.
This needs the response phases (Envoy's `response_header_mode: SEND`): with lean phases only the stream's end is
seen, so nothing is ever quarantined (docs/coming-from-llmkube.md).

Merging with generic passive health: this module is self-contained on purpose (`FailureTracker` knows keys, not
routers); a generic response-path health tracker can replace `FailureTracker` behind the same four calls
(`available`, `begin`, `success`, `failure`) with LLMKube's parameters (threshold, duration, half-open probe).

First-byte latency (LLMKube `latencySLOMs`): `LatencyWindow` keeps the last samples per backend for a rolling P95.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Entry:
    fails: int = 0  # consecutive failures
    until: float = 0.0  # quarantined until (monotonic); 0: not quarantined
    probing: bool = False  # half-open and a probe is in flight
    reason: str = ""


class FailureTracker:
    def __init__(self, quarantine_s: float = 15.0) -> None:
        self.quarantine_s = quarantine_s
        self._entries: dict[str, _Entry] = {}
        self.quarantines = 0  # how many times a key was quarantined (tests, metrics)

    def __len__(self) -> int:
        return len(self._entries)

    # ---- reads ---------------------------------------------------------------------------------------------
    def state(self, key: str, now: float) -> str:
        """healthy | quarantined | half-open (a probe may go) | probing (the probe is in flight)."""
        e = self._entries.get(key)
        if e is None or not e.until:
            return "healthy"
        if now < e.until:
            return "quarantined"
        return "probing" if e.probing else "half-open"

    def available(self, key: str, now: float) -> bool:
        """May a request be sent to `key` now (healthy, or half-open with no probe in flight)?"""
        e = self._entries.get(key)
        return e is None or not e.until or (now >= e.until and not e.probing)

    def quarantined(self, now: float) -> list[tuple[str, float, str]]:
        """(key, seconds left, why) of every key not healthy; a half-open key has 0 seconds left."""
        return sorted((k, max(0.0, e.until - now), e.reason) for k, e in self._entries.items() if e.until)

    # ---- what the response path saw ------------------------------------------------------------------------
    def begin(self, key: str, now: float) -> None:
        """A request was sent to `key`; if it is half-open, that request is its probe."""
        e = self._entries.get(key)
        if e is not None and e.until and now >= e.until:
            e.probing = True

    def success(self, key: str) -> None:
        e = self._entries.pop(key, None)
        if e is not None and e.until:
            log.info("quarantine: %s answered again; healthy", key)

    def failure(self, key: str, now: float, reason: str, *, threshold: int = 2, at_once: bool = False) -> None:
        e = self._entries.get(key)
        if e is None:
            e = self._entries[key] = _Entry()
        half_open = bool(e.until) and now >= e.until
        e.fails += 1
        if at_once or half_open or e.fails >= threshold:
            e.until, e.probing, e.reason = now + self.quarantine_s, False, reason
            e.fails = 0
            self.quarantines += 1
            log.warning("quarantine: %s skipped for %.3gs (%s)", key, self.quarantine_s, reason)

    def abandon(self, key: str) -> None:
        """A request to `key` ended without an answer either way: a half-open key may be probed again."""
        e = self._entries.get(key)
        if e is not None:
            e.probing = False

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)


class LatencyWindow:
    """The last `size` first-byte latencies (ms) per key, younger than `max_age_s`: a rolling P95."""

    def __init__(self, size: int = 100, max_age_s: float = 300.0) -> None:
        self.size = size
        self.max_age_s = max_age_s
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def add(self, key: str, ms: float, now: float) -> None:
        q = self._samples.get(key)
        if q is None:
            q = self._samples[key] = deque(maxlen=self.size)
        q.append((now, ms))

    def p95(self, key: str, now: float) -> float | None:
        q = self._samples.get(key)
        if not q:
            return None
        vals = sorted(ms for t, ms in q if now - t <= self.max_age_s)
        if not vals:
            return None
        return vals[min(len(vals) - 1, math.ceil(0.95 * len(vals)) - 1)]


class StreamWatch:
    """One request's response path, reported to a tracker (epp/request/director.py calls the three methods).

    `key` is where the request was sent (`primary`), `threshold` the failures in a row that quarantine it,
    `fallbacks` the keys Envoy may have retried on (a response served by one of them means `key` failed)."""

    __slots__ = ("tracker", "latency", "key", "backend", "threshold", "started", "clock", "idle_s", "headers_seen",
                 "first_byte", "last", "done", "timer", "fallbacks")

    def __init__(self, tracker: FailureTracker, key: str, *, threshold: int, clock: Callable[[], float],
                 idle_s: float = 0.0, latency: LatencyWindow | None = None, backend: str = "",
                 fallbacks: tuple[str, ...] = ()) -> None:
        self.tracker = tracker
        self.latency = latency
        self.key = key
        self.backend = backend
        self.threshold = threshold
        self.clock = clock
        self.started = self.last = clock()
        self.idle_s = idle_s
        self.headers_seen = False
        self.first_byte = False
        self.done = False
        self.fallbacks = fallbacks
        self.timer: asyncio.TimerHandle | None = None
        tracker.begin(key, self.started)
        if idle_s > 0:
            self._arm(idle_s)

    def _arm(self, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (a synchronous caller): nothing can go silent unseen
        self.timer = loop.call_later(delay, self._check_idle)

    def _check_idle(self) -> None:
        self.timer = None
        if self.done:
            return
        idle = self.clock() - self.last
        if idle + 1e-6 < self.idle_s:
            self._arm(self.idle_s - idle)
            return
        self.done = True
        self.tracker.failure(self.key, self.clock(), f"the stream went silent for {self.idle_s:g}s", at_once=True)

    # ---- the response path (through the LLMKube router's follow) ----------------------------------------
    def response_headers(self, status: int, served: str | None = None) -> None:
        if self.done:
            return
        self.headers_seen = True
        now = self.clock()
        silent = self._went_silent(now)  # before this answer moves `last`
        self.last = now
        key = self.key
        if served and served != key and served in self.fallbacks:
            # Envoy retried: the first choice failed, the fallback answered (or failed too: see status).
            self.tracker.failure(key, now, "Envoy retried on a fallback", threshold=self.threshold)
            key = self.key = served
        if status >= 500:
            self.done = True
            self._cancel()
            if silent:  # the proxy's own idle timeout answered (Envoy: 504) before our timer
                self.tracker.failure(key, now, f"the stream went silent for {self.idle_s:g}s", at_once=True)
            else:
                self.tracker.failure(key, now, f"HTTP {status}", threshold=self.threshold)
        elif status:
            self.tracker.success(key)

    def response_chunk(self, end_of_stream: bool) -> None:
        if self.done:
            return
        self.last = now = self.clock()
        if not self.first_byte:
            self.first_byte = True
            if self.latency is not None and self.backend:
                self.latency.add(self.backend, (now - self.started) * 1e3, now)
        if end_of_stream:
            self.done = True
            self._cancel()

    def closed(self) -> None:
        self._cancel()
        if not self.done:
            now = self.clock()
            if self._went_silent(now):  # ended by the proxy's idle timeout, which raced our timer
                self.tracker.failure(self.key, now, f"the stream went silent for {self.idle_s:g}s", at_once=True)
            elif not self.headers_seen:
                self.tracker.abandon(self.key)
        self.done = True

    def _went_silent(self, now: float) -> bool:
        """Silent for the idle timeout (within 10%: the proxy's timer and ours start a moment apart)."""
        return self.idle_s > 0 and now - self.last >= 0.9 * self.idle_s

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
