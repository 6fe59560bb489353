"""InferenceModelRewrite rules and the pure choice of a target model.

A rule (one entry of an InferenceModelRewrite's `spec.rules`) matches a request model either exactly (one or
more `matches[].model {type: Exact, value}`) or generically (an empty `matches` list matches every model).

Precedence (GIE): a rule with an exact match beats a generic rule; among rules of the same kind the oldest wins
(creation timestamp, then name and rule index for a stable order). The winning rule's target is then chosen at
random, weighted by `targets[].weight` (a missing weight counts as 1; when every weight is 0 the choice is uniform).

Nothing here does I/O; the RNG is injected.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RewriteTarget:
    model: str
    weight: int = 1


@dataclass(frozen=True, slots=True)
class RewriteRule:
    """One rule. `exact` holds the models it matches exactly; empty means generic (matches all)."""

    targets: tuple[RewriteTarget, ...]
    exact: frozenset[str] = frozenset()
    created: float = 0.0  # creation time (unix seconds) of the owning object: older wins
    name: str = ""  # "<namespace>/<object name>" of the owning object
    index: int = 0  # position of the rule inside the object

    @property
    def generic(self) -> bool:
        return not self.exact

    def order(self) -> tuple[float, str, int]:
        return (self.created, self.name, self.index)


def find_rule(rules: Iterable[RewriteRule], model: str) -> RewriteRule | None:
    """The rule that applies to `model`: the oldest exact match, else the oldest generic rule, else None."""
    best_exact: RewriteRule | None = None
    best_generic: RewriteRule | None = None
    for rule in rules:
        if not rule.targets:
            continue
        if rule.exact:
            if model in rule.exact and (best_exact is None or rule.order() < best_exact.order()):
                best_exact = rule
        elif best_generic is None or rule.order() < best_generic.order():
            best_generic = rule
    return best_exact if best_exact is not None else best_generic


def pick_target(targets: Sequence[RewriteTarget], rng: random.Random) -> str:
    """Weighted random choice of one target model (uniform when all weights are 0)."""
    if len(targets) == 1:
        return targets[0].model
    total = sum(max(0, t.weight) for t in targets)
    if total <= 0:
        return targets[int(rng.random() * len(targets)) % len(targets)].model
    x = rng.random() * total
    acc = 0.0
    for t in targets:
        w = max(0, t.weight)
        acc += w
        if w > 0 and x < acc:
            return t.model
    # Floating-point edge: x == total. Return the last positive-weight target.
    return next(t.model for t in reversed(targets) if t.weight > 0)


def choose_rewrite(rules: Iterable[RewriteRule], model: str, rng: random.Random) -> str | None:
    """The model the request should be rewritten to, or None when no rule applies."""
    rule = find_rule(rules, model)
    if rule is None:
        return None
    return pick_target(rule.targets, rng)
