"""LLMKube's ModelRouter (`inference.llmkube.dev/v1alpha1`) as compiled values: backends, rules, budgets and the
router-wide policy. epp/routing/dialects/llmkube/documents.py builds them from a document; epp/routing/dialects/llmkube/match.py decides with
them. Everything here is immutable and does no I/O.

A ModelRouter compiles to one `ModelRouterSpec` plus a `PoolBackend` per InferenceService it names and a
`ProviderBackend` per external backend (the routing layer's own backends, see model.py).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from epp.ratelimit import Price
from epp.routing.model import Route, Target

GROUP = "inference.llmkube.dev"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "ModelRouter"
DEFAULT_CLASSIFICATION_HEADER = "x-llmkube-classification"
COMPLEXITY_HEADER = "x-llmkube-task-complexity"
DEFAULT_TEAM_HEADER = "x-llmkube-team"
DEFAULT_SENSITIVE = frozenset(("pii", "phi"))
SERVICE_LABEL = "inference.llmkube.dev/service"  # the label LLMKube puts on an InferenceService's pods
DEFAULT_SERVICE_PORT = 8080  # an InferenceService's port unless its spec.endpoint.port says otherwise
DEFAULT_QUARANTINE_S = 15.0
DEFAULT_STREAM_IDLE_S = 300.0
DEFAULT_RESPONSE_HEADER_TIMEOUT_S = 120.0

Tier = Literal["local", "cloud"]
Strategy = Literal["primary-fallback", "weighted", "shadow"]
PRIMARY_FALLBACK: Strategy = "primary-fallback"
WEIGHTED: Strategy = "weighted"
SHADOW: Strategy = "shadow"
STRATEGIES: tuple[Strategy, ...] = (PRIMARY_FALLBACK, WEIGHTED, SHADOW)
TIERS: tuple[Tier, ...] = ("local", "cloud")
BudgetScope = Literal["router", "rule", "team"]
BUDGET_SCOPES: tuple[BudgetScope, ...] = ("router", "rule", "team")
DefaultStrategy = Literal["Static", "BackendNameMatch"]  # spec.defaultRouteStrategy
DEFAULT_STRATEGIES: tuple[DefaultStrategy, ...] = ("Static", "BackendNameMatch")


def normalize_label(value: str) -> str:
    """A classification or complexity value as compared: Unicode NFKC, case-folded, trimmed of blanks and
    quotes. "PII", " pii ", "\"pii\"" and the full-width "ＰＩＩ" all read as "pii"."""
    return unicodedata.normalize("NFKC", value).strip().strip("\"'").strip().casefold()


# ---- Go's path.Match, which LLMKube's `models` globs follow ------------------------------------------------------
def go_glob(pattern: str) -> re.Pattern[str]:
    """A regular expression equivalent to Go's path.Match(pattern, name) over the whole name: `*` is any run of
    characters except '/', `?` one character except '/', `[...]` / `[^...]` a class of ranges `a-z`, and `\\c`
    the character c. Raises ValueError for a pattern Go calls malformed (ErrBadPattern)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\":
            if i + 1 >= n:
                raise ValueError("a trailing backslash escapes nothing")
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[":
            i, cls = _glob_class(pattern, i + 1)
            out.append(cls)
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _glob_class(p: str, i: int) -> tuple[int, str]:
    neg = i < len(p) and p[i] == "^"
    if neg:
        i += 1
    parts: list[str] = []
    while True:
        if i < len(p) and p[i] == "]" and parts:
            return i + 1, "[" + ("^" if neg else "") + "".join(parts) + "]"
        i, lo = _class_char(p, i)
        if i < len(p) and p[i] == "-":
            i, hi = _class_char(p, i + 1)
            if hi < lo:
                raise ValueError(f"the range {lo}-{hi} is empty")
            parts.append(f"{re.escape(lo)}-{re.escape(hi)}")
        else:
            parts.append(re.escape(lo))


def _class_char(p: str, i: int) -> tuple[int, str]:
    if i >= len(p):
        raise ValueError("a character class is not closed with ']'")
    c = p[i]
    if c == "\\":
        if i + 1 >= len(p):
            raise ValueError("a trailing backslash escapes nothing")
        return i + 2, p[i + 1]
    if c in "-]":
        raise ValueError(f"{c!r} must be escaped inside a character class")
    return i + 1, c


# ---- backends --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PrefixAffinity:
    block_bytes: int = 1024
    max_blocks: int = 16_384


@dataclass(frozen=True, slots=True)
class SessionAffinity:
    headers: tuple[str, ...]  # lower-case, in priority order
    idle_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class Balancing:
    mode: Literal["RoundRobin", "LoadAware"] = "RoundRobin"
    prefix: PrefixAffinity | None = None  # None: off (also when ignored under RoundRobin)
    session: SessionAffinity | None = None


@dataclass(frozen=True, slots=True)
class RouterBackend:
    name: str
    target: Target  # the routing layer's backend: a pool (InferenceService) or a provider (external)
    tier: Tier
    published: str  # displayName, else name: the model id clients may name (BackendNameMatch), the gateway key
    capabilities: frozenset[str] = frozenset()
    weight: int = 1
    timeout_s: float | None = None
    price: Price | None = None
    service: str | None = None  # the InferenceService of a local backend
    balancing: Balancing = field(default_factory=Balancing)

    @property
    def kind(self) -> str:
        return self.target.kind

    @property
    def local(self) -> bool:
        return self.tier == "local"

    def capable(self, required: frozenset[str]) -> bool:
        return required <= self.capabilities


# ---- rules -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Features:
    """What rules match on, read once per request."""

    model: str
    classifications: frozenset[str]  # normalized values of the classification header (every value it carries)
    complexity: str  # normalized x-llmkube-task-complexity
    headers: Mapping[str, str]  # lower-case names


@dataclass(frozen=True, slots=True)
class RouterRule:
    name: str
    index: int
    backends: tuple[str, ...]
    strategy: Strategy = PRIMARY_FALLBACK
    models: tuple[tuple[str, re.Pattern[str]], ...] = ()  # (the glob as written, its regex)
    headers: tuple[tuple[str, str], ...] = ()  # (lower-case name, exact value)
    classifications: frozenset[str] = frozenset()  # normalized
    required: frozenset[str] = frozenset()  # requiredCapabilities
    complexity: str | None = None
    latency_slo_ms: int | None = None
    timeout_s: float | None = None
    fail_closed: bool = False
    synthetic: bool = False  # defaultRoute / backendNameMatch: not a rule of the document

    def matches(self, f: Features, backends: Mapping[str, RouterBackend]) -> bool:
        """Every declared condition holds (AND); an undeclared one matches everything."""
        if self.classifications and not (self.classifications & f.classifications):
            return False
        if self.complexity is not None and self.complexity != f.complexity:
            return False
        if self.models and not _model_matches(self.models, f.model):
            return False
        for name, value in self.headers:
            if f.headers.get(name) != value:
                return False
        if self.required and not any(
            (b := backends.get(n)) is not None and b.capable(self.required) for n in self.backends
        ):
            return False
        return True


def _model_matches(models: tuple[tuple[str, re.Pattern[str]], ...], model: str) -> bool:
    if not model:  # an empty model can only satisfy a literal "*" (as LLMKube)
        return any(glob == "*" for glob, _ in models)
    return any(rx.fullmatch(model) is not None for _, rx in models)


# ---- budgets ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Budget:
    name: str
    scope: BudgetScope
    window_s: int
    max_tokens: int | None = None
    max_usd: float | None = None
    rule: str | None = None  # scope rule
    header: str = DEFAULT_TEAM_HEADER  # scope team (lower-case)


# ---- the router ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelRouterSpec:
    key: str  # "namespace/name"
    source: str
    backends: Mapping[str, RouterBackend]
    rules: tuple[RouterRule, ...]
    route: Route  # the same rules as a routing-layer Route (explain, metrics and decision logs read it)
    order: tuple[float, str] = (0.0, "")
    data_plane: str = "Proxy"
    default_route: str | None = None
    default_strategy: DefaultStrategy = "Static"
    classification_header: str = DEFAULT_CLASSIFICATION_HEADER
    sensitive: frozenset[str] = DEFAULT_SENSITIVE
    budgets: tuple[Budget, ...] = ()
    quarantine_s: float = DEFAULT_QUARANTINE_S
    stream_idle_s: float = DEFAULT_STREAM_IDLE_S  # 0: the guard is off
    response_header_timeout_s: float = DEFAULT_RESPONSE_HEADER_TIMEOUT_S
    warnings: tuple[str, ...] = ()

    kind: str = KIND

    def by_published(self, model: str) -> RouterBackend | None:
        for b in self.backends.values():
            if b.published == model:
                return b
        return None

    def rule_named(self, name: str) -> RouterRule | None:
        return next((r for r in self.rules if r.name == name), None)
