"""What `epp serve`'s components are, once started: one `Components`, built from the settings, that every start step
(epp/cmd/app.py STEPS) receives, fills with what it starts, and reads what the earlier steps made from.

The current director is swapped whole on a scheduling-config reload (`publish`): the ext_proc service, the API
service and the dashboard's explainer hold it (`holders`).
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from epp.cmd.kube import Kube
from epp.cmd.runner import Runner
from epp.cmd.settings import ServeSettings
from epp.fleet import Datastore

if TYPE_CHECKING:
    from epp.api import EppHealthServicer, EppMetrics
    from epp.api.dashboard import Dashboard, DecisionRecorder
    from epp.bus import BusRuntime
    from epp.cmd.flowswitch import FlowSwitch
    from epp.fleet import FileWatcher, PassiveHealth
    from epp.fleet.kvevents import PreciseService
    from epp.fleet.scrape import MetricsScraper
    from epp.flowcontrol import FlowController, PoolPressure, SloHolds
    from epp.observe import Observability
    from epp.ratelimit import RateLimits
    from epp.request import Director, SessionIdentity
    from epp.routing import RoutingService
    from epp.tokenize import RequestTokens
    from epp.xds import EdsService
    from scheduling.framework.model_scheduler import ModelScheduler


class Components:
    """Everything `epp serve` runs; tests start it in-process with the same settings (epp.cmd.app.App)."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.rng = random.Random(settings.scheduling.seed)
        self.datastore = Datastore(default_pool=settings.sources.pool_name)
        self.runner = Runner()
        self.kube = Kube(self.datastore, settings.sources, self.runner)
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
        self.flow_switch: FlowSwitch | None = None
        self.scraper: MetricsScraper | None = None
        self.bus: BusRuntime | None = None  # with --bus-peers / --bus-service / --workers
        self.passive: PassiveHealth | None = None
        self.recorder: DecisionRecorder | None = None  # the record of decisions: the dashboard's and the receipts'
        self.observe: Observability | None = None  # traces, receipts, the shadow profile (epp/observe)
        self.sessions: SessionIdentity | None = None  # agent session identity (epp/request/sessions.py)
        self.holds: SloHolds | None = None  # loose requests held for tight work (epp/flowcontrol/hold.py)
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

    def current(self) -> Director:
        assert self.director is not None, "the director is built before any request or endpoint event"
        return self.director

    def publish(self, director: Director) -> None:
        """Make `director` the one new streams, explain and the dashboard use (streams keep the one they began
        with)."""
        self.director = director
        for holder in self.holders:
            holder.director = director

    def services(self) -> dict[str, Any]:
        """What the shell lends every loaded scheduler (scheduling.framework.plugin.BuildContext.services)."""
        return self.precise.services() if self.precise is not None else {}


__all__ = ["Components"]
