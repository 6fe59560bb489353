"""A scheduling profile: ordered filters, weighted scorers and one picker.

run() is three steps:
- filter: the filters in order; an empty result raises ResourceExhausted (429);
- score: every scorer's values are clamped to [0, 1] (unless the scorer guarantees it), multiplied by the
  scorer's weight and summed per endpoint (one generated pass for all scorers);
- pick: the picker chooses from the totals.
What explain and timing want of each plugin is collected by a `Trace`, built only when `ctx.explain` is on or a
timer was injected (for durations); with neither, the hot path allocates nothing per plugin.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from scheduling.api import PluginDetail, ProfileResult, SchedulingContext
from scheduling.framework.plugin import Filter, Picker, Plugin, Scorer, State, ZeroScores
from scheduling.types import Endpoint, ErrorCode, SchedulingError

Timer = Callable[[], float]


def make_combiner(weights: Sequence[float]) -> Callable[..., list[float]]:
    """A function summing k score lists with fixed weights in ONE pass: combine(v0, ..., vk-1) ->
    [w0*v0[j] + ... + wk-1*vk-1[j] for j]. Generated once per profile (one pass instead of k)."""
    k = len(weights)
    if k == 0:
        return lambda: []
    if k == 1 and weights[0] == 1.0:
        return list  # one scorer of weight 1: its scores, copied (in C)
    args = ", ".join(f"v{i}" for i in range(k))
    items = ", ".join(f"a{i}" for i in range(k))
    terms = " + ".join(f"a{i}" if w == 1.0 else f"w{i} * a{i}" for i, w in enumerate(weights))
    if k == 1:
        src = f"def combine(v0):\n    return [{terms} for a0 in v0]\n"
    else:
        src = f"def combine({args}):\n    return [{terms} for {items} in zip({args})]\n"
    namespace: dict[str, object] = {f"w{i}": float(w) for i, w in enumerate(weights)}
    exec(compile(src, f"<combine {list(weights)}>", "exec"), namespace)  # noqa: S102 - trusted, generated here
    return cast(Callable[..., list[float]], namespace["combine"])


def clamp_scores(values: Sequence[float]) -> list[float]:
    """Clamp to [0, 1]; NaN becomes 0."""
    return [v if 0.0 <= v <= 1.0 else (1.0 if v > 1.0 else 0.0) for v in values]


class Trace:
    """The per-plugin details of one profile run (PluginDetail, in run order): durations when a timer was injected,
    kept endpoints and scores by endpoint when explain is on."""

    __slots__ = ("explain", "timer", "details")

    def __init__(self, explain: bool, timer: Timer | None) -> None:
        self.explain = explain
        self.timer = timer
        self.details: list[PluginDetail] = []

    def start(self) -> float:
        return self.timer() if self.timer is not None else 0.0

    def elapsed(self, t0: float) -> float:
        return self.timer() - t0 if self.timer is not None else 0.0

    def filtered(self, f: Plugin[Any], t0: float, kept: list[Endpoint]) -> None:
        dur = self.elapsed(t0)
        self.details.append(
            PluginDetail(f.name, f.type_name, "filter", dur, kept=[e.key for e in kept] if self.explain else None)
        )

    def scored(
        self, s: Plugin[Any], weight: float, dur: float, cands: list[Endpoint], values: Sequence[float]
    ) -> None:
        scores = {e.key: float(v) for e, v in zip(cands, values, strict=True)} if self.explain else None
        self.details.append(
            PluginDetail(s.name, s.type_name, "scorer", dur, weight=weight, scores=scores, values=values)
        )

    def picked(self, p: Plugin[Any], t0: float) -> None:
        self.details.append(PluginDetail(p.name, p.type_name, "picker", self.elapsed(t0)))


@dataclass
class Profile:
    name: str
    filters: list[Filter[Any]]
    scorers: list[tuple[Scorer[Any], float]]
    picker: Picker[Any]

    def __post_init__(self) -> None:
        self._combine = make_combiner([w for _, w in self.scorers])
        # Combiners for subsets of the scorers, by the indices of those that returned ZeroScores (left out).
        self._partial: dict[tuple[int, ...], Callable[..., list[float]]] = {}

    def plugins(self) -> list[Any]:
        return [*self.filters, *(s for s, _ in self.scorers), self.picker]

    def run(
        self,
        ctx: SchedulingContext,
        candidates: list[Endpoint],
        state: State,
        rng: random.Random,
        timer: Timer | None = None,
    ) -> ProfileResult:
        trace = Trace(ctx.explain, timer) if (ctx.explain or timer is not None) else None
        cands = self.filter(ctx, candidates, state, trace)
        totals = self.score(ctx, cands, state, trace)
        targets = self.pick(ctx, cands, totals, rng, trace)
        result = ProfileResult(self.name, targets, scored=cands, score_totals=totals)
        if ctx.explain:
            result.totals = {e.key: t for e, t in zip(cands, totals, strict=True)}
        if trace is not None:
            result.details = trace.details
        return result

    def filter(
        self, ctx: SchedulingContext, candidates: list[Endpoint], state: State, trace: Trace | None = None
    ) -> list[Endpoint]:
        """The candidates every filter keeps, in order. Raises ResourceExhausted when a filter keeps none."""
        cands = candidates
        for f in self.filters:
            if trace is None:
                cands = f.filter(ctx, cands, state)
            else:
                t0 = trace.start()
                cands = f.filter(ctx, cands, state)
                trace.filtered(f, t0, cands)
            if not cands:
                raise SchedulingError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"no endpoint available for model {ctx.request.target_model or ctx.request.model!r}: "
                    f"filter {f.name!r} of profile {self.name!r} removed all candidates",
                )
        return cands

    def score(
        self, ctx: SchedulingContext, cands: list[Endpoint], state: State, trace: Trace | None = None
    ) -> list[float]:
        """The weighted sum of every scorer's (clamped) values, per candidate."""
        n = len(cands)
        all_values: list[Sequence[float]] = []
        zero: list[int] | None = None  # indices of scorers that returned ZeroScores (left out of the sum)
        for i, (scorer, weight) in enumerate(self.scorers):
            if trace is None:
                values = scorer.score(ctx, cands, state)
            else:
                t0 = trace.start()
                values = scorer.score(ctx, cands, state)
                dur = trace.elapsed(t0)
            if not scorer.clamped:
                values = clamp_scores(values)
            if len(values) != n:
                raise SchedulingError(
                    ErrorCode.INTERNAL,
                    f"scorer {scorer.name!r} returned {len(values)} scores for {n} endpoints",
                )
            if trace is not None:
                trace.scored(scorer, weight, dur, cands, values)
            if type(values) is ZeroScores:
                if zero is None:
                    zero = []
                zero.append(i)
                continue
            all_values.append(values)
        if zero is None:
            return self._combine(*all_values) if all_values else [0.0] * n
        if not all_values:
            return [0.0] * n
        combine = self._partial.get(tuple(zero))
        if combine is None:
            combine = self._partial[tuple(zero)] = make_combiner(
                [w for i, (_, w) in enumerate(self.scorers) if i not in zero])
        return combine(*all_values)

    def pick(
        self,
        ctx: SchedulingContext,
        cands: list[Endpoint],
        totals: list[float],
        rng: random.Random,
        trace: Trace | None = None,
    ) -> list[Endpoint]:
        """The picker's choice, best first."""
        picker = self.picker
        if trace is None:
            picked = picker.pick(ctx, cands, totals, rng)
        else:
            t0 = trace.start()
            picked = picker.pick(ctx, cands, totals, rng)
            trace.picked(picker, t0)
        return [cands[i] for i in picked]
