"""ProfileScheduler: one loaded scheduling config (a handler and its profiles) behind the Scheduler protocol.

`declared` holds every plugin the config declared (producers and system plugins too, which no profile references).
After the loader wires shared data (scheduling/framework/data.py), `finalize()` fixes the order of the request
lifecycle hooks: stateful plugins first, then the producers their plugins read, so a producer records after every
plugin has seen the decision.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from scheduling.api import ProfileResult, SchedulingContext, SchedulingResult
from scheduling.framework.plugin import Plugin, ProfileHandler, RunProfile, State
from scheduling.framework.profile import Profile, Timer
from scheduling.types import Endpoint, ErrorCode, SchedulingError


class ProfileScheduler:
    """Runs the handler over named profiles. `name` is the config name reported in SchedulingResult.profile."""

    def __init__(
        self,
        name: str,
        handler: ProfileHandler[Any],
        profiles: Mapping[str, Profile],
        *,
        rng: random.Random,
        timer: Timer | None = None,
        declared: Sequence[Plugin[Any]] = (),
    ) -> None:
        self.name = name
        self.handler = handler
        self.profiles = dict(profiles)
        self.rng = rng
        self.timer = timer
        self.declared = list(declared)
        self._profile_names: Sequence[str] = tuple(self.profiles)
        self._stateful: list[Plugin[Any]] = []
        self.finalize()

    def finalize(self) -> None:
        """(Re)compute the lifecycle order once shared data is wired."""
        used = self.used_plugins()
        stateful = [p for p in used if p.stateful]
        producers: dict[int, Plugin[Any]] = {}
        for plugin in used:
            for producer in plugin.producers.values():
                producers.setdefault(id(producer), producer)
        self._stateful = stateful + [p for p in producers.values() if p not in stateful]
        self._data: dict[str, Plugin[Any]] = {}
        for plugin in used:
            for key, producer in plugin.producers.items():
                self._data.setdefault(key.name, producer)

    def producer(self, name: str) -> Plugin[Any] | None:
        """The producer of the shared data named `name` (a DataKey name) that a plugin of a profile reads, if any:
        how the shell learns what a decision needs before it is made (e.g. the request's token ids)."""
        return self._data.get(name)

    def used_plugins(self) -> list[Plugin[Any]]:
        """The handler and every plugin of every profile (what a decision can call)."""
        seen: dict[int, Plugin[Any]] = {id(self.handler): self.handler}
        for prof in self.profiles.values():
            for p in prof.plugins():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def plugins(self) -> list[Plugin[Any]]:
        """Everything this scheduler owns: used and declared plugins and the producers they read."""
        seen: dict[int, Plugin[Any]] = {}
        for p in [*self.used_plugins(), *self.declared]:
            seen.setdefault(id(p), p)
            for producer in p.producers.values():
                seen.setdefault(id(producer), producer)
        return list(seen.values())

    def _runner(
        self, ctx: SchedulingContext, base: list[Endpoint], state: State, rng: random.Random
    ) -> RunProfile:
        def run(profile: str, candidates: list[Endpoint] | None = None) -> ProfileResult:
            prof = self.profiles.get(profile)
            if prof is None:
                raise SchedulingError(
                    ErrorCode.INTERNAL, f"profile {profile!r} is not configured in {self.name!r}"
                )
            return prof.run(ctx, base if candidates is None else candidates, state, rng, self.timer)

        return run

    def schedule(
        self,
        ctx: SchedulingContext,
        candidates: Sequence[Endpoint] | None = None,
        *,
        rng: random.Random | None = None,
    ) -> SchedulingResult:
        """Decide. `rng` replaces the scheduler's random source for this decision (a dry run passes a copy, so it
        neither consumes nor changes the sequence real decisions see)."""
        cands = list(ctx.candidates if candidates is None else candidates)
        if not cands:
            raise SchedulingError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"no endpoint available for model {ctx.request.target_model or ctx.request.model!r}",
            )
        rng = self.rng if rng is None else rng
        state: State = {"rng": rng}
        result = self.handler.handle(ctx, cands, self._profile_names, self._runner(ctx, cands, state, rng), state)
        result.state = state
        result.profile = self.name
        return result

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        state = result.state
        for plugin in self._stateful:
            plugin.pre_request(ctx, result, state)

    def response_complete(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        state = result.state
        for plugin in self._stateful:
            plugin.response_complete(ctx, result, state)
