"""What the supervisor of `epp serve --workers N` serves: the metrics port and the gRPC health port.

Metrics port:
    GET /metrics      every worker in one exposition, with the GIE names unchanged:
                      - counters and histograms (requests, errors, durations, tokens, plugin and scheduler times):
                        prometheus-client's multiprocess mode. Each worker writes its values to memory-mapped files
                        in a private directory; the sum is exact, and a dead worker's counts stay in the sum (its
                        file stays), so the totals never go backwards when a worker is restarted;
                      - inference_objective_running_requests: the live workers' sum (`livesum`; a dead worker's
                        in-flight requests are gone with it);
                      - the gauges computed at scrape time from the fleet view (inference_pool_*, KV events,
                        route documents) are the same in every worker: one worker's are shown; the bus's carry a
                        `worker` label, one series per worker;
                      - pointsman_workers{state} and pointsman_worker_restarts_total describe the group.
    GET /-/workers    JSON: every worker's pid, readiness, restarts, config reloads, bus peers.
    anything else     the dashboard of the first live worker, proxied; the page says which worker it shows (a
                      decision stream and charts per process; the fleet's in-flight counts are every worker's).

Why multiprocess mode rather than summing scrapes of the workers: a restarted worker would make summed counters go
backwards (Prometheus would read that as a reset and over-count), and a scrape would cost N round trips.

gRPC health port: liveness SERVING while the supervisor runs; readiness (and the ext_proc service names) SERVING
only while every worker is up and ready (its datastore synced).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import grpc
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from epp.api import EppHealthServicer

if TYPE_CHECKING:
    from epp.workers.supervisor import Supervisor, Worker

log = logging.getLogger("epp.workers")

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length"}


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


async def _worker_families(sup: Supervisor, w: Worker) -> list[Metric]:
    try:
        async with sup.session(w).get("http://worker/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r:
            text = await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return []
    return list(text_string_to_metric_families(text))


async def exposition(sup: Supervisor) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    mp = MultiProcessCollector(registry, path=str(sup.metrics_dir))
    in_files = {m.name for m in mp.collect()}
    in_files |= {f"{n}_created" for n in in_files}  # the text parser reads a metric's _created line as its own
    live = sup.live()
    per_worker = await asyncio.gather(*(_worker_families(sup, w) for w in live))
    merged: dict[str, Metric] = {}
    for i, families in enumerate(per_worker):
        for fam in families:
            if fam.name in in_files or not fam.samples:
                continue  # the multiprocess files have it (summed over every worker), or it is empty
            per_process = all("worker" in s.labels for s in fam.samples)
            if i > 0 and not per_process:
                continue  # computed from the shared fleet view: the first worker's is everyone's
            if fam.name in merged:
                merged[fam.name].samples.extend(fam.samples)
            else:
                merged[fam.name] = fam
    workers = GaugeMetricFamily("pointsman_workers", "Worker processes of this Pointsman, by state.",
                                labels=["state"])
    now = time.monotonic()
    workers.add_metric(["configured"], len(sup.workers))
    workers.add_metric(["running"], sum(1 for w in sup.workers if w.alive))
    workers.add_metric(["ready"], sum(1 for w in sup.workers if w.ready(now)))
    restarts = CounterMetricFamily("pointsman_worker_restarts", "Worker processes restarted after they died.")
    restarts.add_metric([], sum(w.restarts for w in sup.workers))
    registry.register(_Families([*merged.values(), workers, restarts]))
    return generate_latest(registry)


@dataclass
class Front:
    runner: web.AppRunner | None
    health_server: grpc.aio.Server | None
    health: EppHealthServicer

    async def stop(self) -> None:
        if self.health_server is not None:
            await self.health_server.stop(0)
        if self.runner is not None:
            await self.runner.cleanup()


def _app(sup: Supervisor) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=await exposition(sup), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def workers(_: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(sup.describe()), content_type="application/json")

    async def proxy(request: web.Request) -> web.StreamResponse:
        live = sup.live()
        if not live:
            return web.json_response({"error": "no worker is up"}, status=503)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        try:
            async with sup.session(live[0]).request(
                request.method, f"http://worker{request.rel_url}", headers=headers, data=body or None,
                allow_redirects=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=2),
            ) as r:
                resp = web.StreamResponse(status=r.status, headers={
                    k: v for k, v in r.headers.items() if k.lower() not in HOP_BY_HOP})
                await resp.prepare(request)
                async for chunk in r.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, OSError) as e:
            return web.json_response({"error": f"worker {live[0].index}: {type(e).__name__}"}, status=502)

    guards = []
    if sup.settings.metrics_auth.enabled:  # --metrics-endpoint-auth (epp/api/metrics_auth.py)
        from epp.api import KubeReviews, MetricsAuth
        from epp.fleet.k8s import make_api_client

        api = make_api_client(kubeconfig=sup.settings.sources.kubeconfig)
        guards.append(MetricsAuth(KubeReviews(api)).middleware(("/metrics", "/-/workers")))
    app = web.Application(middlewares=guards)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/-/workers", workers)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


async def start_front(sup: Supervisor) -> Front:
    s = sup.settings.server
    health = EppHealthServicer(sup.ready, leader_election=sup.settings.compat.leader_election)
    health_server = None
    if s.health_port:
        from grpc_health.v1 import health_pb2_grpc

        health_server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health, health_server)
        addr = f"{s.grpc_host}:{s.health_port}"
        if not health_server.add_insecure_port(addr):
            raise RuntimeError(f"health server: cannot listen on {addr}")
        await health_server.start()
    runner = None
    if s.metrics_port:
        runner = web.AppRunner(_app(sup), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, "0.0.0.0", s.metrics_port).start()
        log.info("metrics of all %d workers on port %d/metrics (the dashboard is one worker's)",
                 sup.settings.replicas.workers, s.metrics_port)
    return Front(runner, health_server, health)


__all__ = ["Front", "exposition", "start_front"]
