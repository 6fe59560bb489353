"""Flow control (GIE v1.5 semantics): queue requests while their pool is saturated, by priority band and flow.

- `queues`: the pure queue structures (bands, flows, fairness, FCFS, capacity accounting);
- `controller`: the asyncio controller (admission, dispatch cycles, TTLs, metrics);
- `hold`: class-aware dispatch: loose requests held back while the endpoint they would take has tight work
  pending (`SloHolds`; the policy is scheduling/latency/hold.py);
- `pressure`: the pool saturation the controller dispatches by (the configured detector, corrected for dispatches
  the scrapes have not seen yet).

The director's exchange calls `FlowController.admit` after the admission gates and tokenization, with a dispatch
callback that re-resolves the candidates and schedules and commits the request when its turn comes (its turn:
epp/request/queueing.py). Explain's dry run asks `FlowController.preview`, which answers what `admit` would and
changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.flowcontrol.controller import (
        DEFAULT_FLOW,
        DROPPED_REASON,
        FAIRNESS_HEADER,
        FAIRNESS_HEADERS,
        FlowController,
        fairness_id,
    )
    from epp.flowcontrol.hold import SloHolds
    from epp.flowcontrol.pressure import PoolPressure

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562).
_LAZY = {
    "DEFAULT_FLOW": "controller", "DROPPED_REASON": "controller", "FAIRNESS_HEADER": "controller",
    "FAIRNESS_HEADERS": "controller", "FlowController": "controller", "fairness_id": "controller",
    "PoolPressure": "pressure", "SloHolds": "hold",
}

__all__ = ["DEFAULT_FLOW", "DROPPED_REASON", "FAIRNESS_HEADER", "FAIRNESS_HEADERS", "FlowController", "PoolPressure",
           "SloHolds", "fairness_id"]


__getattr__ = lazy_exports(__name__, _LAZY)
