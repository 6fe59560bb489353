"""`epp serve`: its components, started in order from the settings, closed in reverse; then run until stopped.

`App` is the `Components` (epp/cmd/components.py: what the components make; tests and the dashboard read them) with
their lifecycle: it runs `STEPS`, each a small function in the module of its responsibility that receives the
components, starts its own from their settings and hands them to the runner (epp/cmd/runner.py). No step module
imports this one: they know the components, not the order they start in.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from epp.api import EppMetrics
from epp.cmd import bus, fleet, precise, request, routing, scheduler, servers
from epp.cmd import observe as observe_step
from epp.cmd.components import Components
from epp.cmd.scheduler import build_scheduler, load_scheduling
from epp.cmd.settings import ServeSettings

if TYPE_CHECKING:
    from scheduling.framework.model_scheduler import ModelScheduler

log = logging.getLogger("epp")

Step = Callable[[Components], Awaitable[None]]

# The order `epp serve` starts in (and closes in reverse): each step may read what the earlier ones made.
STEPS: tuple[tuple[str, Step], ...] = (
    ("precise prefix routing", precise.start_precise),  # the index and tokenization, before any endpoint
    ("endpoint sources", fleet.start_sources),
    ("route documents", routing.start_routing),
    ("scheduling config", scheduler.start_scheduling),
    ("rate limits and budgets", routing.start_rate_limits),
    ("flow control", scheduler.start_flow_control),
    ("metrics scraper", fleet.start_scraping),
    ("replica bus", bus.start_replica_bus),
    ("passive health", fleet.start_passive_health),
    ("observability", observe_step.start_observability),  # traces, decision ids and receipts, the shadow profile
    ("director", request.build_director),
    ("dashboard", servers.make_dashboard),
    ("gRPC servers", servers.start_grpc),
    ("worker control", servers.start_worker_control),
    ("metrics port", servers.start_metrics),
)


class App(Components):
    """Everything `epp serve` runs, started in STEPS' order and stopped in reverse; tests start it in-process with
    the same settings."""

    async def start(self) -> None:
        self.metrics = EppMetrics(self.datastore)
        for _name, step in STEPS:
            await step(self)

    async def stop(self, grace: float = 5.0) -> None:
        """Readiness goes first, then every component closes in reverse, and the gRPC server drains last."""
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        await self.runner.close()
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None

    def apply_scheduler(self, new: ModelScheduler) -> None:
        """Make `new` the current scheduler, with its config's shell sections (epp/cmd/scheduler.py)."""
        scheduler.apply_scheduler(self, new)


def freeze_startup_objects() -> None:
    """Move everything built at start (modules, protobuf descriptors, the SDKs, the config, the fleet) out of the
    cyclic GC's reach: it lives as long as the process, yet every full collection would walk all of it again.
    Objects made later are collected as usual, and refcounting still frees a frozen object that becomes garbage.
    `bench/bench_extproc.py` measured 5 to 12% less processor CPU per request with it (docs/performance.md)."""
    gc.collect()
    gc.freeze()


async def run(settings: ServeSettings) -> int:
    app = App(settings)
    try:
        await app.start()
    except Exception as e:
        log.error("cannot start: %s", e)
        await app.stop(0)
        return 1
    freeze_startup_objects()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: draining in-flight streams")
    await app.stop(grace=10.0)
    return 0


__all__ = ["STEPS", "App", "build_scheduler", "freeze_startup_objects", "load_scheduling", "run"]
