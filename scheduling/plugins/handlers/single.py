"""single-profile-handler (Heimdall: e2e): run the one configured profile; its pick is the result.

result.targets = picker order of the single profile;  result.decision = ""
"""

from __future__ import annotations

from scheduling.api import SchedulingResult
from scheduling.framework import ConfigError, ProfileHandler, register


@register("single-profile-handler")
class SingleProfileHandler(ProfileHandler):
    def validate_profiles(self, profiles, build):
        if len(profiles) != 1:
            raise ConfigError(
                build.source,
                build.path,
                f"single-profile-handler needs exactly one profile, got {len(profiles)} ({', '.join(profiles)}); "
                "declare pd-profile-handler for several profiles",
            )

    def handle(self, ctx, candidates, profiles, run, state):
        name = profiles[0]
        pr = run(name, candidates)
        return SchedulingResult(targets=pr.targets, profile_results={name: pr})
