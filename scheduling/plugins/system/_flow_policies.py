"""The base classes of the flow-control policies (one policy per module, as for every plugin)."""

from __future__ import annotations

from scheduling.framework import System


class FairnessPolicy(System[None]):
    """Chooses which flow of a priority band is served next; the shell implements the choice its type names."""


class OrderingPolicy(System[None]):
    """Chooses which request of a flow is served next."""
