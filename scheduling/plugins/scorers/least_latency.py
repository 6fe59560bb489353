"""least-latency (Kthena): prefer endpoints whose engine reports lower latency.

    ttft(e), tpot(e) = the engine's mean time to first token and time per output token over the last scrape
                       period (Metrics.ttft_s / tpot_s, from vllm:/sglang: time_to_first_token_seconds and
                       inter_token_latency_seconds or time_per_output_token_seconds)
    over the candidates that have both:
      s_ttft(e) = (max ttft − ttft(e)) / (max ttft − min ttft)      (1.0 when all equal)
      s_tpot(e) = (max tpot − tpot(e)) / (max tpot − min tpot)      (1.0 when all equal)
      score(e)  = w × s_ttft(e) + (1 − w) × s_tpot(e)               w = TTFTTPOTWeightFactor (0.5), in [0, 1]
    a candidate without both (never measured) scores 0.5: some traffic, without outranking measured ones
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.api import SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    TTFTTPOTWeightFactor: float = bounded(0.5, min=0.0, max=1.0)


def _norm(value: float, lo: float, hi: float) -> float:
    return 1.0 if hi <= lo else (hi - value) / (hi - lo)


@register("least-latency")
class LeastLatency(Scorer[Params]):
    Params = Params
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        measured = [(e.metrics.ttft_s, e.metrics.tpot_s) for e in candidates]
        known = [(t, p) for t, p in measured if t is not None and p is not None and t > 0 and p > 0]
        if not known:
            return [0.5] * len(candidates)
        t_lo, t_hi = min(t for t, _ in known), max(t for t, _ in known)
        p_lo, p_hi = min(p for _, p in known), max(p for _, p in known)
        w = self.params.TTFTTPOTWeightFactor
        out = []
        for t, p in measured:
            if t is None or p is None or t <= 0 or p <= 0:
                out.append(0.5)
            else:
                out.append(w * _norm(t, t_lo, t_hi) + (1 - w) * _norm(p, p_lo, p_hi))
        return out
