"""`epp serve`'s settings: the flags parsed once into frozen, typed settings, one per subsystem.

Each subsystem defines its flags next to its code (`add_flags`, cheap to import: the CLI builds every command's
flags) and owns its settings dataclass, whose `from_args` is the only code that reads the argparse Namespace for
it. `ServeSettings` composes them; bad values and bad combinations fail here, with a ValueError naming the flag
(the CLI prints it and exits 2), before anything starts. Nothing after this point sees a Namespace.

    ServeSettings
      server      ServerSettings      epp/extproc/settings.py   ports, TLS, transport, EDS, stream, limits
      sources     SourceSettings      epp/fleet/settings.py     endpoints file, selector, InferencePool(s)
      routes      RouteSettings       epp/routing/settings.py   route documents (files, Kubernetes)
      scheduling  SchedulingSettings  here                      the scheduling config and the seed
      scrape      ScrapeSettings      epp/fleet/settings.py     metrics scraping
      passive     PassiveSettings     epp/fleet/settings.py     passive health
      ratelimit   RateLimitSettings   epp/ratelimit/settings.py token rate limits, Redis
      request     RequestSettings     epp/request/settings.py   routing outputs, fallbacks, decision log
      dashboard   DashboardSettings   epp/api/settings.py       the live page
      metrics_auth MetricsAuthSettings epp/api/settings.py      who may read /metrics
      kvevents    KVEventsSettings    epp/fleet/kvevents/settings.py
      tokenize    TokenizeSettings    epp/tokenize/settings.py
      replicas    ReplicaSettings     epp/bus/settings.py       workers, the replica bus
      runtime     RuntimeSettings     here                      log verbosity, event loop
      compat      CompatSettings      epp/cmd/foreign.py        what other EPPs' flags set; notices to log
      argv        the `epp` command line (`serve` and its flags: the workers supervisor re-launches it)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epp.api import settings as api_settings
from epp.argtypes import parse_bool, parse_duration_arg
from epp.bus import settings as bus_settings
from epp.cmd import foreign
from epp.extproc import settings as server_settings
from epp.fleet import settings as fleet_settings
from epp.fleet.kvevents import settings as kvevents_settings
from epp.observe import ObserveSettings
from epp.observe import add_flags as add_observe_flags
from epp.ratelimit import settings as ratelimit_settings
from epp.request import settings as request_settings
from epp.routing import settings as route_settings
from epp.tokenize import settings as tokenize_settings

NO_SOURCE = ("no endpoint source: give --endpoints-file (standalone), --pool-name (an InferencePool in Kubernetes), "
             "--epp-service-name, --endpoint-selector with --endpoint-target-ports, or route documents "
             "(--routes-file, --watch-routes)")


@dataclass(frozen=True)
class SchedulingSettings:
    """The scheduling config (`--config-file`, hot-reloaded, or `--config-text`; neither: the built-in default)."""

    config_file: Path | None = None
    config_text: str | None = None
    seed: int | None = None  # the scheduler's random source

    @staticmethod
    def add_flags(g: argparse._ActionsContainer) -> None:
        g.add_argument("--config-file", default=None, help="scheduling config (EndpointPickerConfig / SchedulingProfile)")
        g.add_argument("--config-text", default=None, help="scheduling config as inline YAML")
        g.add_argument("--seed", type=int, default=None, help="seed the scheduler's random source")

    @property
    def source(self) -> str:
        """Where the config comes from, for people (the dashboard)."""
        if self.config_file:
            return f"file {self.config_file}"
        return "inline --config-text" if self.config_text else "built-in default (the estimated-latency profile)"

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> SchedulingSettings:
        return cls(Path(ns.config_file) if ns.config_file else None, ns.config_text or None, ns.seed)


@dataclass(frozen=True)
class RuntimeSettings:
    verbosity: int = 1  # -v: 0 warnings, 1 info, 3 debug
    event_loop: str = "asyncio"  # or "uvloop"

    @staticmethod
    def add_verbosity_flag(g: argparse._ActionsContainer) -> None:
        g.add_argument("-v", "--v", type=int, default=int(os.environ.get("EPP_VERBOSITY", "1")), help="log verbosity")

    @staticmethod
    def add_event_loop_flag(g: argparse._ActionsContainer) -> None:
        g.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="asyncio",
                       help="asyncio (default) or uvloop (pip install uvloop; see docs/performance.md)")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RuntimeSettings:
        return cls(ns.v, ns.event_loop)


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """Every `epp serve` flag, in its group, from the subsystem that owns it."""
    server_settings.add_flags(p.add_argument_group("ports"))
    server_settings.add_limit_flags(
        p.add_argument_group("gRPC server limits (per connection unless said; docs/frontdoor.md)"))
    fleet_settings.add_source_flags(p.add_argument_group("pool and endpoints"))
    route_settings.add_flags(p.add_argument_group("routes (Kthena ModelRoute, ModelServer, ExternalModelProvider)"))
    SchedulingSettings.add_flags(p.add_argument_group("scheduling"))
    ratelimit_settings.add_flags(p.add_argument_group("token rate limits and budgets (docs/rate-limits.md)"))
    g = p.add_argument_group("health (scraping and passive)")
    fleet_settings.add_scrape_flags(g)
    fleet_settings.add_health_flags(g)
    g = p.add_argument_group("protocol")
    server_settings.add_stream_flags(g)
    request_settings.add_flags(g)
    RuntimeSettings.add_event_loop_flag(g)
    request_settings.add_output_flags(p.add_argument_group("routing outputs (docs/performance.md)"))
    request_settings.add_early_flags(p, parse_bool)
    request_settings.add_session_flags(p, parse_bool)
    add_observe_flags(p, parse_bool, parse_duration_arg)  # tracing, receipts, shadow profiles, log format
    g = p.add_argument_group("dashboard (a live page on the metrics port; see docs/dashboard.md)")
    api_settings.add_dashboard_flags(g)
    api_settings.add_metrics_auth_flags(g)
    RuntimeSettings.add_verbosity_flag(g)
    # Precise prefix routing (docs/kv-events.md): the engines' KV events and request tokenization.
    kvevents_settings.add_flags(p.add_argument_group("KV events (precise prefix routing)"))
    tokenize_settings.add_flags(p.add_argument_group(
        "tokenization (for configs that read token ids, e.g. precise-prefix-cache-scorer)"))
    bus_settings.add_flags(p.add_argument_group(
        "replicas and workers (a replica bus shares load and routing state; docs/replicas.md)"))
    foreign.add_flags(p.add_argument_group(
        "compatibility (what other EPPs' flags map onto; docs/deploy.md \"Foreign flags\")"), parse_bool)


def adopt_serve_argv(p: argparse.ArgumentParser, argv: Sequence[str]) -> foreign.Adopted:
    """`epp serve ARGV` read with Go pflag's rules and other EPPs' flags (epp/cmd/foreign.py): the command line
    argparse parses, and the notices to log at start. FlagError (a ValueError) names a flag nobody defines."""
    kinds, short = foreign.kinds_of(p, parse_bool)
    return foreign.adopt(argv, kinds, short)


@dataclass(frozen=True)
class ServeSettings:
    """Everything `epp serve` runs with (see the module docstring for the tree)."""

    server: server_settings.ServerSettings = field(default_factory=server_settings.ServerSettings)
    sources: fleet_settings.SourceSettings = field(default_factory=fleet_settings.SourceSettings)
    routes: route_settings.RouteSettings = field(default_factory=route_settings.RouteSettings)
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    scrape: fleet_settings.ScrapeSettings = field(default_factory=fleet_settings.ScrapeSettings)
    passive: fleet_settings.PassiveSettings = field(default_factory=fleet_settings.PassiveSettings)
    ratelimit: ratelimit_settings.RateLimitSettings = field(default_factory=ratelimit_settings.RateLimitSettings)
    request: request_settings.RequestSettings = field(default_factory=request_settings.RequestSettings)
    dashboard: api_settings.DashboardSettings = field(default_factory=api_settings.DashboardSettings)
    metrics_auth: api_settings.MetricsAuthSettings = field(default_factory=api_settings.MetricsAuthSettings)
    kvevents: kvevents_settings.KVEventsSettings = field(default_factory=kvevents_settings.KVEventsSettings)
    tokenize: tokenize_settings.TokenizeSettings = field(default_factory=tokenize_settings.TokenizeSettings)
    replicas: bus_settings.ReplicaSettings = field(default_factory=bus_settings.ReplicaSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    observe: ObserveSettings = field(default_factory=ObserveSettings)  # traces, receipts, shadow, log format
    compat: foreign.CompatSettings = field(default_factory=foreign.CompatSettings)  # other EPPs' flags
    argv: tuple[str, ...] = ()  # the `epp` command line, `serve` first (the workers supervisor re-launches it)

    @property
    def worker(self) -> bool:
        """This process is one worker of `epp serve --workers N` (epp/workers)."""
        return self.replicas.worker_index is not None

    @classmethod
    def from_args(cls, ns: argparse.Namespace, argv: Sequence[str] = (),
                  notices: Sequence[str] = ()) -> ServeSettings:
        """The settings of a parsed `epp serve` command line; ValueError (naming the flag) for a bad value or
        combination, epp.extras.MissingExtra (a ValueError too) for a flag whose extra is not installed.
        `notices`: what the foreign flags of the command line do here (logged once at start)."""
        sources = fleet_settings.SourceSettings.from_args(ns)
        routes = route_settings.RouteSettings.from_args(ns)
        kubernetes = sources.kind in ("pool", "service", "selector") or routes.watch
        s = cls(
            server=server_settings.ServerSettings.from_args(ns),
            sources=sources,
            routes=routes,
            scheduling=SchedulingSettings.from_args(ns),
            scrape=fleet_settings.ScrapeSettings.from_args(ns),
            passive=fleet_settings.PassiveSettings.from_args(ns),
            ratelimit=ratelimit_settings.RateLimitSettings.from_args(ns),
            request=request_settings.RequestSettings.from_args(ns),
            dashboard=api_settings.DashboardSettings.from_args(ns),
            metrics_auth=api_settings.MetricsAuthSettings.from_args(ns, kubernetes),
            kvevents=kvevents_settings.KVEventsSettings.from_args(ns),
            tokenize=tokenize_settings.TokenizeSettings.from_args(ns),
            replicas=bus_settings.ReplicaSettings.from_args(ns),
            runtime=RuntimeSettings.from_args(ns),
            observe=ObserveSettings.from_args(ns),
            compat=foreign.CompatSettings.from_args(ns, notices),
            argv=tuple(argv),
        )
        if s.sources.kind is None and not s.routes.enabled:
            raise ValueError(NO_SOURCE)
        return s

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> ServeSettings:
        """The settings of `epp serve ARGV`, read as the CLI reads it (pflag syntax, other EPPs' flags); an unknown
        flag is a ValueError naming it."""
        p = argparse.ArgumentParser(prog="epp serve")
        add_serve_flags(p)
        adopted = adopt_serve_argv(p, argv)
        return cls.from_args(p.parse_args(adopted.argv), ["serve", *adopted.argv], adopted.notices)


__all__ = ["RuntimeSettings", "SchedulingSettings", "ServeSettings", "add_serve_flags", "adopt_serve_argv"]
