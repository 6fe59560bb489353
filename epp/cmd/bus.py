"""`epp serve`'s replica bus (epp/bus): shared in-flight load and replicated plugin state, when the settings turn
it on (peers, a Service, a NATS URL, or several workers). ZMQ, msgpack and nats-py (the 'replicas' extra) are
imported only then."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import require

if TYPE_CHECKING:
    from epp.cmd.components import Components


async def start_replica_bus(app: Components) -> None:
    settings = app.settings.replicas.bus
    if settings is None:
        return
    for module in ("zmq", "msgpack", *(("nats",) if settings.nats else ())):
        require("replicas", module, "the replica bus")
    from epp.bus import register_bus_metrics, start_bus

    api = app.kube.api() if settings.service else None
    app.bus = app.runner.own("replica bus", await start_bus(settings, app.datastore, api,
                                                            app.settings.sources.pool_namespace))
    assert app.metrics is not None
    register_bus_metrics(app.metrics.registry, app.bus, app.settings.replicas.worker_index)


__all__ = ["start_replica_bus"]
