"""`epp serve`: its components, started in order from the settings, closed in reverse; then run until stopped.

`App` holds what the components make (tests and the dashboard read them) and runs `STEPS`, each a small function
in the module of its responsibility that starts its components from `app.settings` and hands them to the runner
(epp/cmd/runner.py). The current director is swapped whole on a scheduling-config reload (`publish`): the ext_proc
service, the API service and the dashboard's explainer hold it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from epp.api.metrics import EppMetrics
from epp.cmd import bus, fleet, precise, request, routing, scheduler, servers
from epp.cmd import observe as observe_step
from epp.cmd.runner import Runner
from epp.cmd.scheduler import build_scheduler, load_scheduling
from epp.cmd.settings import ServeSettings
from epp.fleet.datastore import Datastore
from epp.request.director import Director

if TYPE_CHECKING:
    from epp.api.dashboard import Dashboard
    from epp.api.dashboard.recorder import DecisionRecorder
    from epp.api.health import EppHealthServicer
    from epp.bus.shell import BusRuntime
    from epp.fleet.kvevents.service import PreciseService
    from epp.fleet.passive import PassiveHealth
    from epp.fleet.reload import FileWatcher
    from epp.fleet.scrape.scraper import MetricsScraper
    from epp.flowcontrol import FlowController, PoolPressure
    from epp.observe import Observability
    from epp.ratelimit.wiring import RateLimits
    from epp.request.sessions import SessionIdentity
    from epp.routing.service import RoutingService
    from epp.tokenize.shell import RequestTokens
    from epp.xds import EdsService
    from scheduling.framework.model_scheduler import ModelScheduler

log = logging.getLogger("epp")

Step = Callable[["App"], Awaitable[None]]

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


class App:
    """Everything `epp serve` runs; tests start it in-process with the same settings."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.rng = random.Random(settings.scheduling.seed)
        self.datastore = Datastore(default_pool=settings.sources.pool_name)
        self.runner = Runner()
        self.kube = fleet.Kube(self.datastore, settings.sources, self.runner)
        self.started_at = time.time()
        self.watchers: dict[str, FileWatcher[Any]] = {}  # hot-reloaded files by what they hold (the dashboard)
        self.holders: list[Any] = []  # what serves with the current director (swapped whole on reload)
        # What the steps make, in their order.
        self.metrics: EppMetrics | None = None
        self.precise: PreciseService | None = None  # the precise prefix index and its KV-event subscriptions
        self.tokens: RequestTokens | None = None  # tokenizes requests for configs that read token ids
        self.routing: RoutingService | None = None  # with --routes-file / --watch-routes
        self.scheduler: ModelScheduler | None = None  # the initial one (the director holds the current one)
        self.rate_limits: RateLimits | None = None  # the routes' token rate limits and budgets (epp/ratelimit)
        self.flow_switch: scheduler.FlowSwitch | None = None
        self.scraper: MetricsScraper | None = None
        self.bus: BusRuntime | None = None  # with --bus-peers / --bus-service / --workers
        self.passive: PassiveHealth | None = None
        self.recorder: DecisionRecorder | None = None  # the record of decisions: the dashboard's and the receipts'
        self.observe: Observability | None = None  # traces, receipts, the shadow profile (epp/observe)
        self.sessions: SessionIdentity | None = None  # agent session identity (epp/request/sessions.py)
        self.director: Director | None = None
        self.dashboard: Dashboard | None = None
        self.server: Any = None  # the gRPC server (grpc.aio.Server or epp.h2grpc.H2Server)
        self.extproc: Any = None  # its ext_proc service
        self.health: EppHealthServicer | None = None
        self.eds: EdsService | None = None  # with --eds
        self.port = 0

    @property
    def flow(self) -> FlowController | None:
        """Flow control, while the current config turns it on."""
        return self.flow_switch.flow if self.flow_switch is not None else None

    @property
    def pressure(self) -> PoolPressure | None:
        """The pool saturation flow control reads."""
        return self.flow_switch.pressure if self.flow_switch is not None else None

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

    def current(self) -> Director:
        assert self.director is not None, "the director is built before any request or endpoint event"
        return self.director

    def publish(self, director: Director) -> None:
        """Make `director` the one new streams, explain and the dashboard use (streams keep the one they began
        with)."""
        self.director = director
        for holder in self.holders:
            holder.director = director

    def apply_scheduler(self, new: ModelScheduler) -> None:
        """Make `new` the current scheduler, with its config's shell sections (epp/cmd/scheduler.py)."""
        scheduler.apply_scheduler(self, new)

    def services(self) -> dict[str, Any]:
        """What the shell lends every loaded scheduler (scheduling.framework.plugin.BuildContext.services)."""
        return self.precise.services() if self.precise is not None else {}


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
