"""Flow-control policies (GIE/llm-d), referenced from the `flowControl` section rather than from a profile.

- `round-robin-fairness-policy`: the flows of a priority band with queued requests take turns, one dispatch each,
  so no flow can starve another whatever its volume (Pointsman's default).
- `global-strict-fairness-policy`: ignore flow boundaries and dispatch the band's oldest request (GIE's default:
  FCFS across the whole band).
- `fcfs-ordering-policy`: within a flow, the oldest request first (the only ordering Pointsman implements).
- `static-usage-limit-policy`: dispatch while the pool's saturation is below `threshold` (1.0: no gating).
- `priority-usage-limit-policy` (Pointsman): the same with a lower ceiling, `sheddableThreshold`, for sheddable
  priorities (< 0): they stop being dispatched while there is still room, which is kept for the others, so a
  critical request finds a free slot instead of waiting for a sheddable one to finish (requests cannot be
  preempted once dispatched).

A band's `fairnessPolicyRef` / `orderingPolicyRef` and the section's `usageLimitPolicyPluginRef` name either a
declared plugin of these types or, as in GIE where the defaults are injected under their type names, the type name
itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import FCFS, GLOBAL_STRICT, ROUND_ROBIN
from scheduling.framework import System, register
from scheduling.framework.params import bounded


class FairnessPolicy(System[None]):
    """Chooses which flow of a band is served next; the shell implements the choice named by `type_name`."""


class OrderingPolicy(System[None]):
    """Chooses which request of a flow is served next."""


@register(ROUND_ROBIN)
class RoundRobinFairness(FairnessPolicy):
    pass


@register(GLOBAL_STRICT)
class GlobalStrictFairness(FairnessPolicy):
    pass


@register(FCFS)
class FCFSOrdering(OrderingPolicy):
    pass


@dataclass(frozen=True)
class UsageLimitParams:
    threshold: float = bounded(1.0, min=1e-9, max=1.0)


@register("static-usage-limit-policy")
class StaticUsageLimit(System[UsageLimitParams]):
    Params = UsageLimitParams


@dataclass(frozen=True)
class PriorityUsageLimitParams:
    threshold: float = bounded(1.0, min=1e-9, max=1.0)
    sheddableThreshold: float = bounded(0.8, min=1e-9, max=1.0)


@register("priority-usage-limit-policy")
class PriorityUsageLimit(System[PriorityUsageLimitParams]):
    Params = PriorityUsageLimitParams
