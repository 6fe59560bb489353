"""Where and how an endpoint's metrics page is read: GIE's `metrics-data-source` and `core-metrics-extractor`.

`MetricsSource` holds the scheme, path and port of the page (`--model-server-metrics-scheme`, `-path`, `-port`), its
TLS verification (`--model-server-metrics-https-insecure-skip-verify`), the engine label that picks the parser
(`engineLabelKey`, then the well-known engine labels, else the default engine), and the one keep-alive HTTP client
(http.py) every endpoint's GET goes through. `read(ep, timeout)` is one GET and its parse; when and how often is the
scraper's (scraper.py).
"""

from __future__ import annotations

import logging
import ssl as ssl_mod
from collections.abc import Callable

from epp.fleet.scrape.http import MetricsClient, insecure_context
from epp.fleet.scrape.parser import parser_for
from scheduling.api import Scrape
from scheduling.types import Endpoint, Metrics, endpoint_key

log = logging.getLogger(__name__)


class MetricsSource:
    def __init__(self, path: str = "/metrics", scheme: str = "http", insecure_skip_verify: bool = True,
                 engine_label_key: str = "llm-d.ai/engine-type", default_engine: str = "vllm") -> None:
        self.path = path if path.startswith("/") else "/" + path
        self.scheme = scheme
        self.insecure_skip_verify = insecure_skip_verify
        self.engine_label_key = engine_label_key
        self.default_engine = default_engine
        self.port = 0  # --model-server-metrics-port: this port of every endpoint (0: its serving port)
        self._client = MetricsClient()
        self._tls: dict[bool, ssl_mod.SSLContext] = {}  # by insecure_skip_verify
        self._warned_engines: set[str] = set()

    def configure(self, scrape: Scrape) -> None:
        """Apply a config's data-layer section (metrics-data-source, core-metrics-extractor); takes effect at the
        next scrape."""
        self.scheme = scrape.scheme
        self.path = scrape.path
        self.insecure_skip_verify = scrape.insecure_skip_verify
        self.engine_label_key = scrape.engine_label_key
        self.default_engine = scrape.default_engine

    def engine_of(self, ep: Endpoint) -> str:
        """The engine label (engineLabelKey, then the well-known engine labels), else the default engine."""
        labels = ep.labels
        return (labels.get(self.engine_label_key) or labels.get("llm-d.ai/engine-type")
                or labels.get("inference.networking.k8s.io/engine-type") or self.default_engine)

    def parser(self, ep: Endpoint) -> Callable[[bytes, float], Metrics]:
        engine = self.engine_of(ep)
        try:
            return parser_for(engine)
        except KeyError:
            if engine not in self._warned_engines:
                self._warned_engines.add(engine)
                log.warning("endpoint %s: unknown engine %r, reading it as vllm", ep.key, engine)
            return parser_for("vllm")

    async def read(self, ep: Endpoint, timeout: float, now: Callable[[], float]) -> Metrics:
        """GET the endpoint's page within `timeout` seconds and parse it (stamped `now()` when it arrived). Raises
        OSError, HttpError, RuntimeError (a status other than 200) and the parser's errors."""
        parse = self.parser(ep)
        host, port, authority = self.where(ep.key)
        resp = await self._client.get(host, port, self.path, authority=authority, timeout=timeout,
                                      ssl=self._tls_context())
        if resp.status != 200:
            raise RuntimeError(f"GET {self.scheme}://{authority}{self.path}: HTTP {resp.status}")
        return parse(resp.body, now())

    def where(self, key: str) -> tuple[str, int, str]:
        """Where an endpoint's metrics are served: its host (IPv6 without brackets), the port (its own, unless
        --model-server-metrics-port names one) and the two as the Host header."""
        host, _, port = key.rpartition(":")
        host = host.strip("[]")
        metrics_port = self.port or int(port)
        return host, metrics_port, endpoint_key(host, metrics_port)

    def forget(self, key: str) -> None:
        """The endpoint left: close its idle connections."""
        host, port, _ = self.where(key)
        self._client.forget(host, port)

    async def close(self) -> None:
        await self._client.close()

    def _tls_context(self) -> ssl_mod.SSLContext | None:
        if self.scheme != "https":
            return None
        insecure = self.insecure_skip_verify
        ctx = self._tls.get(insecure)
        if ctx is None:
            ctx = self._tls[insecure] = insecure_context() if insecure else ssl_mod.create_default_context()
        return ctx
