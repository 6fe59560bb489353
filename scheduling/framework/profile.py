"""A scheduling profile: ordered filters, weighted scorers and one picker.

run(): filters in order (an empty result raises ResourceExhausted, i.e. 429), then every scorer's values are
clamped to [0, 1], multiplied by the scorer's weight and summed per endpoint, then the picker chooses.
Per-plugin details are built only when `ctx.explain` is on or a timer was injected (for durations); with
neither, the hot path allocates nothing per plugin.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scheduling.api import PluginDetail, ProfileResult, SchedulingContext
from scheduling.framework.plugin import Filter, Picker, Scorer, State
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
    return namespace["combine"]  # type: ignore[return-value]


def clamp_scores(values: Sequence[float]) -> list[float]:
    """Clamp to [0, 1]; NaN becomes 0."""
    return [v if 0.0 <= v <= 1.0 else (1.0 if v > 1.0 else 0.0) for v in values]


@dataclass
class Profile:
    name: str
    filters: list[Filter[Any]]
    scorers: list[tuple[Scorer[Any], float]]
    picker: Picker[Any]

    def __post_init__(self) -> None:
        self._combine = make_combiner([w for _, w in self.scorers])

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
        explain = ctx.explain
        details: list[PluginDetail] | None = [] if (explain or timer is not None) else None
        cands = candidates
        for f in self.filters:
            if details is None:
                cands = f.filter(ctx, cands, state)
            else:
                t0 = timer() if timer is not None else 0.0
                cands = f.filter(ctx, cands, state)
                dur = (timer() - t0) if timer is not None else 0.0
                details.append(
                    PluginDetail(
                        f.name, f.type_name, "filter", dur, kept=[e.key for e in cands] if explain else None
                    )
                )
            if not cands:
                raise SchedulingError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"no endpoint available for model {ctx.request.target_model or ctx.request.model!r}: "
                    f"filter {f.name!r} of profile {self.name!r} removed all candidates",
                )
        n = len(cands)
        all_values: list[Sequence[float]] = []
        for scorer, weight in self.scorers:
            if details is not None and timer is not None:
                t0 = timer()
                values = scorer.score(ctx, cands, state)
                dur = timer() - t0
            else:
                values = scorer.score(ctx, cands, state)
                dur = 0.0
            if not scorer.clamped:
                values = clamp_scores(values)
            if len(values) != n:
                raise SchedulingError(
                    ErrorCode.INTERNAL,
                    f"scorer {scorer.name!r} returned {len(values)} scores for {n} endpoints",
                )
            all_values.append(values)
            if details is not None:
                details.append(
                    PluginDetail(
                        scorer.name,
                        scorer.type_name,
                        "scorer",
                        dur,
                        weight=weight,
                        scores={e.key: float(v) for e, v in zip(cands, values, strict=True)}
                        if explain
                        else None,
                        values=values,
                    )
                )
        totals = self._combine(*all_values) if all_values else [0.0] * n
        picker = self.picker
        if details is not None and timer is not None:
            t0 = timer()
            picked = picker.pick(ctx, cands, totals, rng)
            details.append(PluginDetail(picker.name, picker.type_name, "picker", timer() - t0))
        else:
            picked = picker.pick(ctx, cands, totals, rng)
            if details is not None:
                details.append(PluginDetail(picker.name, picker.type_name, "picker"))
        targets = [cands[i] for i in picked]
        result = ProfileResult(self.name, targets, scored=cands, score_totals=totals)
        if explain:
            result.totals = {e.key: t for e, t in zip(cands, totals, strict=True)}
        if details is not None:
            result.details = details
        return result
