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
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.extproc.server import DEFAULT_TRANSPORT, build_server
from epp.extproc.session import StreamConfig
from epp.fleet.datastore import Datastore
from epp.fleet.scrape.scraper import MetricsScraper
from epp.request.director import Director, DirectorConfig
from scheduling.framework.model_scheduler import ModelScheduler

if TYPE_CHECKING:
    import grpc
    import kubernetes.client as k8s

    from epp.api.dashboard import Dashboard
    from epp.api.dashboard.recorder import DecisionRecorder
    from epp.api.health import EppHealthServicer
    from epp.api.metrics import EppMetrics
    from epp.bus.shell import BusRuntime
    from epp.fleet.k8s.pods import PodPools
    from epp.fleet.kvevents.service import PreciseService
    from epp.fleet.passive import PassiveHealth
    from epp.fleet.reload import FileWatcher
    from epp.fleet.saturation import Detector
    from epp.flowcontrol import FlowController, PoolPressure
    from epp.ratelimit.gate import RateLimitGate
    from epp.request.admit import Admitter
    from epp.request.observe import RequestObserver
    from epp.routing.service import RoutingService
    from epp.tokenize.shell import RequestTokens
    from epp.xds import EdsService
    from scheduling.api import FlowControl
    from scheduling.config.loader import Source

log = logging.getLogger("epp")


def build_scheduler(source: Source, rng: random.Random, name: str | None = None,
                    services: Mapping[str, Any] | None = None) -> ModelScheduler:
    from scheduling.config import load_scheduler

    return load_scheduler(source, rng=rng, timer=time.perf_counter, name=name, services=services)


def load_scheduling(args: argparse.Namespace, rng: random.Random,
                    services: Mapping[str, Any] | None = None) -> ModelScheduler:
    """The scheduler from --config-text / --config-file, or the built-in default profile."""
    from scheduling.config import parse_yaml

    if args.config_text:
        docs = [d.data for d in parse_yaml(args.config_text, "--config-text")]
        return build_scheduler(docs, rng, "--config-text", services)
    if args.config_file:
        return build_scheduler(Path(args.config_file), rng, services=services)
    return build_scheduler(None, rng, services=services)


