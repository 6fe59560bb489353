"""Seeing every decision: OpenTelemetry traces, decision receipts, shadow profiles and structured logs.

    tracing.py       `--tracing`: a span per request with child spans per stage (TracedExchange, TracingObserver)
    attributes.py    the request span's attributes
    batching.py      the bounded queue and thread between finished traces and the exporter (OTEL_BSP_*)
    wire.py          the OTLP encoder: a batch of traces straight to protobuf bytes
    otlp.py          the SDK's OTLP exporters (gRPC, HTTP) with wire.py's encoder in their translation hooks
    receipts.py      decision ids in replies and the access log; `epp explain --decision ID`; the gRPC GetReceipt
    shadow.py        `--shadow-config`: another scheduling config decides in shadow; agreement, latency, moves
    logs.py          `--log-format json` with the decision and trace ids

W3C traceparent / tracestate parsing (from the stream's gRPC metadata or the request's headers) is the request
path's own: epp/request/tracecontext.py. Everything here is a request observer (epp/request/observe.py) or reads the exchange, except what the exchange
itself carries: the decision id (epp/request/director.py `DecisionIds`) and, with tracing, its stage marks
(`TracedExchange`). `add_flags` registers the flags of `epp serve`; `Observability` is what the app wires
(docs/observability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.observe.logs import LogSettings
from epp.observe.receipts import ReceiptSettings
from epp.observe.shadow import ShadowSettings
from epp.observe.tracing import TracingSettings
from epp.request.director import DecisionIds

if TYPE_CHECKING:
    from epp.fleet.reload import FileWatcher
    from epp.observe.shadow import Shadow
    from epp.observe.tracing import Tracing
    from epp.request.observe import RequestObserver

log = logging.getLogger("epp.observe")


def add_flags(p: argparse.ArgumentParser, parse_bool: Callable[[str], bool],
              parse_duration: Callable[[str], float]) -> None:
    from epp.observe import logs, receipts, shadow, tracing

    tracing.add_flags(p, parse_bool)
    receipts.add_flags(p, parse_bool, parse_duration)
    shadow.add_flags(p, parse_bool)
    logs.add_flags(p)


@dataclass(frozen=True)
class ObserveSettings:
    tracing: TracingSettings = field(default_factory=TracingSettings)
    receipts: ReceiptSettings = field(default_factory=ReceiptSettings)
    shadow: ShadowSettings = field(default_factory=ShadowSettings)
    logs: LogSettings = field(default_factory=LogSettings)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ObserveSettings:
        return cls(TracingSettings.from_args(ns), ReceiptSettings.from_args(ns), ShadowSettings.from_args(ns),
                   LogSettings.from_args(ns))


class Observability:
    """Tracing, the decision ids, the shadow runner and its config watcher, for one `epp serve` process."""

    def __init__(self, settings: ObserveSettings) -> None:
        self.settings = settings
        r = settings.receipts
        self.ids = DecisionIds(header=r.header, metadata=r.metadata)
        self.tracing: Tracing | None = None
        self.shadow: Shadow | None = None
        self.watcher: FileWatcher[Any] | None = None

    async def start(self, registry: Any = None, seed: int | None = None) -> None:
        """Start tracing (a clear error when the SDK is missing) and the shadow config's watcher; `registry`: the
        Prometheus registry the shadow's metrics join."""
        if self.settings.tracing.enabled:
            from epp.observe.tracing import Tracing

            if _sdk_disabled():
                log.warning("--tracing is on but OTEL_SDK_DISABLED=true: no spans are made")
            else:
                self.tracing = Tracing(self.settings.tracing)
                t = self.settings.tracing
                log.info("tracing: OTLP %s to %s, service %s", t.protocol, t.endpoint or "the OTEL_* default",
                         t.service_name)
        sh = self.settings.shadow
        if sh.config_file:
            await self._start_shadow(Path(sh.config_file), registry, seed)

    async def _start_shadow(self, path: Path, registry: Any, seed: int | None) -> None:
        from epp.fleet.reload import FileWatcher
        from epp.observe.shadow import Shadow
        from epp.observe.shadow_report import shadow_collector
        from scheduling.config import load_scheduler, parse_yaml

        shadow = self.shadow = Shadow(self.settings.shadow)
        rng = random.Random(seed)

        def parse(text: str) -> Any:  # no shared services: the shadow writes nothing the live scheduler reads
            docs = [d.data for d in parse_yaml(text, str(path))]
            return load_scheduler(docs, rng=rng, timer=time.perf_counter, name=str(path))

        def apply(scheduler: Any) -> None:
            shadow.apply(scheduler, str(path))
            log.info("shadow scheduling config %s loaded", path)

        self.watcher = FileWatcher(path, parse=parse, apply=apply)
        await self.watcher.load_initial()
        self.watcher.start()
        if registry is not None:
            registry.register(shadow_collector(shadow))

    @property
    def observers(self) -> list[RequestObserver]:
        """After the recorder's (the shadow notes its pick on the decision's record)."""
        out: list[Any] = []
        if self.tracing is not None:
            from epp.observe.tracing import TracingObserver

            out.append(TracingObserver())
        if self.shadow is not None:
            out.append(self.shadow)
        return out

    def director_fields(self) -> dict[str, Any]:
        return {"ids": self.ids, "tracing": self.tracing}

    def attach_recorder(self, recorder: Any) -> None:
        if self.shadow is not None:
            self.shadow.recorder = recorder

    async def close(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()
        tracing, self.tracing = self.tracing, None
        if tracing is not None:
            await asyncio.to_thread(tracing.shutdown)


def _sdk_disabled() -> bool:
    import os

    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
