"""`epp serve`'s routing layer: route documents (Kthena's ModelRoute, ModelServer and ExternalModelProvider;
LLMKube's ModelRouter) from files and/or Kubernetes, and the token rate limits and budgets they carry."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from epp.aio import cancel_and_wait

if TYPE_CHECKING:
    from epp.cmd.components import Components


async def start_routing(app: Components) -> None:
    """The routing service (docs/coming-from-kthena.md), when route documents are given."""
    s = app.settings.routes
    if not s.enabled:
        return
    from epp.routing import RoutingService

    outputs = app.settings.request.outputs
    svc = RoutingService(app.datastore, app.rng, secrets_dir=s.provider_secrets_dir,
                         provider_header=s.provider_header, metrics=app.metrics,
                         gateway_headers=(outputs.base_model_header or "", outputs.ai_gateway_model_header or ""))
    app.routing = app.runner.own("routing", svc)
    plain = app.settings.sources.kind is not None  # another source serves pools too, and says when it synced
    if s.watch:
        watch = svc.start_kubernetes(app.kube.api(), app.settings.sources.pool_namespace, pods=app.kube.pod_pools())
        if not plain:
            async def synced() -> None:
                await watch.synced.wait()
                app.datastore.synced = True

            task = asyncio.get_running_loop().create_task(synced())
            app.runner.add("routes synced", lambda: cancel_and_wait(task))
    elif app.kube.pods is not None:
        svc.set_pods(app.kube.pods)
    for f in s.files:
        await svc.add_file(Path(f))
    if not plain and not s.watch:
        app.datastore.synced = True


async def start_rate_limits(app: Components) -> None:
    """Routes may carry token rate limits (Kthena's ModelRoute.rateLimit) and LLMKube budgets: admitters, after
    the sheddable check (epp/ratelimit)."""
    if app.routing is None:
        return
    from epp.ratelimit import start_rate_limits as start

    assert app.metrics is not None
    app.rate_limits = app.runner.own("rate limits", await start(app.settings.ratelimit, app.metrics.registry,
                                                                 app.routing))


__all__ = ["start_rate_limits", "start_routing"]