class App:
    """Everything `epp serve` runs; tests start it in-process with the same flags."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.datastore = Datastore(default_pool=args.pool_name)
        self.cleanups: list[Callable[[], Awaitable[object]]] = []
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.metrics: EppMetrics | None = None
        self.health: EppHealthServicer | None = None
        self.director: Director | None = None
        self.scraper: MetricsScraper | None = None
        self.eds: EdsService | None = None  # with --eds
        self.dashboard: Dashboard | None = None
        self.watchers: dict[str, FileWatcher[Any]] = {}  # hot-reloaded files by what they hold (shown on the dashboard)
        self.started_at = time.time()
        self.routing: RoutingService | None = None  # with --routes-file / --watch-routes
        self.ratelimit: RateLimitGate | None = None  # token rate limits of the routes (epp/ratelimit)
        self.pods: PodPools | None = None  # shared by the watchers that serve several pools
        self.bus: BusRuntime | None = None  # with --bus-peers / --bus-service / --workers
        self._api: k8s.ApiClient | None = None
        self.precise: PreciseService | None = None  # the precise prefix index and its KV-event subscriptions
        self.tokens: RequestTokens | None = None  # tokenizes requests for configs that read token ids
        self.flow: FlowController | None = None  # while the config turns flow control on
        self.pressure: PoolPressure | None = None  # the pool saturation flow control reads
        self._background: set[asyncio.Task[Any]] = set()
        self.outputs: dict[str, Any] = {}  # the DirectorConfig fields of --data-plane and the output flags
        self.admitters: list[Admitter] = []  # after the sheddable check: rate limits, budgets
        self.passive: PassiveHealth | None = None
        self.recorder: DecisionRecorder | None = None  # the dashboard's record of decisions
        self._holders: list[Any] = []  # what serves with the current director (swapped whole on reload)

    async def start(self) -> None:
        args = self.args
        from epp.api.metrics import EppMetrics, RequestMetrics, start_metrics_server
        from epp.fleet.rewrites import choose_rewrite
        from epp.request.outputs import director_outputs

        self.outputs = director_outputs(args)  # first: a combination that cannot route fails before anything starts
        self.metrics = EppMetrics(self.datastore)
        self._start_precise()
        await self._start_sources()
        await self._start_routing()
        if args.config_file:
            scheduler = await self._watch_scheduling_config(Path(args.config_file))
        else:
            scheduler = load_scheduling(args, self.rng, self.services())
        cfg = DirectorConfig(
            **self.outputs,
            fallbacks=args.fallbacks,
            conformance=args.enable_conformance_header,
            default_pool=args.pool_name,
            log_decisions=args.log_decisions,
        )
        ds = self.datastore
        from epp.api.slo_metrics import SloMetrics  # issue 23: predicted and actual SLO attainment

        observers: list[RequestObserver] = [RequestMetrics(self.metrics), SloMetrics(self.metrics.registry)]
        if self.routing is not None:  # routes may carry token rate limits (Kthena's ModelRoute.rateLimit)
            from epp.ratelimit.wiring import build_budgets, build_gate

            self.ratelimit = await build_gate(args, self.metrics.registry, self.routing.router.table)
            self.cleanups.append(self.ratelimit.limiter.close)
            self.admitters.append(self.ratelimit)
            self.admitters.append(build_budgets(self.ratelimit, self.routing, self.cleanups))  # LLMKube budgets
            observers.extend(self.routing.router.runtimes)  # e.g. LLMKube's quarantine and first-byte latency
        # Endpoint lifecycle: whatever scheduler is current forgets a departed endpoint (in-flight counts and the
        # unhealthy mark are the datastore's own; the scraper subscribes itself).
        ds.on_endpoint_removed(lambda key: self._current().scheduler.endpoint_removed(key))
        from epp.fleet.saturation import SaturationDetector
        from epp.flowcontrol import PoolPressure

        self.pressure = PoolPressure(ds, ds.routable, SaturationDetector())
        ds.on_endpoint_removed(self.pressure.forget)
        ds.on_metrics_updated(self._metrics_arrived)
        self.cleanups.append(self._stop_flow_control)
        from epp.fleet.scrape.scraper import ScrapeSettings, bounded_timeout, start_scraper

        staleness = args.metrics_staleness_threshold
        timeout = getattr(args, "scrape_timeout", None) or bounded_timeout(staleness, 3, args.refresh_metrics_interval)
        self.scraper = await start_scraper(ds, interval=args.refresh_metrics_interval, timeout=timeout,
                                           staleness=staleness,
                                           backoff_max=ScrapeSettings.from_args(args).backoff_max)  # issue 23
        self.cleanups.append(self.scraper.stop)
        await self._start_bus()
        self._start_passive_health()
        if self.passive is not None:
            observers.append(self.passive)
        if args.dashboard and (args.metrics_port or args.worker_index is not None):
            from epp.api.dashboard.recorder import DecisionRecorder, RecorderObserver

            self.recorder = DecisionRecorder(args.dashboard_decisions)
            observers.append(RecorderObserver(self.recorder))
        self.director = Director(
            ds, scheduler, cfg,
            rewrite=lambda model: choose_rewrite(ds.rewrites, model, self.rng) if ds.rewrites else None,
            router=self.routing.router if self.routing is not None else None,
            tokens=self.tokens,  # precise prefix routing: tokenize for configs that read tokens
            observers=tuple(observers),
            probe=self.passive.probe_for if self.passive is not None else None,  # issue 23: probes whatever scores
        )
        self.apply_scheduler(scheduler)
        from epp.api.model_metrics import ModelCollector  # issue 23: timings and prefix trust per endpoint

        self.metrics.registry.register(ModelCollector(lambda: self.director, ds))
        if self.recorder is not None:
            self._make_dashboard()
        await self._start_grpc()
        if args.worker_index is not None:  # HOOK (replicas): a worker of `epp serve --workers N` (epp/workers)
            from epp.workers.control import start_worker_control

            self.cleanups.append(await start_worker_control(self))
        if args.metrics_port:
            dash = self.dashboard
            runner = await start_metrics_server(self.metrics, args.metrics_port,
                                                setup=dash.install if dash is not None else None)
            self.cleanups.append(runner.cleanup)
            if dash is not None:
                await dash.start()
                self.cleanups.append(dash.stop)
                log.info("dashboard on port %d at %s%s", args.metrics_port, dash.prefix,
                         " (token required)" if args.dashboard_token else "")

    def _current(self) -> Director:
        assert self.director is not None, "the director is built before any request or endpoint event"
        return self.director

    def publish(self, director: Director) -> None:
        """Make `director` the one new streams, explain and the dashboard use (streams keep the one they began
        with)."""
        self.director = director
        for holder in self._holders:
            holder.director = director

    def _start_precise(self) -> None:
        """The precise prefix index with its KV-event subscriptions (following the datastore), and tokenization
        (docs/kv-events.md). Both are the shell's: they outlive scheduling-config reloads."""
        from epp.fleet.kvevents.service import PreciseService
        from epp.tokenize.shell import tokens_from_args

        registry = self.metrics.registry if self.metrics is not None else None
        self.precise = PreciseService.from_args(self.args, self.datastore, registry)
        self.precise.attach()
        self.cleanups.append(self.precise.close)
        self.tokens = tokens_from_args(self.args, registry)
        engine = self.tokens.tokenizer.engine
        if engine is not None:
            self.cleanups.append(engine.close)

    def services(self) -> dict[str, Any]:
        """What the shell lends every loaded scheduler (scheduling.framework.plugin.BuildContext.services)."""
        return self.precise.services() if self.precise is not None else {}

    async def _start_bus(self) -> None:
        """The replica bus (epp/bus/shell.py): shared in-flight load and replicated plugin state."""
        from epp.bus.shell import bus_settings, start_bus

        settings = bus_settings(self.args)
        if settings is None:
            return
        self.bus = bus = await start_bus(self.args, self.datastore, self.api() if settings.service else None)
        if bus is None:
            return
        self.cleanups.append(bus.stop)
        assert self.metrics is not None
        from epp.bus.metrics import register_bus_metrics

        register_bus_metrics(self.metrics.registry, self.bus, self.args.worker_index)

    def _make_dashboard(self) -> None:
        """The live page on the metrics port, reading the decision recorder that observes the request path."""
        args = self.args
        from epp.api.dashboard import Dashboard

        def source() -> str:
            if args.config_file:
                return f"file {args.config_file}"
            return "inline --config-text" if args.config_text else "built-in default (the estimated-latency profile)"

        assert self.recorder is not None
        self.dashboard = Dashboard(self._current(), recorder=self.recorder, passive=self.passive,
                                   prefix=args.dashboard_path_prefix, token=args.dashboard_token,
                                   config_source=source, watchers=self.watchers, started_at=self.started_at)
        self._holders.append(self.dashboard.explainer)

    async def _start_sources(self) -> None:
        args = self.args
        ds = self.datastore
        if args.endpoints_file:
            from epp.fleet.reload import FileWatcher, yaml_parser
            from epp.fleet.static_source import apply_static, parse_static_file

            path = Path(args.endpoints_file)
            # Polled every 0.5 s: an edit reaches Envoy (EDS) within a second.
            watcher = FileWatcher(path, parse=yaml_parser(parse_static_file, str(path)),
                                  apply=lambda parsed: apply_static(ds, *parsed), interval=0.5)
            await watcher.load_initial()
            watcher.start()
            self.cleanups.append(watcher.stop)
            self.watchers["endpoints"] = watcher
            return
        from epp.fleet.k8s.discovery import (
            PoolDiscovery,
            SelectorDiscovery,
            make_api_client,
            start_pool_discovery,
            start_selector_discovery,
        )

        if args.epp_service_name:
            from epp.fleet.k8s import pool_resource
            from epp.fleet.k8s.multipool import MultiPoolDiscovery

            pool_resource(args.pool_group)
            multi = MultiPoolDiscovery(ds, args.pool_namespace, self.api(), args.epp_service_name,
                                       pool_name=args.pool_name, pool_group=args.pool_group, pods=self.pod_pools())
            multi.start()
            self.cleanups.append(multi.stop)
            return
        disc: PoolDiscovery | SelectorDiscovery
        if args.endpoint_selector:
            from epp.fleet.k8s.convert import parse_ports, parse_selector

            if not args.endpoint_target_ports:
                raise ValueError("--endpoint-selector needs --endpoint-target-ports")
            disc = await start_selector_discovery(
                ds, args.pool_namespace, parse_selector(args.endpoint_selector),
                parse_ports(args.endpoint_target_ports), pool_name=args.pool_name or "default",
                api=make_api_client(kubeconfig=args.kubeconfig),
            )
        elif args.pool_name:
            from epp.fleet.k8s import pool_resource

            pool_resource(args.pool_group)  # a clear error for an unknown group, before anything connects
            disc = await start_pool_discovery(ds, args.pool_name, args.pool_namespace,
                                              api=make_api_client(kubeconfig=args.kubeconfig),
                                              pool_group=args.pool_group)
        elif args.routes_file or args.watch_routes:
            return  # the route documents name every pool (ModelServers)
        else:
            raise ValueError("no endpoint source: give --endpoints-file (standalone), --pool-name (an InferencePool "
                             "in Kubernetes), --epp-service-name, --endpoint-selector with --endpoint-target-ports, "
                             "or route documents (--routes-file, --watch-routes)")
        self.cleanups.append(disc.stop)

    def api(self) -> k8s.ApiClient:
        """One Kubernetes API client for every watcher."""
        if self._api is None:
            from epp.fleet.k8s.discovery import make_api_client

            self._api = make_api_client(kubeconfig=self.args.kubeconfig)
        return self._api

    def pod_pools(self) -> PodPools:
        """The namespace-wide pod watch shared by the watchers of several pools (started on first use)."""
        if self.pods is None:
            from epp.fleet.k8s.pods import PodPools

            self.pods = PodPools(self.datastore, self.api(), self.args.pool_namespace)
            self.pods.start()
            self.cleanups.append(self.pods.stop)
        return self.pods

    async def _start_routing(self) -> None:
        """Route documents: Kthena's ModelRoute, ModelServer and ExternalModelProvider (docs/coming-from-kthena.md)."""
        args = self.args
        if not (args.routes_file or args.watch_routes):
            return
        from epp.routing.service import RoutingService

        outputs = self.outputs
        svc = RoutingService(self.datastore, self.rng, secrets_dir=args.provider_secrets_dir,
                             provider_header=args.provider_header, metrics=self.metrics,
                             gateway_headers=(outputs["base_model_header"] or "", outputs["ai_gateway_model_header"] or ""))
        self.routing = svc
        self.cleanups.append(svc.stop)
        plain = bool(args.endpoints_file or args.endpoint_selector or args.pool_name or args.epp_service_name)
        if args.watch_routes:
            watch = svc.start_kubernetes(self.api(), args.pool_namespace, pods=self.pod_pools())
            if not plain:
                async def synced() -> None:
                    await watch.synced.wait()
                    self.datastore.synced = True

                task = asyncio.get_running_loop().create_task(synced())
                self.cleanups.append(lambda: _cancel(task))
        elif self.pods is not None:
            svc.set_pods(self.pods)
        for f in args.routes_file:
            await svc.add_file(Path(f))
        if not plain and not args.watch_routes:
            self.datastore.synced = True

    async def _watch_scheduling_config(self, path: Path) -> ModelScheduler:
        """Load the scheduling config and keep watching it; returns the initial scheduler."""
        from epp.fleet.reload import FileWatcher

        def parse(text: str) -> ModelScheduler:
            from scheduling.config import parse_yaml

            return build_scheduler([d.data for d in parse_yaml(text, str(path))], self.rng, str(path),
                                   self.services())

        def apply(scheduler: ModelScheduler) -> None:
            # New requests use the new scheduler; in-flight ones finish on the one that picked for them.
            if self.director is not None:
                self.apply_scheduler(scheduler)
                log.info("scheduling config %s reloaded", path)

        watcher = FileWatcher(path, parse=parse, apply=apply)
        scheduler = await watcher.load_initial()
        watcher.start()
        self.cleanups.append(watcher.stop)
        self.watchers["scheduling config"] = watcher
        return scheduler

    def _start_passive_health(self) -> None:
        """Response-path failures take endpoints out of rotation (epp/fleet/passive.py); off with --passive-health=false."""
        args = self.args
        if not getattr(args, "passive_health", True):
            return
        from epp.fleet.passive import PassiveHealth

        passive = PassiveHealth(
            self.datastore,
            failure_threshold=args.passive_failure_threshold,
            cooldown=args.passive_cooldown,
            max_cooldown=max(args.passive_max_cooldown, args.passive_cooldown),
            silence_timeout=args.passive_silence_timeout,
            metrics=self.metrics,
        )
        passive.scraper = self.scraper
        assert self.metrics is not None
        self.passive = passive
        self.metrics.bind_health(passive)
        passive.start()
        self.cleanups.append(passive.stop)

    def apply_scheduler(self, scheduler: ModelScheduler) -> None:
        """Make `scheduler` current, with what its config's shell sections say (admission thresholds, flow
        control, scraping): a new director bundle for new streams."""
        from epp.fleet.saturation import detector_for
        from epp.request.admit import SheddableAdmitter

        shell = scheduler.shell
        detector = detector_for(shell.saturation, self.datastore.inflight)
        flow = self._apply_flow_control(shell.flow_control, detector)
        admitters = (SheddableAdmitter(detector.admit), *self.admitters)
        self.publish(self._current().replace(scheduler=scheduler, admitters=admitters, flow=flow))
        if self.scraper is not None:
            self.scraper.configure(shell.scrape)
        if self.precise is not None:
            self.precise.apply_config(scheduler)  # an llm-d kvEventsConfig may name the engines' event port
        if self.bus is not None:  # the new scheduler's plugins replicate instead of the old one's
            self.bus.replication.attach(scheduler)

    def _apply_flow_control(self, config: FlowControl | None, detector: Detector) -> FlowController | None:
        """Turn flow control on, reconfigure it, or turn it off (queued requests are then dispatched)."""
        from epp.flowcontrol import FlowController

        if self.pressure is not None:
            self.pressure.detector = detector
        if config is None:
            old, self.flow = self.flow, None
            if old is not None:
                task = asyncio.get_running_loop().create_task(old.close(release=True))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            return None
        if self.flow is None:
            assert self.pressure is not None  # made in start(), before any config is applied
            self.flow = FlowController(config, self.pressure, metrics=self.metrics)
        else:
            self.flow.configure(config)
        return self.flow

    def _metrics_arrived(self, keys: Iterable[str]) -> None:
        if self.pressure is not None:
            self.pressure.metrics_updated(keys)
        # issue 23: the scheduler's plugins learn the engines' timings from their histograms (engine_metrics)
        director = self.director
        learn = getattr(director.scheduler, "engine_metrics", None) if director is not None else None
        if learn is not None and director is not None:
            wanted = set(keys)
            learn([e for e in self.datastore.all_endpoints() if e.key in wanted], director.clock())
        if self.flow is not None:
            self.flow.kick()

    async def _stop_flow_control(self) -> None:
        flow, self.flow = self.flow, None
        if self.director is not None and self.director.flow is not None:
            self.publish(self.director.replace(flow=None))
        if flow is not None:
            await flow.close()

    async def _start_grpc(self) -> None:
        args = self.args
        from epp.api.health import add_health_servicer, start_health_server

        assert self.director is not None, "the director is built before the servers"
        stream_cfg = StreamConfig(args.request_body_mode, args.response_body_mode, args.max_body_bytes)
        extra: list[Callable[[grpc.aio.Server], object]] = []
        if args.eds:  # EDS for Envoy's pool cluster, on this same port (epp/xds)
            from epp.xds import EdsService, add_eds_service

            self.eds = eds = EdsService(self.datastore)
            extra.append(lambda server: add_eds_service(server, eds))
        transport = getattr(args, "grpc_transport", DEFAULT_TRANSPORT)
        from epp.api.explain import PointsmanService

        api_service = PointsmanService(self.director, self.passive)
        self.server, self.extproc = build_server(
            self.director, stream_cfg, extra_servicers=extra, metrics=self.metrics, transport=transport,
            reuse_port=args.worker_index is not None, api=api_service)
        self._holders += [self.extproc, api_service]
        self.health = add_health_servicer(self.server, self.datastore)
        addr = f"{args.grpc_host}:{args.grpc_port}"
        if args.secure_serving:
            from epp.extproc.tls import server_credentials, server_ssl_context

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


async def _cancel(task: asyncio.Task[Any]) -> None:
    from epp.aio import cancel_and_wait

    await cancel_and_wait(task)


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
