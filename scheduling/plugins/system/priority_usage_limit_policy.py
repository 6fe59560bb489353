"""priority-usage-limit-policy (Pointsman flow control): a lower ceiling for sheddable priorities.

limit(p) = sheddableThreshold if p < 0 else threshold; priority p is dispatched while pool saturation < limit(p). Requests cannot be
preempted once dispatched: stopping sheddable ones at, say, 0.75 keeps a quarter of the pool free for the others,
so a critical request finds room instead of waiting for a sheddable one to finish. Referenced from the
`flowControl` section's `usageLimitPolicyPluginRef`.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.framework import System, register
from scheduling.framework.params import bounded


@dataclass(frozen=True)
class Params:
    threshold: float = bounded(1.0, min=1e-9, max=1.0)
    sheddableThreshold: float = bounded(0.8, min=1e-9, max=1.0)


@register("priority-usage-limit-policy")
class PriorityUsageLimit(System[Params]):
    Params = Params
