"""`Observability`: what `epp serve` wires for tracing, the decision ids and the shadow profile (the package
docstring, epp/observe/__init__.py, says what each part does)."""


from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.observe.settings import ObserveSettings
from epp.request import DecisionIds

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from epp.api.dashboard import DecisionRecorder
    from epp.fleet import FileWatcher
    from epp.observe.shadow import Shadow
    from epp.observe.tracing import Tracing
    from epp.request import RequestObserver
    from scheduling.api import Scheduler

log = logging.getLogger("epp.observe")


class Observability:
    """Tracing, the decision ids, the shadow runner and its config watcher, for one `epp serve` process."""

    def __init__(self, settings: ObserveSettings) -> None:
        self.settings = settings
        r = settings.receipts
        self.ids = DecisionIds(header=r.header, metadata=r.metadata)
        self.tracing: Tracing | None = None
        self.shadow: Shadow | None = None
        self.watcher: FileWatcher[Any] | None = None

    async def start(self, registry: CollectorRegistry | None = None, seed: int | None = None) -> None:
        """Start tracing (a clear error when the SDK is missing) and the shadow config's watcher; `registry`: the
        Prometheus registry the shadow's and the trace export queue's metrics join."""
        if self.settings.tracing.enabled:
            from epp.observe.tracing import Tracing

            if _sdk_disabled():
                log.warning("--tracing is on but OTEL_SDK_DISABLED=true: no spans are made")
            else:
                self.tracing = Tracing(self.settings.tracing)
                if registry is not None:
                    from epp.observe.batching import batch_collector

                    registry.register(batch_collector(self.tracing.processor))
                t = self.settings.tracing
                log.info("tracing: OTLP %s to %s, service %s", t.protocol, t.endpoint or "the OTEL_* default",
                         t.service_name)
        sh = self.settings.shadow
        if sh.config_file:
            await self._start_shadow(Path(sh.config_file), registry, seed)

    async def _start_shadow(self, path: Path, registry: CollectorRegistry | None, seed: int | None) -> None:
        from epp.fleet import FileWatcher
        from epp.observe.shadow import Shadow
        from epp.observe.shadow_report import shadow_collector
        from scheduling.config import load_scheduler, parse_yaml

        shadow = self.shadow = Shadow(self.settings.shadow)
        rng = random.Random(seed)

        def parse(text: str) -> Any:  # no shared services: the shadow writes nothing the live scheduler reads
            docs = [d.data for d in parse_yaml(text, str(path))]
            return load_scheduler(docs, rng=rng, timer=time.perf_counter, name=str(path))

        def apply(scheduler: Scheduler) -> None:
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

    def attach_recorder(self, recorder: DecisionRecorder | None) -> None:
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


__all__ = ["Observability"]
