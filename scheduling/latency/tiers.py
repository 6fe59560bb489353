"""SLO tiers: a request that states objectives (slo.py) ranks the candidates by whether their predicted TTFT and
TPOT meet them, and leaves its verdict for the shell; and the plain ranking by cost without objectives."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import repeat
from operator import truediv

from scheduling.framework.plugin import State
from scheduling.latency.classes import Placement
from scheduling.latency.slo import SLO_STATE, Slo, SloVerdict
from scheduling.types import Endpoint

TIGHT_PLACEMENT = Placement()  # a tight request: no penalties, nothing scarce
PREDICTED = "estimated-latency.predicted"  # endpoint -> (TTFT, TPOT): SLO requests and explain


def predictions(state: State) -> Mapping[str, tuple[float, float]] | None:
    """The (TTFT, TPOT) a decision predicted per scored candidate (SLO requests and explain), by endpoint key."""
    got: Mapping[str, tuple[float, float]] | None = state.get(PREDICTED)
    return got


def slo_scores(slo: Slo, candidates: list[Endpoint], costs: list[float], predicted: list[tuple[float, float]],
               headroom: float, state: State, placement: Placement = TIGHT_PLACEMENT) -> list[float]:
    """Scores for a request with objectives: the candidates predicted to meet them with headroom (within `headroom`
    × the SLO) first, then those predicted to meet them, each tier by cost (min cost / cost; a loose request's cost
    plus the penalties of its `placement`, classes.py); then the rest by how close they come (min TTFT / TTFT, or TPOT with a TPOT
    objective only): a request no endpoint can serve in time goes where it misses least. Tier t of 3 scores in
    ((2 − t) / 3, (3 − t) / 3]. Records the verdict (SLO_STATE) with the class the request was placed as."""
    tiers = [0 if slo.meets(tt, tp, headroom) else 1 if slo.meets(tt, tp) else 2 for tt, tp in predicted]
    by_ttft = slo.ttft_s is not None
    best: dict[int, float] = {}
    keys: list[float] = []
    extra = placement.penalties or [0.0] * len(costs)
    for tier, cost, (tt, tp), pen in zip(tiers, costs, predicted, extra, strict=True):
        v = cost + pen if tier < 2 else (tt if by_ttft else tp)
        keys.append(v)
        if tier not in best or v < best[tier]:
            best[tier] = v
    out = []
    for tier, v in zip(tiers, keys, strict=True):
        b = best[tier]
        rel = (b / v if v > 0 else 1.0) if b > 0 else (1.0 if v <= 0 else 0.0)
        out.append((2 - tier + rel) / 3.0)
    state[SLO_STATE] = SloVerdict(
        slo, {e.key: pr for e, pr in zip(candidates, predicted, strict=True)},
        frozenset(e.key for e, t in zip(candidates, tiers, strict=True) if t < 2),
        frozenset(e.key for e, t in zip(candidates, tiers, strict=True) if t == 0), placement.klass, placement.scarce,
        placement.hold, placement.hold_inflight, placement.hold_slack)
    return out


def relative(costs: list[float]) -> list[float]:
    """score(e) = min over candidates of cost / cost(e): the best endpoint scores 1."""
    best = min(costs)
    if best <= 0.0:
        return [1.0 if c <= 0.0 else 0.0 for c in costs]
    if len(costs) <= 16:  # a short list: the comprehension (setting up the C-level map costs more than it saves)
        return [best / c for c in costs]
    return list(map(truediv, repeat(best), costs))
