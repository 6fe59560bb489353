"""The batch thread between finished traces and the OTLP exporter (imported with tracing only).

It does what the SDK's BatchSpanProcessor does, for Pointsman's traces (one per sampled request, its request span
and stage spans already encoded as bytes by epp/observe/wire.py) instead of the SDK's span objects: a bounded
queue, counted in spans, that a finished request joins in a lock and an append (the event loop's share besides the
encoding); a thread that exports a batch when `max_export_batch_size` spans wait or `schedule_delay` has passed,
and everything that is left at shutdown; when
the queue is full the oldest traces are dropped (counted in `dropped`, a warning at most once a minute), so a slow
collector never blocks or grows the process. Sizes and delays follow the standard variables and their defaults:
OTEL_BSP_SCHEDULE_DELAY (ms, 5000), OTEL_BSP_MAX_QUEUE_SIZE (2048), OTEL_BSP_MAX_EXPORT_BATCH_SIZE (512),
OTEL_BSP_EXPORT_TIMEOUT (ms, 30000: how long shutdown waits for the thread).

The exporter is the SDK's OTLP exporter (epp/observe/otlp.py): `export(batch)` frames the batch's bytes through
its translation hook, so the thread runs almost no Python while the loop works.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

log = logging.getLogger("epp.tracing")

WARN_EVERY = 60.0  # seconds between "queue full" warnings


def _env_int(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        log.warning("%s=%r is not a number; using %d", name, raw, default)
        return default
    if value < minimum:
        log.warning("%s=%r is below %d; using %d", name, raw, minimum, default)
        return default
    return value


@dataclass(frozen=True)
class BatchSettings:
    max_queue_size: int = 2048  # spans
    max_export_batch_size: int = 512  # spans
    schedule_delay: float = 5.0  # seconds
    export_timeout: float = 30.0  # seconds

    @classmethod
    def from_env(cls) -> BatchSettings:
        queue = _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048, 1)
        batch = _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512, 1)
        if batch > queue:
            log.warning("OTEL_BSP_MAX_EXPORT_BATCH_SIZE (%d) is larger than OTEL_BSP_MAX_QUEUE_SIZE (%d); "
                        "using %d", batch, queue, queue)
            batch = queue
        return cls(queue, batch, _env_int("OTEL_BSP_SCHEDULE_DELAY", 5000, 0) / 1e3,
                   _env_int("OTEL_BSP_EXPORT_TIMEOUT", 30000, 0) / 1e3)


class Exporter(Protocol):
    """What the batch thread exports through (the SDK's span exporters fit)."""

    def export(self, batch: Sequence[Any]) -> object: ...
    def shutdown(self) -> object: ...


class Batcher:
    """Bounded queue of traces and the thread that exports them. `wrap(traces, spans)` is what the exporter is
    given for a list of queued traces holding `spans` spans."""

    def __init__(self, exporter: Exporter, settings: BatchSettings | None = None,
                 wrap: Callable[[list[Any], int], Any] = lambda b, n: b) -> None:
        self.exporter = exporter
        self.settings = s = settings or BatchSettings.from_env()
        self._wrap = wrap
        self._queue: deque[tuple[Any, int]] = deque()
        self._queued = 0  # spans in the queue
        self.dropped = 0  # spans dropped because the queue was full
        self.exported = 0  # spans handed to the exporter
        self.failed = 0  # of those, spans whose export failed (the collector refused, timed out or was away)
        self._lock = threading.Lock()  # the queue and its counters
        self._export_lock = threading.Lock()  # one export at a time (the thread, a flush)
        self._wake = threading.Event()
        self._closed = False
        self._warned = 0.0
        self._max_queue, self._max_batch = s.max_queue_size, s.max_export_batch_size
        self._thread = threading.Thread(target=self._work, name="pointsman-trace-export", daemon=True)
        self._thread.start()

    # ---- the event loop's side ----------------------------------------------------------------------------------
    def emit(self, trace: Any, n: int) -> None:
        """Queue a finished trace of `n` spans (never blocks on the exporter; drops the oldest when full)."""
        with self._lock:
            if self._closed:
                self.dropped += n
                return
            q = self._queue
            q.append((trace, n))
            queued = self._queued = self._queued + n
            if queued > self._max_queue:
                self._drop(queued - self._max_queue)
                queued = self._queued
        if queued >= self._max_batch and not self._wake.is_set():
            self._wake.set()

    def _drop(self, excess: int) -> None:
        """Drop the oldest traces until `excess` spans are gone (the caller holds the lock)."""
        q, dropped = self._queue, 0
        while dropped < excess and len(q) > 1:
            dropped += q.popleft()[1]
        self._queued -= dropped
        self.dropped += dropped
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY:
            self._warned = now
            log.warning("tracing: the export queue is full (%d spans); dropping the oldest traces (%d so far)",
                        self._max_queue, self.dropped)

    # ---- the thread's side --------------------------------------------------------------------------------------
    def _take(self) -> tuple[list[Any], int]:
        """The oldest traces, up to a batch of spans (at least one trace), and their spans."""
        out: list[Any] = []
        with self._lock:
            q, room = self._queue, self._max_batch
            while q and (not out or room >= q[0][1]):
                trace, n = q.popleft()
                out.append(trace)
                room -= n
            spans = self._max_batch - room
            self._queued -= spans
        return out, spans

    def _export(self, everything: bool) -> None:
        """One batch, then more while a full batch waits (everything: until the queue is empty)."""
        with self._export_lock:
            while True:
                batch, n = self._take()
                if not batch:
                    return
                self.exported += n
                try:  # the SDK's exporters answer SpanExportResult.SUCCESS or .FAILURE
                    ok = getattr(self.exporter.export(self._wrap(batch, n)), "name", "") != "FAILURE"
                except Exception:
                    log.exception("tracing: exporting %d traces failed", len(batch))
                    ok = False
                if not ok:
                    self.failed += n
                if not everything and self._queued < self._max_batch:
                    return

    def _work(self) -> None:
        delay = max(self.settings.schedule_delay, 0.001)
        while not self._closed:
            self._wake.wait(delay)
            self._wake.clear()
            if self._closed:
                break
            self._export(False)
        self._export(True)

    # ---- control ------------------------------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return self._queued

    def force_flush(self, timeout_millis: int | None = None) -> bool:
        """Export everything queued now (blocking: call it from a thread)."""
        if self._closed:
            return False
        self._export(True)
        return True

    def shutdown(self) -> None:
        """Stop taking traces, export what is queued, stop the exporter (blocking)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join(self.settings.export_timeout)
        if self._thread.is_alive():
            log.warning("tracing: the export thread did not finish in %.0f s", self.settings.export_timeout)
        self.exporter.shutdown()


def batch_collector(batcher: Batcher) -> Collector:
    """The export queue's counters on /metrics, read at scrape time (nothing on the request path)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    class _Collector(Collector):
        def collect(self) -> Iterator[Any]:
            spans = CounterMetricFamily("pointsman_tracing_spans", "Spans of sampled requests, by outcome: "
                                        "exported (handed to the OTLP exporter), failed (of those, the export "
                                        "failed), dropped (the export queue was full).", labels=["outcome"])
            spans.add_metric(["exported"], batcher.exported)
            spans.add_metric(["failed"], batcher.failed)
            spans.add_metric(["dropped"], batcher.dropped)
            yield spans
            queued = GaugeMetricFamily("pointsman_tracing_queued_spans", "Spans waiting in the export queue.")
            queued.add_metric([], batcher.queued)
            yield queued

    return _Collector()
