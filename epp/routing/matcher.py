"""The pure route matcher: which route, which rule, which target. Deterministic under an injected RNG.

For a requested model:
1. The routes naming it (`models`), oldest first; only when there are none, the routes listing it as a LoRA adapter.
2. In each route the rules are tried in order and the first whose match holds wins (an empty match holds for
   every request). A route with no matching rule passes the request to the next route.
3. The winning rule's targets split traffic by weight: target i is chosen with probability w_i / Σw (a weight of
   0 is never chosen).
No route for the model -> `Selection.miss(had_routes=False)`; routes but no rule matched -> `had_routes=True` (404).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from epp.routing.model import Route, RoutingTable, Rule, Target


@dataclass(frozen=True, slots=True)
class Selection:
    route: Route | None = None
    rule: Rule | None = None
    target: Target | None = None
    by_adapter: bool = False  # the model selected the route as a LoRA adapter
    had_routes: bool = False  # (a miss) some route named the model, but none of its rules matched

    @property
    def matched(self) -> bool:
        return self.target is not None

    @property
    def split(self) -> tuple[Target, ...]:
        return self.rule.targets if self.rule is not None else ()


def pick_weighted(targets: Sequence[Target], rng: random.Random) -> Target | None:
    """Target i with probability w_i / Σw; None when every weight is 0."""
    if len(targets) == 1:
        return targets[0] if targets[0].weight > 0 else None
    total = sum(t.weight for t in targets if t.weight > 0)
    if total <= 0:
        return None
    x = rng.randrange(total)
    for t in targets:
        if t.weight <= 0:
            continue
        x -= t.weight
        if x < 0:
            return t
    return None  # unreachable: x < total


def first_rule(route: Route, model: str, path: str, headers: Mapping[str, str]) -> Rule | None:
    for rule in route.rules:
        if rule.match.matches(model, path, headers):
            return rule
    return None


def select(
    table: RoutingTable, model: str, path: str, headers: Mapping[str, str], rng: random.Random
) -> Selection:
    routes, by_adapter = table.routes_for(model)
    for route in routes:
        rule = first_rule(route, model, path, headers)
        if rule is None:
            continue
        target = pick_weighted(rule.targets, rng)
        if target is None:
            continue
        return Selection(route, rule, target, by_adapter, True)
    return Selection(by_adapter=by_adapter, had_routes=bool(routes))
