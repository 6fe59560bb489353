"""LLMKube's routing decision, pure: which rule, which backend serves, which backends Envoy may fall back to and
which receive shadow copies. Deterministic under an injected RNG; health comes in through `Health`.

For one request (`Features`: model, classifications, complexity, headers):
1. Rules in order; the first whose match holds (every declared condition, AND) and that has an eligible healthy
   backend wins. Eligible: the rule's backends that advertise every `requiredCapabilities` entry (the others are
   never tried, not even as fallbacks) and, for a request carrying a sensitive classification, only local-tier
   ones (the classification guard, epp/routing/dialects/llmkube/classification.py). Healthy: Health says so (a pool with an
   endpoint that is not quarantined; an external backend that is not quarantined and has its credential).
   A rule with none: 503 when it is `failClosed` (it never falls through); otherwise the next rule is tried.
2. The strategy, among the healthy eligible backends:
   - primary-fallback: the first serves; the rest, in order, are the fallbacks. With `latencySLOMs`, when the
     first's rolling P95 first-byte latency is above it, the next one is promoted (the first becomes the last
     fallback);
   - weighted: one backend with probability weight / Σ weights (weight 0 never serves, even when nothing else
     is up); the fallbacks are drawn the same way from the rest, never the same one twice;
   - shadow: served as primary-fallback; the backends after the one that serves get copies.
3. No rule: `defaultRouteStrategy: BackendNameMatch` first looks for a backend whose displayName (else name)
   equals the model (an unhealthy one is a 503, not a silent reroute); then `defaultRoute`. Either is refused
   with a 503 when the request is sensitive and the backend is cloud-tier. Nothing: 503.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from epp.routing.dialects.llmkube.classification import sensitive as sensitive_of
from epp.routing.dialects.llmkube.model import (
    PRIMARY_FALLBACK,
    SHADOW,
    WEIGHTED,
    Features,
    ModelRouterSpec,
    RouterBackend,
    RouterRule,
)
from scheduling.types import ErrorCode, SchedulingError


class Health(Protocol):
    def problem(self, backend: RouterBackend) -> str | None:
        """None when the backend can take a request now; else why not (for messages and explain)."""
        ...

    def p95_ms(self, backend: RouterBackend) -> float | None:
        """The backend's rolling P95 first-byte latency, if measured."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    rule: RouterRule  # the matched rule, or a synthetic one (defaultRoute, backendNameMatch)
    backend: RouterBackend  # serves
    fallbacks: tuple[RouterBackend, ...] = ()  # in the order Envoy may try them
    mirrors: tuple[RouterBackend, ...] = ()  # shadow copies
    sensitive: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()  # rules and backends passed over, and why

    @property
    def strategy(self) -> str:
        return self.rule.strategy


def _refuse(message: str) -> SchedulingError:
    return SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, message)


def weighted_order(backends: Sequence[RouterBackend], rng: random.Random) -> list[RouterBackend]:
    """Successive draws without replacement, each with probability weight / Σ remaining weights; weight 0 never."""
    left = [b for b in backends if b.weight > 0]
    out: list[RouterBackend] = []
    while left:
        total = sum(b.weight for b in left)
        x = rng.randrange(total)
        for i, b in enumerate(left):
            x -= b.weight
            if x < 0:
                out.append(left.pop(i))
                break
    return out


