"""The built-in default scheduling config, used when nothing else applies.

It is Pointsman's estimated-latency profile (deploy/profiles/estimated-latency.yaml spells out its parameters):
the estimated-latency-scorer and the agent-session-scorer (weight 1 each: it scores 0 for requests that name no
session, so they are placed on predicted latency alone), with the max-score picker. It trades prefix affinity against load in one
currency (predicted seconds), which measured best in every regime of the routing benchmark, where GIE's default
weights (deploy/profiles/gie-default.yaml) collapsed under skewed prefix popularity (docs/routing-benchmark.md).
"""

from __future__ import annotations

import random
from typing import Any

from scheduling.framework import (
    BuildContext,
    Profile,
    ProfileScheduler,
    Timer,
    create_handler,
    create_picker,
    create_scorer,
)

BUILTIN_NAME = "default"
TIE_TOLERANCE = 0.02  # near-ties (within 2%) go to the least loaded candidate: spreading, not starving


def builtin_scheduler(
    *, rng: random.Random, timer: Timer | None = None, shared: dict[Any, Any] | None = None
) -> ProfileScheduler:
    """estimated-latency-scorer ×1, agent-session-scorer ×1, max-score-picker (tieTolerance 0.02)."""
    build = BuildContext(
        source="<builtin default>", path="", dialect="epp", shared={} if shared is None else shared
    )
    profile = Profile(
        "default",
        [],
        [(create_scorer("estimated-latency-scorer", build=build), 1.0),
         (create_scorer("agent-session-scorer", build=build), 1.0)],
        create_picker("max-score-picker", params={"tieTolerance": TIE_TOLERANCE}, build=build),
    )
    handler = create_handler("single-profile-handler", build=build)
    return ProfileScheduler(BUILTIN_NAME, handler, {"default": profile}, rng=rng, timer=timer)
