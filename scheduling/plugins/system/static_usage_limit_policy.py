"""static-usage-limit-policy (GIE/llm-d flow control): one admission ceiling for every priority.

limit(p) = threshold for every priority p (default 1.0: no gating below saturation); dispatch while pool
saturation < limit(p). Referenced from the
`flowControl` section's `usageLimitPolicyPluginRef`; the default when none is named.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.framework import System, register
from scheduling.framework.params import bounded


@dataclass(frozen=True)
class Params:
    threshold: float = bounded(1.0, min=1e-9, max=1.0)


@register("static-usage-limit-policy")
class StaticUsageLimit(System[Params]):
    Params = Params
