"""ProfileScheduler: one loaded scheduling config (a handler and its profiles) behind the Scheduler protocol."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from scheduling.api import ProfileResult, SchedulingContext, SchedulingResult
from scheduling.framework.plugin import Plugin, ProfileHandler, State
from scheduling.framework.profile import Profile, Timer
from scheduling.types import Endpoint, ErrorCode, SchedulingError


class ProfileScheduler:
    """Runs the handler over named profiles. `name` is the config name reported in SchedulingResult.profile."""

    def __init__(
        self,
        name: str,
        handler: ProfileHandler,
        profiles: Mapping[str, Profile],
        *,
        rng: random.Random,
        timer: Timer | None = None,
    ) -> None:
        self.name = name
        self.handler = handler
        self.profiles = dict(profiles)
        self.rng = rng
        self.timer = timer
        self._profile_names: Sequence[str] = tuple(self.profiles)
        seen: dict[int, Plugin] = {}
        for plugin in [handler, *(p for prof in self.profiles.values() for p in prof.plugins())]:
            if plugin.stateful:
                seen.setdefault(id(plugin), plugin)
        self._stateful: list[Plugin] = list(seen.values())

    def plugins(self) -> list[Plugin]:
        seen: dict[int, Plugin] = {id(self.handler): self.handler}
        for prof in self.profiles.values():
            for p in prof.plugins():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def _runner(self, ctx: SchedulingContext, base: list[Endpoint], state: State):
        def run(profile: str, candidates: list[Endpoint] | None = None) -> ProfileResult:
            prof = self.profiles.get(profile)
            if prof is None:
                raise SchedulingError(
                    ErrorCode.INTERNAL, f"profile {profile!r} is not configured in {self.name!r}"
                )
            return prof.run(ctx, base if candidates is None else candidates, state, self.rng, self.timer)

        return run

    def schedule(
        self, ctx: SchedulingContext, candidates: Sequence[Endpoint] | None = None
    ) -> SchedulingResult:
        cands = list(ctx.candidates if candidates is None else candidates)
        if not cands:
            raise SchedulingError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"no endpoint available for model {ctx.request.target_model or ctx.request.model!r}",
            )
        state: State = {"rng": self.rng}
        result = self.handler.handle(ctx, cands, self._profile_names, self._runner(ctx, cands, state), state)
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
