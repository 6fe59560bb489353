"""round-robin-fairness-policy (GIE/llm-d flow control): the flows of a priority band take turns.

next flow = the first of the band's turn list; after its dispatch it goes to the end -> every flow with queued
requests gets one dispatch per turn, whatever its volume, so no flow starves another. Pointsman's default for every
band. Referenced from a band's `fairnessPolicyRef` (by a declared plugin's name or by this type name).
"""

from __future__ import annotations

from scheduling.api import ROUND_ROBIN
from scheduling.framework import register
from scheduling.plugins.system._flow_policies import FairnessPolicy


@register(ROUND_ROBIN)
class RoundRobinFairness(FairnessPolicy):
    pass
