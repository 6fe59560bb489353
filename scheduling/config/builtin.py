"""The built-in default scheduling config, used when nothing else applies."""

from __future__ import annotations

import random
from typing import Any

from scheduling.framework import BuildContext, Profile, ProfileScheduler, Timer, create

BUILTIN_NAME = "default"


def builtin_scheduler(
    *, rng: random.Random, timer: Timer | None = None, shared: dict[Any, Any] | None = None
) -> ProfileScheduler:
    """queue-scorer ×2, kv-cache-utilization-scorer ×2, prefix-cache-scorer ×3, max-score-picker."""
    build = BuildContext(
        source="<builtin default>", path="", dialect="epp", shared={} if shared is None else shared
    )
    profile = Profile(
        "default",
        [],
        [
            (create("queue-scorer", build=build), 2.0),  # type: ignore[list-item]
            (create("kv-cache-utilization-scorer", build=build), 2.0),  # type: ignore[list-item]
            (create("prefix-cache-scorer", build=build), 3.0),  # type: ignore[list-item]
        ],
        create("max-score-picker", build=build),  # type: ignore[arg-type]
    )
    handler = create("single-profile-handler", build=build)
    return ProfileScheduler(BUILTIN_NAME, handler, {"default": profile}, rng=rng, timer=timer)  # type: ignore[arg-type]
