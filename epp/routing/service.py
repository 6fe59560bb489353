"""The routing layer as `epp serve` runs it: documents from files and/or Kubernetes, the Router, the credentials and
the routing metrics, kept in step.

    svc = RoutingService(datastore, rng, secrets_dir=...)
    await svc.add_file(Path("routes.yaml"))          # hot-reloaded; multi-document YAML
    svc.start_kubernetes(api, namespace, pods)       # ModelRoute / ModelServer / ExternalModelProvider / Secrets
    director.router = svc.router
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from epp.fleet import Datastore
from epp.routing.documents import DocumentSet, RawDocument, read_yaml
from epp.routing.model import RouteConfigError, RoutingTable
from epp.routing.pools import PodSource
from epp.routing.providers import PROVIDER_HEADER, Credentials
from epp.routing.router import RouteDecision, Router

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from prometheus_client import CollectorRegistry
    from typing_extensions import Unpack

    from epp.fleet.k8s import PodPools
    from epp.routing.k8s import ReflectorOptions, RouteWatch
    from epp.routing.metrics import RoutingMetrics

log = logging.getLogger(__name__)


class MetricsRegistry(Protocol):
    """What the routing metrics register on: the EPP's metrics (epp.api's EppMetrics)."""

    @property
    def registry(self) -> CollectorRegistry: ...


class RoutingService:
    def __init__(self, datastore: Datastore, rng: random.Random, *, secrets_dir: str | None = None,
                 provider_header: str = PROVIDER_HEADER, metrics: MetricsRegistry | None = None,
                 gateway_headers: tuple[str, ...] = ("x-gateway-base-model-name", "x-ai-eg-model")) -> None:
        self.datastore = datastore
        self.metrics = metrics
        self.documents = DocumentSet(on_error=self._on_error)
        self.credentials = Credentials(secrets_dir)
        self.router = Router(datastore, rng, credentials=self.credentials, provider_header=provider_header,
                             on_decision=self._on_decision, gateway_headers=gateway_headers)
        self.on_table: list[Callable[[RoutingTable], None]] = []  # told the new routing table after every change
        self.cleanups: list[Callable[[], Awaitable[object]]] = []
        if metrics is not None:
            from epp.routing.metrics import RoutingMetrics

            self.rmetrics: RoutingMetrics | None = RoutingMetrics(metrics.registry, self)
        else:
            self.rmetrics = None

    def _on_error(self, kind: str, err: RouteConfigError) -> None:
        if self.rmetrics is not None:
            self.rmetrics.document_error(kind)

    def _on_decision(self, d: RouteDecision) -> None:
        if self.rmetrics is not None:
            self.rmetrics.decision(d)

    def refresh(self) -> None:
        """Rebuild the table from the documents and make it current."""
        table = self.documents.table()
        self.router.apply(table)
        for fn in self.on_table:
            try:
                fn(table)
            except Exception:  # noqa: BLE001 - a listener never stops the routing layer
                log.exception("a routing-table listener failed")

    def set_pods(self, pods: PodSource) -> None:
        self.router.set_pods(pods)

    # ---- files ---------------------------------------------------------------------------------------------
    def load_text(self, text: str, label: str) -> None:
        """Replace the documents of `label` (raises RouteConfigError only for YAML that does not parse)."""
        self.apply_documents(f"file:{label}", read_yaml(text, label))

    def apply_documents(self, source: str, docs: list[RawDocument]) -> None:
        self.documents.replace(source, docs)
        self.refresh()
        counts = self.documents.counts()
        log.info("routes from %s: %s", source, ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none")

    async def add_file(self, path: Path, interval: float = 1.0) -> None:
        from epp.fleet import FileWatcher

        label = str(path)
        watcher: FileWatcher[list[RawDocument]] = FileWatcher(
            path, parse=lambda text: read_yaml(text, label),
            apply=lambda docs: self.apply_documents(f"file:{label}", docs), interval=interval)
        await watcher.load_initial()
        watcher.start()
        self.cleanups.append(watcher.stop)

    # ---- Kubernetes ----------------------------------------------------------------------------------------
    def start_kubernetes(self, api: ApiClient, namespace: str, *, pods: PodPools | None = None,
                         **reflector_opts: Unpack[ReflectorOptions]) -> RouteWatch:
        from epp.routing.k8s import RouteWatch

        watch = RouteWatch(self, api, namespace, pods=pods, **reflector_opts)
        watch.start()
        self.cleanups.append(watch.stop)
        return watch

    async def stop(self) -> None:
        for fn in reversed(self.cleanups):
            try:
                await fn()
            except Exception:  # noqa: BLE001 - stopping must go on
                log.exception("stopping the routing layer")
        self.cleanups.clear()
