"""`epp serve`: wires the datastore, sources, scheduler, director and servers together, then runs until stopped.

Endpoint sources, in order of precedence: `--endpoints-file` (standalone, hot-reloaded), `--endpoint-selector`
(pods by label, no InferencePool), `--pool-name` (the InferencePool in Kubernetes). A scheduling config given by
`--config-file` is hot-reloaded too: a bad new version is logged and the old one keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from epp.datastore import Datastore
from epp.director import Director, DirectorConfig
from epp.scrape.scraper import MetricsScraper
from epp.server import DEFAULT_TRANSPORT, StreamConfig, build_server
from scheduling.framework.model_scheduler import ModelScheduler

log = logging.getLogger("epp")


def build_scheduler(source: Any, rng: random.Random, name: str | None = None) -> Any:
    from scheduling.config import load_scheduler

    return load_scheduler(source, rng=rng, timer=time.perf_counter, name=name)


def load_scheduling(args: argparse.Namespace, rng: random.Random) -> Any:
    """The scheduler from --config-text / --config-file, or the built-in default profile."""
    from scheduling.config import parse_yaml

    if args.config_text:
        return build_scheduler([d.data for d in parse_yaml(args.config_text, "--config-text")], rng, "--config-text")
    if args.config_file:
        return build_scheduler(Path(args.config_file), rng)
    return build_scheduler(None, rng)


class App:
    """Everything `epp serve` runs; tests start it in-process with the same flags."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.datastore = Datastore(default_pool=args.pool_name)
        self.cleanups: list[Callable[[], Awaitable[Any]]] = []
        self.server: Any = None
        self.port = 0
        self.metrics: Any = None
        self.health: Any = None
        self.director: Director | None = None
        self.scraper: MetricsScraper | None = None
        self.eds: Any = None  # epp.xds.EdsService with --eds

    async def start(self) -> None:
        args = self.args
        await self._start_sources()
        if args.config_file:
            scheduler = await self._watch_scheduling_config(Path(args.config_file))
        else:
            scheduler = load_scheduling(args, self.rng)
        from epp.metrics import EppMetrics, start_metrics_server
        from epp.rewrite import choose_rewrite

        self.metrics = EppMetrics(self.datastore)
        from epp.outputs import director_outputs

        cfg = DirectorConfig(
            **director_outputs(args),
            fallbacks=args.fallbacks,
            conformance=args.enable_conformance_header,
            default_pool=args.pool_name,
            log_decisions=args.log_decisions,
            defer_commit_hooks=getattr(args, "defer_commit_hooks", True),
        )
        ds = self.datastore
        self.director = director = Director(
            ds, scheduler, cfg, metrics=self.metrics,
            rewrite=lambda model: choose_rewrite(ds.rewrites, model, self.rng) if ds.rewrites else None,
        )
        # Endpoint lifecycle: whatever scheduler is current forgets a departed endpoint (in-flight counts and the
        # unhealthy mark are the datastore's own; the scraper subscribes itself).
        ds.on_endpoint_removed(director.endpoint_removed)
        from epp.scrape.scraper import start_scraper

        self.scraper = await start_scraper(ds, interval=args.refresh_metrics_interval, timeout=1.0,
                                           staleness=args.metrics_staleness_threshold)
        self.cleanups.append(self.scraper.stop)
        self.apply_scheduler(scheduler)
        await self._start_grpc()
        if args.metrics_port:
            runner = await start_metrics_server(self.metrics, args.metrics_port)
            self.cleanups.append(runner.cleanup)

    async def _start_sources(self) -> None:
        args = self.args
        ds = self.datastore
        if args.endpoints_file:
            from epp.reload import FileWatcher, yaml_parser
            from epp.static_source import apply_static, parse_static_config

            path = Path(args.endpoints_file)
            # Polled every 0.5 s: an edit reaches Envoy (EDS) within a second.
            watcher = FileWatcher(path, parse=yaml_parser(parse_static_config, str(path)),
                                  apply=lambda parsed: apply_static(ds, *parsed), interval=0.5)
            await watcher.load_initial()
            watcher.start()
            self.cleanups.append(watcher.stop)
            return
        from epp.k8s.discovery import make_api_client, start_pool_discovery, start_selector_discovery

        if args.endpoint_selector:
            from epp.k8s.convert import parse_ports, parse_selector

            if not args.endpoint_target_ports:
                raise ValueError("--endpoint-selector needs --endpoint-target-ports")
            disc = await start_selector_discovery(
                ds, args.pool_namespace, parse_selector(args.endpoint_selector),
                parse_ports(args.endpoint_target_ports), pool_name=args.pool_name or "default",
                api=make_api_client(kubeconfig=args.kubeconfig),
            )
        elif args.pool_name:
            from epp.k8s import pool_resource

            pool_resource(args.pool_group)  # a clear error for an unknown group, before anything connects
            disc = await start_pool_discovery(ds, args.pool_name, args.pool_namespace,
                                              api=make_api_client(kubeconfig=args.kubeconfig),
                                              pool_group=args.pool_group)
        else:
            raise ValueError("no endpoint source: give --endpoints-file (standalone), --pool-name (an InferencePool "
                             "in Kubernetes) or --endpoint-selector with --endpoint-target-ports")
        self.cleanups.append(disc.stop)

    async def _watch_scheduling_config(self, path: Path) -> Any:
        """Load the scheduling config and keep watching it; returns the initial scheduler."""
        from epp.reload import FileWatcher

        def parse(text: str) -> Any:
            from scheduling.config import parse_yaml

            return build_scheduler([d.data for d in parse_yaml(text, str(path))], self.rng, str(path))

        def apply(scheduler: Any) -> None:
            # New requests use the new scheduler; in-flight ones finish on the one that picked for them.
            if self.director is not None:
                self.apply_scheduler(scheduler)
                log.info("scheduling config %s reloaded", path)

        watcher = FileWatcher(path, parse=parse, apply=apply)
        scheduler = await watcher.load_initial()
        watcher.start()
        self.cleanups.append(watcher.stop)
        return scheduler

    def apply_scheduler(self, scheduler: ModelScheduler) -> None:
        """Make `scheduler` current, with what its config's shell sections say (admission thresholds, scraping)."""
        from epp.admission import SaturationDetector

        shell = scheduler.shell
        sat = shell.saturation
        detector = SaturationDetector(sat.queue_depth_threshold, sat.kv_cache_util_threshold,
                                      sat.metrics_staleness_s, sat.headroom)
        assert self.director is not None, "the director is created before any scheduler is applied"
        self.director.scheduler = scheduler
        self.director.admission = detector.admit
        if self.scraper is not None:
            self.scraper.configure(shell.scrape)

    async def _start_grpc(self) -> None:
        args = self.args
        from epp.health import add_health_servicer, start_health_server

        stream_cfg = StreamConfig(args.request_body_mode, args.response_body_mode, args.max_body_bytes)
        extra: list[Callable[[Any], None]] = []
        if getattr(args, "eds", False):  # EDS for Envoy's pool cluster, on this same port (epp/xds)
            from epp.xds import EdsService, add_eds_service

            self.eds = EdsService(self.datastore)
            extra.append(lambda server: add_eds_service(server, self.eds))
        transport = getattr(args, "grpc_transport", DEFAULT_TRANSPORT)
        self.server, self.extproc = build_server(self.director, stream_cfg, extra_servicers=extra, metrics=self.metrics,
                                                 transport=transport)
        self.health = add_health_servicer(self.server, self.datastore)
        addr = f"{args.grpc_host}:{args.grpc_port}"
        if args.secure_serving:
            from epp.tls import server_credentials, server_ssl_context

            creds = server_ssl_context(args.cert_path) if transport == "h2" else server_credentials(args.cert_path)
            self.port = self.server.add_secure_port(addr, creds)
        else:
            self.port = self.server.add_insecure_port(addr)
        if not self.port:
            raise RuntimeError(f"cannot bind the gRPC port {addr}")
        await self.server.start()
        log.info("Pointsman serving ext_proc%s on %s:%d%s (%s transport)", " and EDS" if self.eds else "",
                 args.grpc_host, self.port, " (TLS)" if args.secure_serving else "", transport)
        if self.eds is not None:
            self.eds.start()
            self.cleanups.append(self.eds.stop)
        if args.grpc_health_port:
            health = await start_health_server(self.datastore, args.grpc_health_port, args.grpc_host)
            self.cleanups.append(lambda: health.stop(0))

    async def stop(self, grace: float = 5.0) -> None:
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        for fn in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                await fn()
        self.cleanups.clear()
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None


async def run(args: argparse.Namespace) -> int:
    app = App(args)
    try:
        await app.start()
    except Exception as e:
        log.error("cannot start: %s", e)
        await app.stop(0)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: draining in-flight streams")
    await app.stop(grace=10.0)
    return 0
