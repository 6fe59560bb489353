"""The worker side of `epp serve --workers N`: a private HTTP server on a unix socket the supervisor talks to.

    GET /-/status     {"index", "pid", "ready", "requests", "reloads": {file: n}, "failures": {file: n}, "bus": {...}}
    GET /metrics      this worker's own registry (its share of the counters, and the collectors computed at scrape
                      time: pool gauges, bus state), which the supervisor merges into the one /metrics
    everything else   the dashboard (the supervisor proxies the page of one worker, labelled as such)

The worker also makes sure it never outlives its supervisor: the kernel sends it SIGTERM when the supervisor dies
(PR_SET_PDEATHSIG), and a watchdog checks the parent as a fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from epp.cmd import Components

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def control_socket(directory: str, index: int) -> str:
    return str(Path(directory) / f"worker-{index}.sock")


def die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the parent (the supervisor) exits (Linux; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def status(app: Components) -> dict[str, Any]:
    requests = app.metrics.requests_total() if app.metrics is not None else 0.0
    bus = app.bus
    return {
        "index": app.settings.replicas.worker_index,
        "pid": os.getpid(),
        "ready": bool(app.datastore.synced),
        "requests": int(requests),
        "reloads": {name: w.reloads for name, w in app.watchers.items()},
        "failures": {name: w.failures for name, w in app.watchers.items()},
        "bus": None if bus is None else {
            "address": bus.bus.address, "transport": bus.bus.transport.describe(), "peers": len(bus.bus.peers), "live_peers": len(bus.bus.live_peers()),
            "published": bus.bus.published, "received": sum(bus.bus.received.values()),
            "dropped": sum(bus.bus.dropped.values()),
        },
    }


async def start_worker_control(app: Components) -> Callable[[], Awaitable[None]]:
    """Serve the control socket (and the dashboard) of this worker; returns the cleanup."""
    from prometheus_client import generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    replicas = app.settings.replicas
    assert replicas.worker_index is not None and replicas.worker_dir is not None, "a worker of --workers N"
    index, workers = replicas.worker_index, replicas.workers
    die_with_parent()
    web_app = web.Application()

    async def get_status(_: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(status(app)), content_type="application/json")

    async def get_metrics(_: web.Request) -> web.Response:
        assert app.metrics is not None
        return web.Response(body=generate_latest(app.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    web_app.router.add_get("/-/status", get_status)
    web_app.router.add_get("/metrics", get_metrics)
    dash = app.dashboard
    if dash is not None:
        dash.scope = {
            "label": f"worker {index + 1} of {workers}",
            "note": (f"This page shows one worker process (pid {os.getpid()}) of the {workers} that share the "
                     "gRPC port: its decisions, charts and explain. In-flight counts include every worker's (the "
                     "replica bus); /metrics sums all workers."),
        }
        dash.install(web_app)
    runner = web.AppRunner(web_app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    path = control_socket(replicas.worker_dir, index)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    await web.UnixSite(runner, path).start()
    if dash is not None:
        await dash.start()
    watchdog = asyncio.get_running_loop().create_task(_watch_parent(os.getppid()), name="worker-watchdog")

    async def cleanup() -> None:
        watchdog.cancel()
        if dash is not None:
            await dash.stop()
        await runner.cleanup()

    return cleanup


async def _watch_parent(parent: int) -> None:
    """A fallback for PR_SET_PDEATHSIG: if the supervisor is gone (we were re-parented), stop."""
    while True:
        await asyncio.sleep(1.0)
        if os.getppid() != parent:
            log.error("the supervisor (pid %d) is gone; this worker stops", parent)
            os.kill(os.getpid(), signal.SIGTERM)
            return
