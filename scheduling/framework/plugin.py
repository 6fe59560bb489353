"""Plugin base classes: Filter, Scorer, Picker, ProfileHandler and Producer.

A plugin is built once at config load as `cls(name, params, build)` and then called for every decision.
Per-decision data shared between plugins (prompt hashes, prefix matches) lives in `state`, a dict that
travels with the `SchedulingResult` so the lifecycle hooks see what the scoring saw.

Request lifecycle: `pre_request(ctx, result, state)` runs once the pick is committed; `response_complete(ctx,
result, state)` runs once when the request ends. Only plugins that override them are called.

Engine metrics: `engine_metrics(endpoints, now)` runs after each scrape batch with the endpoints whose metrics it
updated (their `Metrics.engine` holds the engines' cumulative latency histograms and prefix-cache counters), for
plugins that learn from the engines themselves (fitted engine timings). Only plugins that override it are called.

Endpoint lifecycle: `endpoint_removed(key)` runs when an endpoint leaves every pool (the shell's datastore
reports it). A plugin that keeps anything per endpoint drops it there, so pod churn cannot grow its state and
an ip:port that comes back starts clean; `tracked_endpoints()` reports which endpoints it holds state for. A
request whose endpoint left while it ran gets no `response_complete` (its plugins already forgot the endpoint).

Shared data: a plugin that reads data kept across decisions by someone else (the approximate prefix index)
declares it in `data_requests()`; the loader resolves every request of one scheduler to exactly one
`Producer` per `DataKey` (the only writer) and hands it over through `bind_data`. See
scheduling/framework/data.py.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from scheduling.api import ProfileResult, SchedulingContext, SchedulingResult
from scheduling.types import Endpoint

if TYPE_CHECKING:
    from scheduling.framework.data import DataKey, DataRequest

State = dict[Any, Any]  # per-decision scratch space, keyed by whatever its writer chooses
SERVICES = "services"  # BuildContext.shared key of the shell's services
_NO_SERVICES: Mapping[str, Any] = {}
P = TypeVar("P")  # a plugin's typed parameters (its Params dataclass), or None


@dataclass
class BuildContext:
    """What a plugin may see while it is built.

    `shared` is scoped to one loaded scheduler: plugins that must agree on state (the prefix index) look it
    up there. `dialect` is "epp" (GIE/llm-d EndpointPickerConfig) or "heimdall" (SchedulingProfile).
    `services` is what the shell lends the scheduler (`load_scheduler(services=...)`, kept in `shared`): data the
    shell owns and keeps across config reloads, such as the precise prefix index fed by the engines' KV events.
    """

    source: str = "<builtin>"
    path: str = ""
    dialect: str = "epp"
    shared: dict[Any, Any] = field(default_factory=dict)
    given: frozenset[str] = frozenset()  # the parameter names the config set explicitly

    @property
    def services(self) -> Mapping[str, Any]:
        got: Mapping[str, Any] = self.shared.get(SERVICES, _NO_SERVICES)
        return got


class Plugin(ABC, Generic[P]):
    """`Plugin[Params]`: `Params` is the plugin's parameter dataclass (also set as the `Params` class attribute, which
    the registry parses the config into); `self.params` is typed by it."""

    type_name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    Params: ClassVar[type[Any] | None] = None
    params: P

    def __init__(self, name: str = "", params: Any = None, build: BuildContext | None = None) -> None:
        if params is None and self.Params is not None:
            params = self.Params()
        build = build or BuildContext()
        self.name = name or self.type_name
        self.params = params
        self.given_params: frozenset[str] = build.given
        self.source = build.source
        self.path = build.path
        self.services = build.services  # the shell's services (empty when the scheduler is loaded on its own)
        self.producers: dict[DataKey, Producer[Any]] = {}
        self.setup(build)

    def setup(self, build: BuildContext) -> None:
        """Derive runtime fields from `self.params`. Raise ConfigError (naming build.source/path) if invalid."""

    @property
    def stateful(self) -> bool:
        cls = type(self)
        return (
            cls.pre_request is not Plugin.pre_request or cls.response_complete is not Plugin.response_complete
        )

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        """The decision is committed (after the pick)."""

    def response_complete(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        """The request ended, whatever the outcome."""

    @property
    def observes_engines(self) -> bool:
        return type(self).engine_metrics is not Plugin.engine_metrics

    def engine_metrics(self, endpoints: Sequence[Endpoint], now: float) -> None:
        """New metrics arrived for these endpoints (one scrape batch)."""

    # ---- endpoint lifecycle ----------------------------------------------------------------------------------
    def endpoint_removed(self, key: str) -> None:
        """The endpoint `key` left every pool: forget everything kept for it."""

    def tracked_endpoints(self) -> Collection[str]:
        """The endpoint keys this plugin currently keeps state for (bounded by the live endpoints)."""
        return ()

    # ---- shared data -----------------------------------------------------------------------------------------
    def data_requests(self) -> Sequence[DataRequest]:
        """The shared data this plugin reads (and, for GIE compatibility, whether its presence produces it)."""
        return ()

    def bind_data(self, key: DataKey, producer: Producer[Any]) -> None:
        """Called by the loader with the one producer of each requested key."""
        self.producers[key] = producer

    def describe(self) -> str:
        return f"{self.name!r} ({self.type_name})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class Filter(Plugin[P]):
    kind: ClassVar[str] = "filter"

    @abstractmethod
    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        raise NotImplementedError


class ZeroScores(list[float]):
    """A scorer's result that is 0 for every candidate (e.g. the agent-session scorer for a request that names no
    session): the profile leaves it out of the weighted sum, which is then one pass over fewer lists. Same values
    as a plain list of zeros; the framework only reads the type."""

    __slots__ = ()


class Scorer(Plugin[P]):
    kind: ClassVar[str] = "scorer"
    # True when the formula itself guarantees [0, 1] (checked by property tests): the framework skips clamping.
    clamped: ClassVar[bool] = False

    @abstractmethod
    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> Sequence[float]:
        """One score per candidate, in candidate order."""
        raise NotImplementedError


class FilterScorer(Scorer[P], Filter[P]):
    """A scorer that can also act as a filter (when `filtering_enabled`). Its kind is "scorer"."""

    filtering_enabled: bool = False

    @abstractmethod
    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        raise NotImplementedError


class Picker(Plugin[P]):
    kind: ClassVar[str] = "picker"
    max_endpoints: int = 1

    @abstractmethod
    def pick(
        self, ctx: SchedulingContext, candidates: list[Endpoint], totals: list[float], rng: random.Random
    ) -> list[int]:
        """Indices into candidates, best first, at most max_endpoints long, never empty."""
        raise NotImplementedError


RunProfile = Callable[[str, "list[Endpoint] | None"], ProfileResult]


class ProfileHandler(Plugin[P]):
    kind: ClassVar[str] = "handler"

    @abstractmethod
    def handle(
        self,
        ctx: SchedulingContext,
        candidates: list[Endpoint],
        profiles: Sequence[str],
        run: RunProfile,
        state: State,
    ) -> SchedulingResult:
        """Choose profile(s) to run via `run(profile_name, candidates)` and assemble the result."""
        raise NotImplementedError

    def validate_profiles(self, profiles: Sequence[str], build: BuildContext) -> None:
        """Raise ConfigError when the configured profile names do not fit this handler."""


class Producer(Plugin[P]):
    """The only writer of one piece of shared data (`key`). It may be declared in a config's plugin list or be
    created by the loader for the plugins that request it; it records in `pre_request`, after every other
    plugin of the deciding scheduler, and forgets departed endpoints in `endpoint_removed`."""

    kind: ClassVar[str] = "producer"
    # Parameter names that define the data (requesters that set one of them must agree with the producer).
    defining_params: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def data_key(self) -> DataKey:
        """The one piece of shared data this producer writes."""


class System(Plugin[P]):
    """A plugin that configures the shell, not a profile (a saturation detector, a data source, a parser).
    It may be declared in a config's plugin list and referenced from the shell sections."""

    kind: ClassVar[str] = "system"
