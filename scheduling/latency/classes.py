"""SLO classes and headroom-aware placement: a request with more slack yields the endpoints with the shortest
predicted waits to the requests with less.

The tightest class is the tightest objective (by TTFT, then TPOT) that requests stated within the last `window`
seconds (`SloClasses`, one per scorer, fed by the requests it schedules). A request whose objectives are that
tight is placed as `tight`: it takes the best endpoint, as before. A looser one is placed as `loose` and pays,
on top of its cost, for the room it would take from the tight class on each endpoint:

    floor(e)    = the TTFT a request whose prompt e holds entirely would get there: e's queue, backlog and overhead
                  (the latency model with no uncached tokens); tpot(e) the predicted TPOT there
    reserve(e)  = how much of its room for the tight class T e still has, next to the least loaded candidate:
                  min over the objectives T states of (T.ttft − floor(e)) / (T.ttft − min floor), and the same of
                  tpot(e) against T.tpot, clamped to [0, 1]: 1 on the least loaded, 0 where T is predicted to miss
    slack       = L.ttft × headroom − T.ttft: how much later than a tight request the loose one L may start
    penalty(e)  = yield × reserve(e) × slack                            (seconds, added to cost(e))

So among the endpoints that still meet its objective (with headroom), a loose request prefers the busier ones the
tight class can no longer use, and pays more the more slack it has; an endpoint the tight class cannot use costs it
nothing extra, and without a tighter class in play (or without headers) nothing changes.

Admission keeps room for the tight class: when at most `share` of the candidates still have room for it (reserve > 0;
the pool nears saturation for tight requests), those candidates are scarce, and a sheddable loose request that would
take one is shed by the shell (epp/request/commit.py) instead. And a loose request whose pick is busy waits in the
shell for part of its slack, so tight requests go first (hold.py). Pure: no I/O, time passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduling.latency.slo import Slo

TIGHT, LOOSE = "tight", "loose"
MAX_CLASSES = 32  # distinct objectives remembered (the oldest goes first)


def tightness(slo: Slo) -> tuple[float, float]:
    """The order of objectives: TTFT first, then TPOT; an absent objective is the loosest."""
    return (slo.ttft_s if slo.ttft_s is not None else math.inf, slo.tpot_s if slo.tpot_s is not None else math.inf)


class SloClasses:
    """The objectives requests stated lately, and the tightest of them."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.seen: dict[Slo, float] = {}  # objective -> when a request last stated it

    def observe(self, slo: Slo, now: float) -> None:
        seen = self.seen
        seen.pop(slo, None)
        seen[slo] = now  # insertion order = last seen order
        if len(seen) > MAX_CLASSES:
            del seen[next(iter(seen))]

    def tightest(self, now: float) -> Slo | None:
        """The tightest objective stated within the window (None when none was)."""
        live = [s for s, t in self.seen.items() if now - t <= self.window]
        return min(live, key=tightness) if live else None

    def classify(self, slo: Slo, now: float) -> tuple[str, Slo | None]:
        """(`tight` or `loose`, the tightest class when `slo` is looser than it, else None)."""
        tight = self.tightest(now)
        if tight is None or tightness(slo) <= tightness(tight) or slo.ttft_s is None or tight.ttft_s is None:
            return TIGHT, None
        return LOOSE, tight


def _room(limit: float | None, values: Sequence[float]) -> list[float]:
    if limit is None:
        return [1.0] * len(values)
    span = limit - min(values)
    if span <= 0:
        return [0.0] * len(values)
    return [min(1.0, max(0.0, (limit - v) / span)) for v in values]


def reserves(tight: Slo, floors: Sequence[tuple[float, float]]) -> list[float]:
    """reserve(e) per candidate (module docstring): 1 on the least loaded, 0 where the tight class would miss."""
    ttft = _room(tight.ttft_s, [f[0] for f in floors])
    tpot = _room(tight.tpot_s, [f[1] for f in floors])
    return [min(a, b) for a, b in zip(ttft, tpot, strict=True)]


@dataclass(frozen=True, slots=True)
class Placement:
    """How a request is placed: its class, what yielding adds to each candidate's cost, and the candidates that
    are the tight class's last room (a sheddable loose request is shed rather than take one)."""

    klass: str = TIGHT
    penalties: list[float] | None = None
    scarce: frozenset[str] = frozenset()
    hold: float = 0.0  # > 0: may be held back while its pick is busy (hold.py); its slack: TTFT × this − predicted
    hold_inflight: int = 0  # > 0: its pick is busy also while it has this many requests in flight
    hold_slack: float = 1.0  # the share of its slack (its TTFT × hold − its predicted TTFT) it may spend held


def place(loose: Slo, tight: Slo, keys: Sequence[str], floors: Sequence[tuple[float, float]], headroom: float,
          weight: float, share: float, hold: tuple[int, float] | None = None) -> Placement:
    """A loose request's placement: weight × reserve(e) × slack added to each candidate's cost (module docstring);
    and, when at most `share` of the candidates have room for the tight class left (the pool nears saturation for
    it), those candidates as scarce. `floors`: (TTFT, TPOT) per candidate of a request whose prompt it holds
    entirely. `hold`: None, never held; else (in flight, slack share): it may be held while its pick has tight work
    pending or (when > 0) at least that many requests in flight, for at most that share of its slack (hold.py)."""
    assert loose.ttft_s is not None and tight.ttft_s is not None
    room = reserves(tight, floors)
    k = weight * max(0.0, loose.ttft_s * headroom - tight.ttft_s)
    roomy = [key for key, r in zip(keys, room, strict=True) if r > 0.0]
    scarce = frozenset(roomy) if roomy and len(roomy) <= share * len(keys) else frozenset()
    inflight, slack = hold if hold is not None else (0, 0.0)
    return Placement(LOOSE, [k * r for r in room] if k > 0 else None, scarce, headroom if hold is not None else 0.0,
                     inflight, slack)
