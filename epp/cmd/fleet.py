"""`epp serve`'s fleet: the endpoint sources that fill the datastore, the metrics scraper and passive health.

Sources, in order of precedence (epp.fleet.settings.SourceSettings.kind): the endpoints file (hot-reloaded), every
InferencePool naming this EPP's Service, pods by label (no InferencePool), the one InferencePool; or none, when
route documents name every pool. The Kubernetes client and the namespace-wide pod watch are made on first use
and shared (`Kube`, epp/cmd/kube.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.fleet import FileWatcher, PassiveHealth, apply_static, parse_static_text
from epp.fleet.scrape import start_scraper
from epp.fleet.settings import SourceSettings

if TYPE_CHECKING:
    import kubernetes.client as k8s

    from epp.cmd.components import Components


async def start_sources(app: Components) -> None:
    """Fill the datastore from the configured source (see the module docstring)."""
    s, ds = app.settings.sources, app.datastore
    if s.kind == "file":
        assert s.endpoints_file is not None
        path = Path(s.endpoints_file)
        # Polled every 0.5 s: an edit reaches Envoy (EDS) within a second.
        watcher = FileWatcher(path, parse=lambda text: parse_static_text(text, str(path)),
                              apply=lambda parsed: apply_static(ds, *parsed), interval=0.5)
        await watcher.load_initial()
        watcher.start()
        app.runner.own("endpoints file", watcher)
        app.watchers["endpoints"] = watcher
    elif s.kind is not None:
        app.runner.own(f"{s.kind} discovery", await _start_discovery(app, s))


async def _start_discovery(app: Components, s: SourceSettings) -> Any:
    from epp.fleet.k8s import start_pool_discovery, start_selector_discovery

    ds = app.datastore
    if s.kind == "service":
        from epp.fleet.k8s import MultiPoolDiscovery

        multi = MultiPoolDiscovery(ds, s.pool_namespace, app.kube.api(), s.epp_service_name or "",
                                   pool_name=s.pool_name, pool_group=s.pool_group, pods=app.kube.pod_pools())
        multi.start()
        return multi
    if s.kind == "selector":
        return await start_selector_discovery(ds, s.pool_namespace, s.selector, s.target_ports,
                                              pool_name=s.pool_name or "default", api=_own_client(s))
    assert s.pool_name is not None
    return await start_pool_discovery(ds, s.pool_name, s.pool_namespace, api=_own_client(s), pool_group=s.pool_group)


def _own_client(s: SourceSettings) -> k8s.ApiClient:
    """The one-pool watchers have a client of their own (as they always had)."""
    from epp.fleet.k8s import make_api_client

    return make_api_client(kubeconfig=s.kubeconfig)


async def start_scraping(app: Components) -> None:
    """The metrics scraper (its per-endpoint path and parser follow the scheduling config: apply_scheduler)."""
    app.scraper = app.runner.own("scraper", await start_scraper(app.datastore, app.settings.scrape))
    app.scraper.source.port = app.settings.compat.scrape_port  # --model-server-metrics-port


async def start_passive_health(app: Components) -> None:
    """Response-path failures take endpoints out of rotation (epp/fleet/passive.py); off with --passive-health=false."""
    s = app.settings.passive
    if not s.enabled:
        return
    assert app.metrics is not None
    passive = PassiveHealth(app.datastore, failure_threshold=s.failure_threshold, cooldown=s.cooldown,
                            max_cooldown=s.max_cooldown, silence_timeout=s.silence_timeout, metrics=app.metrics)
    passive.scraper = app.scraper
    app.passive = passive
    app.metrics.bind_health(passive)
    passive.start()
    app.runner.own("passive health", passive)


__all__ = ["start_passive_health", "start_scraping", "start_sources"]
