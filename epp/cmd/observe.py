"""`epp serve`'s observability (epp/observe): OpenTelemetry traces, decision ids and receipts, the shadow profile.

Started before the director is built: the director carries the decision ids and tracing, and the request
observers include tracing's and the shadow's (epp/cmd/request.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.observe import Observability

if TYPE_CHECKING:
    from epp.cmd.components import Components


async def start_observability(app: Components) -> None:
    assert app.metrics is not None
    app.observe = obs = Observability(app.settings.observe)
    app.runner.add("observability", obs.close)
    await obs.start(app.metrics.registry, app.settings.scheduling.seed)


__all__ = ["start_observability"]
