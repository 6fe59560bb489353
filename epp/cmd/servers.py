"""`epp serve`'s servers: the gRPC port (ext_proc, Pointsman's API, EDS and health), the separate health port,
the worker's control socket, and the metrics port with the dashboard.

The gRPC server itself is not closed by the runner: `App.stop` drains it last, after every component closed
(queued requests are answered 503 and EDS streams end first: docs/flowcontrol.md, docs/envoy.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epp.api import PointsmanService, add_health_servicer, start_health_server, start_metrics_server
from epp.api.pb import pointsman_pb2_grpc
from epp.extproc import build_server
from epp.extproc.settings import ServerSettings

if TYPE_CHECKING:
    from epp.cmd.components import Components

log = logging.getLogger("epp")


async def make_dashboard(app: Components) -> None:
    """The live page on the metrics port, reading the decision recorder that observes the request path."""
    from epp.cmd.request import dashboard_on

    if app.recorder is None or not dashboard_on(app):
        return
    from epp.api.dashboard import Dashboard

    d, scheduling = app.settings.dashboard, app.settings.scheduling
    app.dashboard = Dashboard(app.current(), recorder=app.recorder, passive=app.passive, prefix=d.path_prefix,
                              token=d.token, config_source=lambda: scheduling.source, watchers=app.watchers,
                              started_at=app.started_at)
    app.holders.append(app.dashboard.explainer)
    app.dashboard.explainer.recorder = app.recorder  # receipts (epp/observe/receipts.py)
    app.dashboard.shadow = app.observe.shadow if app.observe is not None else None
    app.dashboard.rows = d.decisions


async def start_grpc(app: Components) -> None:
    """The gRPC port: ext_proc and the Pointsman API over the current director, EDS (with --eds) and health; and
    the separate health port (kubelet probes)."""
    s = app.settings.server
    extra: list[Callable[[Any], object]] = []
    if s.eds:  # EDS for Envoy's pool cluster, on this same port (epp/xds)
        from epp.xds import EdsService, add_eds_service

        app.eds = eds = EdsService(app.datastore)
        extra.append(lambda server: add_eds_service(server, eds))
    api = PointsmanService(app.current(), app.passive)
    api.recorder = app.recorder  # receipts: the GetReceipt RPC (epp/observe/receipts.py)
    extra.append(lambda server: pointsman_pb2_grpc.add_PointsmanServicer_to_server(api, server))
    app.server, app.extproc = build_server(app.current(), s.stream, extra_servicers=extra, metrics=app.metrics,
                                           transport=s.transport, reuse_port=app.settings.worker,
                                           limits=s.limits)
    app.holders += [app.extproc, api]
    app.health = add_health_servicer(app.server, app.datastore, leader_election=app.settings.compat.leader_election)
    app.port = _bind(app, s)
    await app.server.start()
    log.info("Pointsman serving ext_proc%s on %s:%d%s (%s transport)", " and EDS" if app.eds else "",
             s.grpc_host, app.port, " (TLS)" if s.secure else "", s.transport)
    if app.eds is not None:
        app.eds.start()
        app.runner.own("EDS", app.eds)
    if s.health_port:
        health = await start_health_server(app.datastore, s.health_port, s.grpc_host, servicer=app.health)
        app.runner.add("health port", lambda: health.stop(0))


def _bind(app: Components, s: ServerSettings) -> int:
    server = app.server
    if s.secure and s.cert_reload and s.cert_path:  # --enable-cert-reload: new handshakes get a rotated pair
        from epp.h2grpc import tls

        reloader = tls.CertReloader(s.cert_path, lambda key, crt: None)
        if s.transport == "h2":
            from epp.h2grpc import server_ssl_context as h2_context

            ctx = h2_context(*reloader.pair)
            reloader.apply = lambda key, crt: tls.load_pem_pair(ctx, key, crt)
            port = server.add_secure_port(s.address, ctx)
        else:
            port = server.add_secure_port(s.address, tls.reloading_credentials(reloader))
        reloader.start()
        app.runner.own("certificate reload", reloader)
    elif s.secure:
        from epp.h2grpc import tls

        creds = tls.server_ssl_context(s.cert_path) if s.transport == "h2" else tls.server_credentials(s.cert_path)
        port = server.add_secure_port(s.address, creds)
    else:
        port = server.add_insecure_port(s.address)
    if not port:
        raise RuntimeError(f"cannot bind the gRPC port {s.address}")
    return int(port)


async def start_worker_control(app: Components) -> None:
    """A worker of `epp serve --workers N` (epp/workers): its control socket, which the supervisor talks to."""
    if not app.settings.worker:
        return
    from epp.workers import start_worker_control as start

    app.runner.add("worker control", await start(app))


async def start_metrics(app: Components) -> None:
    """The metrics port: /metrics, and the dashboard when there is one."""
    port = app.settings.server.metrics_port
    if not port:
        return
    assert app.metrics is not None
    dash = app.dashboard
    guards = []
    if app.settings.metrics_auth.enabled:  # --metrics-endpoint-auth: Kubernetes says who may read /metrics
        from epp.api import KubeReviews, MetricsAuth

        guards.append(MetricsAuth(KubeReviews(app.kube.api())).middleware())
        log.info("/metrics needs a bearer token allowed to get /metrics (TokenReview + SubjectAccessReview)")
    runner = await start_metrics_server(app.metrics, port, setup=dash.install if dash is not None else None,
                                        middlewares=guards)
    app.runner.add("metrics port", runner.cleanup)
    if dash is not None:
        await dash.start()
        app.runner.own("dashboard", dash)
        log.info("dashboard on port %d at %s%s", port, dash.prefix,
                 " (token required)" if app.settings.dashboard.token else "")


__all__ = ["make_dashboard", "start_grpc", "start_metrics", "start_worker_control"]
