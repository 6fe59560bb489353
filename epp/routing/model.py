"""The typed route model every routing dialect compiles to (epp/routing/dialects: Kthena's ModelRoute, ModelServer
and ExternalModelProvider; LLMKube's ModelRouter backends).

    RoutingTable
      routes:    Route (by requested model, then by LoRA adapter; oldest first)
                   rules (ordered, first match wins)
                     match: headers (exact / prefix / regex), uri, body model; empty = everything
                     targets: weighted; each names a backend
      pools:     PoolBackend      endpoints scheduled by Pointsman: model overwrite, P/D pairing, sticky sessions,
                                  retries (fallback endpoints), the engine (metrics mapping)
      providers: ProviderBackend  an external HTTPS upstream: model overwrite, static headers, a credential
      extras:    per dialect, its own objects (LLMKube's ModelRouters: catch-all routers with their own rules and
                 policy, which its runtime consults when no route names the requested model)

Everything here is an immutable value; nothing does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

TargetKind = Literal["pool", "provider"]
ProviderType = Literal["OpenAI", "Anthropic"]
AuthScheme = Literal["Bearer", "APIKey"]
PROVIDER_TYPES: tuple[ProviderType, ...] = ("OpenAI", "Anthropic")
AUTH_SCHEMES: tuple[AuthScheme, ...] = ("Bearer", "APIKey")
POOL: TargetKind = "pool"
PROVIDER: TargetKind = "provider"


class RouteConfigError(ValueError):
    """A document that cannot be used: names the document, the field and what was expected."""

    def __init__(self, document: str, field: str, expected: str) -> None:
        super().__init__(f"{document}: {field}: expected {expected}")
        self.document = document
        self.field = field
        self.expected = expected


@dataclass(frozen=True, slots=True)
class StringMatch:
    """exact / prefix / regex (a regex matches anywhere in the value, like Go's MatchString); `any` matches all."""

    kind: Literal["exact", "prefix", "regex", "any"]
    value: str = ""
    pattern: re.Pattern[str] | None = field(default=None, compare=False)

    def matches(self, text: str) -> bool:
        if self.kind == "exact":
            return text == self.value
        if self.kind == "prefix":
            return text.startswith(self.value)
        if self.kind == "regex":
            assert self.pattern is not None
            return self.pattern.search(text) is not None
        return True

    def describe(self) -> str:
        return "*" if self.kind == "any" else f"{self.kind} {self.value!r}"


@dataclass(frozen=True, slots=True)
class Match:
    """All conditions must hold. An absent header reads as "" (so `prefix: ""` matches a missing header)."""

    headers: tuple[tuple[str, StringMatch], ...] = ()  # lower-case header names
    uri: StringMatch | None = None  # matched against the path without the query string
    body_model: str | None = None  # the model named in the request body, exactly

    @property
    def empty(self) -> bool:
        return not self.headers and self.uri is None and self.body_model is None

    def matches(self, model: str, path: str, headers: Mapping[str, str]) -> bool:
        if self.body_model is not None and model != self.body_model:
            return False
        for name, sm in self.headers:
            if not sm.matches(headers.get(name, "")):
                return False
        return self.uri is None or self.uri.matches(path.split("?", 1)[0])


@dataclass(frozen=True, slots=True)
class Target:
    kind: TargetKind
    backend: str  # the backend's key ("namespace/name")
    weight: int


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    index: int
    match: Match
    targets: tuple[Target, ...]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Token rate limits of one route (Kthena ModelRoute.spec.rateLimit), parsed and validated; enforced by
    epp/ratelimit. `None` per direction means no limit on it."""

    input_tokens_per_unit: int | None
    output_tokens_per_unit: int | None
    unit: str  # second | minute | hour | day | month
    unit_seconds: int  # the unit's length (a month is 30 days)
    redis_address: str | None = None  # global limits shared through this Redis ("host:port"); None: local


UNIT_SECONDS: dict[str, int] = {"second": 1, "minute": 60, "hour": 3600, "day": 86_400, "month": 30 * 86_400}


@dataclass(frozen=True, slots=True)
class Route:
    key: str  # "namespace/name"
    kind: str  # the document kind, e.g. ModelRoute
    source: str  # where it came from (file, document index, or "kubernetes")
    models: tuple[str, ...] = ()  # requested model names that select it
    adapters: tuple[str, ...] = ()  # LoRA adapter names that select it
    rules: tuple[Rule, ...] = ()
    rate_limit: RateLimit | None = None
    parent_refs: tuple[str, ...] = ()  # accepted and shown; Pointsman serves whatever gateway calls it
    order: tuple[float, str] = (0.0, "")  # older first: (creation time or document position, key)


@dataclass(frozen=True, slots=True)
class StaticEndpoint:
    name: str
    address: str
    port: int
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PDPairing:
    """Prefill/decode roles by labels; a decode endpoint pairs only with prefill endpoints of the same group (the
    value of the `group_key` label)."""

    group_key: str
    prefill_labels: Mapping[str, str]
    decode_labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Sticky:
    """Session stickiness: the first non-empty source is the session key; only its hash is kept, for an idle TTL."""

    sources: tuple[tuple[str, str], ...]  # (header | query | cookie | jwtClaim, name)
    ttl_s: float = 300.0


@dataclass(frozen=True, slots=True)
class PoolBackend:
    key: str  # "namespace/name"
    kind: str  # e.g. ModelServer
    namespace: str
    model: str | None = None  # what the engine sees (None: the request's model is kept)
    engine: str = "vllm"  # the metrics mapping (llm-d.ai/engine-type label value)
    selector: Mapping[str, str] | None = None  # pods by label (Kubernetes)
    port: int | None = None  # the pods' port / the default port of static endpoints
    protocol: str = "http"
    endpoints: tuple[StaticEndpoint, ...] = ()  # static instances (no selector)
    pd: PDPairing | None = None
    sticky: Sticky | None = None
    retries: int = 0  # fallback endpoints Envoy may retry on
    pool_name: str = ""  # the datastore pool's name when it is not "<kind>:<key>"

    @property
    def pool(self) -> str:
        """The datastore pool holding its endpoints."""
        return self.pool_name or f"{self.kind.lower()}:{self.key}"


@dataclass(frozen=True, slots=True)
class ProviderAuth:
    scheme: AuthScheme
    secret_name: str
    secret_key: str


@dataclass(frozen=True, slots=True)
class ProviderBackend:
    key: str  # "namespace/name"
    kind: str  # e.g. ExternalModelProvider
    namespace: str
    provider_type: ProviderType
    base_url: str
    host: str
    port: int
    base_path: str  # without a trailing slash
    model: str | None = None
    insecure_skip_verify: bool = False
    headers: tuple[tuple[str, str], ...] = ()  # static, non-sensitive
    auth: ProviderAuth | None = None
    cluster: str = ""  # the Envoy cluster (and the value of the provider header)
    tls: bool = True  # https (Kthena requires it); False: plain http (an in-cluster LiteLLM, LLMKube allows it)
    paths: tuple[str, ...] = ()  # the request paths it takes; () = its provider type's (providers.PATHS)


@dataclass(frozen=True)
class RoutingTable:
    routes: tuple[Route, ...] = ()
    pools: Mapping[str, PoolBackend] = field(default_factory=dict)
    providers: Mapping[str, ProviderBackend] = field(default_factory=dict)
    extras: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # dialect -> its own objects, oldest first
    by_model: Mapping[str, tuple[Route, ...]] = field(default_factory=dict, compare=False)
    by_adapter: Mapping[str, tuple[Route, ...]] = field(default_factory=dict, compare=False)

    @classmethod
    def build(
        cls,
        routes: list[Route],
        pools: list[PoolBackend],
        providers: list[ProviderBackend],
        extras: Mapping[str, Sequence[Any]] | None = None,
    ) -> RoutingTable:
        by_model: dict[str, list[Route]] = {}
        by_adapter: dict[str, list[Route]] = {}
        ordered = sorted(routes, key=lambda r: r.order)
        for r in ordered:
            for m in r.models:
                by_model.setdefault(m, []).append(r)
            for a in r.adapters:
                by_adapter.setdefault(a, []).append(r)
        return cls(
            routes=tuple(ordered),
            pools={p.key: p for p in pools},
            providers={p.key: p for p in providers},
            extras={name: tuple(sorted(objs, key=lambda o: getattr(o, "order", 0)))
                    for name, objs in (extras or {}).items() if objs},
            by_model={k: tuple(v) for k, v in by_model.items()},
            by_adapter={k: tuple(v) for k, v in by_adapter.items()},
        )

    def objects(self, dialect: str) -> tuple[Any, ...]:
        """A dialect's own objects (those outside the shared route model), oldest first."""
        return self.extras.get(dialect, ())

    def routes_for(self, model: str) -> tuple[tuple[Route, ...], bool]:
        """The routes a requested model selects, oldest first, and whether it selected them as a LoRA adapter.
        Routes by model name win; adapter routes are looked at only when no route names the model."""
        found = self.by_model.get(model)
        if found:
            return found, False
        return self.by_adapter.get(model, ()), True
