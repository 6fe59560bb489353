"""round-robin-scorer (LLMKube's RoundRobin balancing): the candidates take turns, in endpoint-key order.

order    = candidates sorted by key
next     = the first key after the last committed pick (wrapping around); the first key before any pick
score(e) = 1.0 if e is next, else 0.0
pre_request records the committed pick, so a dry run (explain) never moves the turn; a candidate set that changes
between requests keeps the rotation going from where it was (keys, not positions).
"""

from __future__ import annotations

from collections.abc import Collection

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, Scorer, register
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@register("round-robin-scorer")
class RoundRobinScorer(Scorer[None]):
    clamped = True

    def setup(self, build: BuildContext) -> None:
        self.last: str | None = None

    def next_key(self, candidates: list[Endpoint]) -> str:
        keys = sorted(e.key for e in candidates)
        last = self.last
        if last is None:
            return keys[0]
        return next((k for k in keys if k > last), keys[0])

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        if not candidates:
            return []
        nxt = self.next_key(candidates)
        return [1.0 if e.key == nxt else 0.0 for e in candidates]

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        if result.targets:
            self.last = result.targets[0].key

    def endpoint_removed(self, key: str) -> None:
        """Nothing per endpoint is kept: the turn is a key, and the next one is found among live candidates."""

    def tracked_endpoints(self) -> Collection[str]:
        return ()