def decide(spec: ModelRouterSpec, f: Features, health: Health, rng: random.Random) -> Plan:
    sens = sensitive_of(f, spec.sensitive)
    label = ", ".join(sorted(sens))
    notes: list[str] = []
    for rule in spec.rules:
        if not rule.matches(f, spec.backends):
            continue
        eligible = [spec.backends[n] for n in rule.backends if spec.backends[n].capable(rule.required)]
        if sens:
            cloud = [b.name for b in eligible if not b.local]
            if cloud:
                notes.append(f"rule {rule.name!r}: cloud backend(s) {', '.join(cloud)} skipped: the request is "
                             f"classified {label}")
            eligible = [b for b in eligible if b.local]
        usable, down = [], []
        for b in eligible:
            why = health.problem(b)
            if why is None:
                usable.append(b)
            else:
                down.append(f"{b.name}: {why}")
        if rule.strategy == WEIGHTED:
            drained = [b.name for b in usable if b.weight <= 0]
            usable = [b for b in usable if b.weight > 0]
            if drained:
                notes.append(f"rule {rule.name!r}: {', '.join(drained)} drained (weight 0)")
        if down and usable:
            notes.append(f"rule {rule.name!r}: skipped {'; '.join(down)}")
        if not usable:
            why = "; ".join(down) or ("its backends are cloud-tier and the request is classified " + label
                                      if sens else "no backend is eligible")
            if rule.fail_closed:
                raise _refuse(f"fail-closed: rule {rule.name!r} of ModelRouter {spec.key} has no healthy allowed "
                              f"backend ({why}); the request is not sent anywhere else")
            notes.append(f"rule {rule.name!r} matched but has no healthy backend ({why}); trying the next")
            continue
        return _strategy(rule, usable, health, rng, sens, notes)
    return _unmatched(spec, f, health, sens, notes)


def _strategy(rule: RouterRule, usable: list[RouterBackend], health: Health, rng: random.Random,
              sens: frozenset[str], notes: list[str]) -> Plan:
    if rule.strategy == WEIGHTED:
        order = weighted_order(usable, rng)
        return Plan(rule, order[0], tuple(order[1:]), (), sens, tuple(notes))
    order = list(usable)
    if rule.strategy == PRIMARY_FALLBACK and rule.latency_slo_ms is not None and len(order) > 1:
        p95 = health.p95_ms(order[0])
        if p95 is not None and p95 > rule.latency_slo_ms:
            notes.append(f"rule {rule.name!r}: {order[0].name} P95 first byte {p95:.0f} ms > latencySLOMs "
                         f"{rule.latency_slo_ms}: {order[1].name} promoted")
            order = order[1:] + order[:1]
    mirrors = tuple(order[1:]) if rule.strategy == SHADOW else ()
    fallbacks = tuple(order[1:])
    return Plan(rule, order[0], fallbacks, mirrors, sens, tuple(notes))


DEFAULT_RULE = "defaultRoute"
NAME_MATCH_RULE = "backendNameMatch"


def _unmatched(spec: ModelRouterSpec, f: Features, health: Health, sens: frozenset[str], notes: list[str]) -> Plan:
    label = ", ".join(sorted(sens))
    index = len(spec.rules)
    if spec.default_strategy == "BackendNameMatch" and f.model:
        b = spec.by_published(f.model)
        if b is not None:
            if sens and not b.local:
                raise _refuse(f"backend {b.name!r} (named by the request's model) is cloud-tier, and the request is "
                              f"classified {label}: sensitive data is served by local backends only")
            why = health.problem(b)
            if why is not None:
                raise _refuse(f"backend {b.name!r}, named by the request's model, is not healthy ({why})")
            rule = RouterRule(NAME_MATCH_RULE, index, (b.name,), synthetic=True)
            return Plan(rule, b, (), (), sens, tuple(notes))
    if spec.default_route is None:
        raise _refuse(f"no rule of ModelRouter {spec.key} matches this request, and it has no defaultRoute"
                      + (f" ({'; '.join(notes)})" if notes else ""))
    b = spec.backends[spec.default_route]
    if sens and not b.local:
        raise _refuse(f"no rule of ModelRouter {spec.key} keeps this request local, and its defaultRoute "
                      f"{b.name!r} is cloud-tier: the request is classified {label}, and sensitive data is served "
                      "by local backends only")
    why = health.problem(b)
    if why is not None:
        raise _refuse(f"the defaultRoute backend {b.name!r} of ModelRouter {spec.key} is not healthy ({why})"
                      + (f"; {'; '.join(notes)}" if notes else ""))
    return Plan(RouterRule(DEFAULT_RULE, index + 1, (b.name,), synthetic=True), b, (), (), sens, tuple(notes))
