"""global-strict-fairness-policy (GIE/llm-d flow control): ignore flows, serve the band's best request.

next request = the band's oldest (with FCFS ordering) -> FCFS across the whole band; GIE's default, which does not
keep a heavy flow from delaying the others. Referenced from a band's `fairnessPolicyRef`.
"""

from __future__ import annotations

from scheduling.api import GLOBAL_STRICT
from scheduling.framework import register
from scheduling.plugins.system._flow_policies import FairnessPolicy


@register(GLOBAL_STRICT)
class GlobalStrictFairness(FairnessPolicy):
    pass
