"""fcfs-ordering-policy (GIE/llm-d flow control): within a flow, first come, first served.

next request of a flow = its oldest queued one. The only ordering Pointsman implements (edf-ordering-policy and
slo-deadline-ordering-policy are refused). Referenced from a band's `orderingPolicyRef`.
"""

from __future__ import annotations

from scheduling.api import FCFS
from scheduling.framework import register
from scheduling.plugins.system._flow_policies import OrderingPolicy


@register(FCFS)
class FCFSOrdering(OrderingPolicy):
    pass
