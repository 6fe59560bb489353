"""Flow control as the current scheduling config has it (epp/cmd/scheduler.py applies each config's section)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from epp.fleet import Datastore, Detector, SaturationDetector
from epp.flowcontrol import FlowController, PoolPressure

if TYPE_CHECKING:
    from epp.api import EppMetrics
    from scheduling.api import FlowControl


class FlowSwitch:
    """Flow control as the current scheduling config has it: on, reconfigured in place, or off (its queued
    requests are then dispatched); and the pool saturation it reads, kept current with the datastore."""

    def __init__(self, datastore: Datastore, metrics: EppMetrics | None) -> None:
        self.metrics = metrics
        self.pressure = PoolPressure(datastore, datastore.routable, SaturationDetector())
        self.flow: FlowController | None = None
        self._background: set[asyncio.Task[Any]] = set()
        datastore.on_endpoint_removed(self.pressure.forget)
        datastore.on_metrics_updated(self.metrics_arrived)

    def apply(self, config: FlowControl | None, detector: Detector) -> FlowController | None:
        self.pressure.detector = detector
        if config is None:
            old, self.flow = self.flow, None
            if old is not None:
                task = asyncio.get_running_loop().create_task(old.close(release=True))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            return None
        if self.flow is None:
            self.flow = FlowController(config, self.pressure, metrics=self.metrics)
        else:
            self.flow.configure(config)
        return self.flow

    def metrics_arrived(self, keys: Iterable[str]) -> None:
        self.pressure.metrics_updated(keys)
        if self.flow is not None:
            self.flow.kick()

    async def close(self) -> None:
        """Queued requests are answered 503 (before the server drains)."""
        flow, self.flow = self.flow, None
        if flow is not None:
            await flow.close()


__all__ = ["FlowSwitch"]
