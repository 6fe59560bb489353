"""Plugin base classes: Filter, Scorer, Picker and ProfileHandler.

A plugin is built once at config load as `cls(name, params, build)` and then called for every decision.
Per-decision data shared between plugins (prompt hashes, prefix matches) lives in `state`, a dict that
travels with the `SchedulingResult` so the lifecycle hooks see what the scoring saw.

Lifecycle: `pre_request(ctx, result, state)` runs once the pick is committed; `response_complete(ctx,
result, state)` runs once when the request ends. Only plugins that override them are called.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from scheduling.api import ProfileResult, SchedulingContext, SchedulingResult
from scheduling.types import Endpoint

State = dict[str, Any]


@dataclass
class BuildContext:
    """What a plugin may see while it is built.

    `shared` is scoped to one loaded scheduler: plugins that must agree on state (the prefix index) look it
    up there. `dialect` is "epp" (GIE/llm-d EndpointPickerConfig) or "heimdall" (SchedulingProfile).
    """

    source: str = "<builtin>"
    path: str = ""
    dialect: str = "epp"
    shared: dict[Any, Any] = field(default_factory=dict)


class Plugin:
    type_name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    Params: ClassVar[type | None] = None

    def __init__(self, name: str = "", params: Any = None, build: BuildContext | None = None) -> None:
        if params is None and self.Params is not None:
            params = self.Params()
        self.name = name or self.type_name
        self.params = params
        self.setup(build or BuildContext())

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class Filter(Plugin):
    kind: ClassVar[str] = "filter"

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        raise NotImplementedError


class Scorer(Plugin):
    kind: ClassVar[str] = "scorer"
    # True when the formula itself guarantees [0, 1] (checked by property tests): the framework skips clamping.
    clamped: ClassVar[bool] = False

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> Sequence[float]:
        """One score per candidate, in candidate order."""
        raise NotImplementedError


class FilterScorer(Scorer):
    """A scorer that can also act as a filter (when `filtering_enabled`)."""

    filtering_enabled: bool = False

    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        raise NotImplementedError


class Picker(Plugin):
    kind: ClassVar[str] = "picker"
    max_endpoints: int = 1

    def pick(
        self, ctx: SchedulingContext, candidates: list[Endpoint], totals: list[float], rng: random.Random
    ) -> list[int]:
        """Indices into candidates, best first, at most max_endpoints long, never empty."""
        raise NotImplementedError


RunProfile = Callable[[str, "list[Endpoint] | None"], ProfileResult]


class ProfileHandler(Plugin):
    kind: ClassVar[str] = "handler"

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
