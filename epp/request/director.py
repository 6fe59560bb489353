"""The director: the request services one ext_proc stream is decided with, bundled, immutable, swapped whole.

A `Director` is built once from everything the request path needs (the datastore, the current scheduler, the
routing layer, the admitters, tokenization, flow control, the observers) and never changed afterwards: a
scheduling-config reload builds a new one (`Director.replace`) and hands it to the transports, so a stream keeps
the bundle it started with. Its `exchange()` makes the per-stream owner of the lifecycle (epp/request/exchange.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epp.fleet import Datastore
from epp.request.admit import Admitter
from epp.request.context import (  # re-exported: the director's face (__all__)
    CONFORMANCE_REQ,
    CONFORMANCE_RESP,
    DESTINATION,
    LB_NS,
    MODEL_REWRITE,
    MODEL_REWRITE_HEADERS,
    OBJECTIVE,
    OBJECTIVE_HEADERS,
    PREFILLER,
    RECEIPT_KEY,
    RECEIPT_NS,
    SERVED,
    SUBSET,
    SUBSET_NS,
    DecisionIds,
    DirectorConfig,
    ShellContext,
    error_outcome,
    first_header,
)
from epp.request.exchange import RequestExchange
from epp.request.observe import RequestObserver
from epp.request.settings import EarlySettings
from scheduling.api import Scheduler, SchedulingContext
from scheduling.types import Endpoint

if TYPE_CHECKING:
    from epp.flowcontrol import FlowController, SloHolds
    from epp.observe import Tracing
    from epp.request.sessions import SessionIdentity
    from epp.routing import Router
    from epp.tokenize import RequestTokens

@dataclass(frozen=True, slots=True)
class Director:
    """The request services, bundled (see the module docstring). Positional: datastore, scheduler, config."""

    datastore: Datastore
    scheduler: Scheduler
    config: DirectorConfig = field(default_factory=DirectorConfig)
    clock: Callable[[], float] = time.monotonic
    router: Router | None = None  # routes, rules and weighted targets (None: pools only)
    rewrite: Callable[[str], str | None] | None = None  # InferenceModelRewrite: a model's weighted target
    admitters: Sequence[Admitter] = ()  # in order: sheddable saturation, rate limits, budgets (epp/request/admit.py)
    tokens: RequestTokens | None = None  # tokens for configs that read them (precise prefix routing)
    flow: FlowController | None = None  # flow control's queue, while the config turns it on
    holds: SloHolds | None = None  # loose requests held while their pick has tight work pending (also an observer)
    observers: Sequence[RequestObserver] = ()  # metrics, the dashboard, passive health, quarantine (observe.py)
    early: EarlySettings = field(default_factory=EarlySettings)  # deciding before the body ends (early.py)
    ids: DecisionIds = field(default_factory=DecisionIds)  # one per process: a reload keeps it
    tracing: Tracing | None = None  # OpenTelemetry traces, while `--tracing` is on (epp/observe/tracing.py)
    sessions: SessionIdentity | None = None  # agent sessions: who a request belongs to (epp/request/sessions.py)
    # passive health's probe: a candidate waiting for its probe, which the request at hand then goes to
    probe: Callable[[Sequence[Endpoint]], Endpoint | None] | None = None

    def exchange(self, stream_metadata: Sequence[tuple[Any, Any]] | None = None) -> RequestExchange:
        """The owner of one stream's request lifecycle (epp/request/exchange.py). `stream_metadata`: the ext_proc
        stream's gRPC metadata (str or bytes pairs), where Envoy puts its trace context; read only with tracing."""
        if self.tracing is not None:
            return self.tracing.exchange(self, stream_metadata)
        return RequestExchange(self)

    def replace(self, **changes: Any) -> Director:
        """A new bundle with some services swapped (a reloaded scheduler, flow control turned on or off)."""
        return dataclasses.replace(self, **changes)

    def scheduler_for(self, ctx: SchedulingContext) -> Scheduler:
        """The scheduler deciding for this request: its route's pool's own (P/D pairing), else the director's."""
        route = getattr(ctx, "route", None)
        return route.scheduler if route is not None and route.scheduler is not None else self.scheduler

    def describing(self, name: str) -> list[Any]:
        """The admitters that describe their state for explain and the dashboard (`describe(ctx)`)."""
        return [a for a in self.admitters if getattr(a, name, None) is not None]


__all__ = ["CONFORMANCE_REQ", "CONFORMANCE_RESP", "DESTINATION", "LB_NS", "MODEL_REWRITE", "MODEL_REWRITE_HEADERS",
           "OBJECTIVE", "OBJECTIVE_HEADERS", "PREFILLER", "RECEIPT_KEY", "RECEIPT_NS", "SERVED", "SUBSET", "SUBSET_NS",
           "DecisionIds", "Director", "DirectorConfig", "ShellContext", "error_outcome", "first_header"]
