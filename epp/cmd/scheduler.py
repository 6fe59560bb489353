"""`epp serve`'s scheduling: the scheduler from the scheduling config (hot-reloaded: a bad new version is logged
and the old one keeps serving), and the shell sections of that config that come with each scheduler (admission
thresholds, flow control, scraping): `apply_scheduler` makes a scheduler current with all of them."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.cmd.flowswitch import FlowSwitch
from epp.fleet import FileWatcher, detector_for
from epp.request import SheddableAdmitter
from scheduling.config import load_scheduler, parse_yaml
from scheduling.framework.model_scheduler import ModelScheduler

if TYPE_CHECKING:
    from epp.cmd.components import Components
    from epp.cmd.settings import SchedulingSettings
    from scheduling.config.loader import Source

log = logging.getLogger("epp")


def build_scheduler(source: Source, rng: random.Random, name: str | None = None,
                    services: Mapping[str, Any] | None = None) -> ModelScheduler:
    return load_scheduler(source, rng=rng, timer=time.perf_counter, name=name, services=services)


def load_scheduling(settings: SchedulingSettings, rng: random.Random,
                    services: Mapping[str, Any] | None = None) -> ModelScheduler:
    """The scheduler from --config-text / --config-file, or the built-in default profile."""
    if settings.config_text:
        docs = [d.data for d in parse_yaml(settings.config_text, "--config-text")]
        return build_scheduler(docs, rng, "--config-text", services)
    if settings.config_file:
        return build_scheduler(settings.config_file, rng, services=services)
    return build_scheduler(None, rng, services=services)


async def start_scheduling(app: Components) -> None:
    """The initial scheduler; with --config-file, a watcher that applies each good new version."""
    path = app.settings.scheduling.config_file
    if path is None:
        app.scheduler = load_scheduling(app.settings.scheduling, app.rng, app.services())
        return

    def parse(text: str) -> ModelScheduler:
        return build_scheduler([d.data for d in parse_yaml(text, str(path))], app.rng, str(path), app.services())

    def apply(scheduler: ModelScheduler) -> None:
        # New requests use the new scheduler; in-flight ones finish on the one that picked for them.
        if app.director is not None:
            apply_scheduler(app, scheduler)
            log.info("scheduling config %s reloaded", path)

    watcher = FileWatcher(Path(path), parse=parse, apply=apply)
    app.scheduler = await watcher.load_initial()
    watcher.start()
    app.runner.own("scheduling config", watcher)
    app.watchers["scheduling config"] = watcher


async def start_flow_control(app: Components) -> None:
    """Endpoint lifecycle and flow control: whatever scheduler is current forgets a departed endpoint (in-flight
    counts and the unhealthy mark are the datastore's own; the scraper subscribes itself)."""
    ds = app.datastore
    ds.on_endpoint_removed(lambda key: app.current().scheduler.endpoint_removed(key))
    ds.on_metrics_updated(lambda keys: engines_scraped(app, keys))
    switch = app.flow_switch = FlowSwitch(ds, app.metrics)

    async def close() -> None:
        if app.director is not None and app.director.flow is not None:
            app.publish(app.director.replace(flow=None))
        await switch.close()

    app.runner.add("flow control", close)


def engines_scraped(app: Components, keys: Iterable[str]) -> None:
    """After each scrape batch the current scheduler's plugins learn the engines' timings from their histograms
    (the `engine_metrics` hook: the estimated-latency scorer's fitted timings and prefix trust)."""
    director = app.director
    if director is None:
        return
    learn = getattr(director.scheduler, "engine_metrics", None)
    if learn is not None:
        wanted = set(keys)
        learn([e for e in app.datastore.all_endpoints() if e.key in wanted], director.clock())


def apply_scheduler(app: Components, scheduler: ModelScheduler) -> None:
    """Make `scheduler` current, with what its config's shell sections say (admission thresholds, flow control,
    scraping): a new director bundle for new streams."""
    assert app.flow_switch is not None, "flow control is set up before any scheduler is applied"
    shell = scheduler.shell
    detector = detector_for(shell.saturation, app.datastore.inflight)
    flow = app.flow_switch.apply(shell.flow_control, detector)
    # GIE v1.5: with flow control saturation holds a request in its band; only without it is a sheddable one shed
    limits = app.rate_limits  # then the routes' rate limits and budgets, in the exchange's order (epp/request/admit.py)
    admitters = (*(() if flow is not None else (SheddableAdmitter(detector.admit),)),
                 *((limits.gate, limits.budgets) if limits else ()))
    app.publish(app.current().replace(scheduler=scheduler, admitters=admitters, flow=flow))
    if app.scraper is not None:  # the config's scraping, with what the command line sets on top
        app.scraper.source.configure(app.settings.compat.scrape(shell.scrape))
    if app.precise is not None:
        app.precise.apply_config(scheduler)  # an llm-d kvEventsConfig may name the engines' event port
    if app.bus is not None:  # the new scheduler's plugins replicate instead of the old one's
        app.bus.replication.attach(scheduler)


__all__ = ["apply_scheduler", "build_scheduler", "load_scheduling", "start_flow_control",
           "start_scheduling"]
