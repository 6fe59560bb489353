"""single-profile-handler (Heimdall: e2e): run the one configured profile; its pick is the result.

result.targets = picker order of the single profile;  result.decision = ""
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, ConfigError, ProfileHandler, register
from scheduling.framework.plugin import RunProfile, State
from scheduling.types import Endpoint


@register("single-profile-handler")
class SingleProfileHandler(ProfileHandler[None]):
    def validate_profiles(self, profiles: Sequence[str], build: BuildContext) -> None:
        if len(profiles) != 1:
            raise ConfigError(
                build.source,
                build.path,
                f"single-profile-handler needs exactly one profile, got {len(profiles)} ({', '.join(profiles)}); "
                "declare pd-profile-handler for several profiles",
            )

    def handle(
        self,
        ctx: SchedulingContext,
        candidates: list[Endpoint],
        profiles: Sequence[str],
        run: RunProfile,
        state: State,
    ) -> SchedulingResult:
        name = profiles[0]
        pr = run(name, candidates)
        return SchedulingResult(targets=pr.targets, profile_results={name: pr})
