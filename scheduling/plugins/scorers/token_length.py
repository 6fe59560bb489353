"""token-length-scorer (Heimdall): how well an endpoint's advertised minimum prompt size fits the prompt.

t       = prompt tokens ≈ prompt_chars / CHARS_PER_TOKEN (4)
m(e)    = int(label mif.moreh.io/aigateway.optimal-min-tokens), 0 or unset = no advertised minimum
fit(e)  = (m + 1) / (t + 1)          if m ≤ t   (the largest minimum the prompt still meets fits best)
        = 0.5 × (t + 1) / (m + 1)    if m > t   (prompt too short for this endpoint)
score(e) = fit(e) / max fit over the candidates       (max-normalised: the best candidate gets 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduling.api import SchedulingContext
from scheduling.framework import Scorer, register
from scheduling.framework.plugin import State
from scheduling.types import Endpoint

LABEL = "mif.moreh.io/aigateway.optimal-min-tokens"


def optimal_min_tokens(labels: Mapping[str, str]) -> int:
    raw = labels.get(LABEL)
    if not raw:
        return 0
    try:
        return max(0, int(raw))
    except ValueError:
        return 0


@register("token-length-scorer")
class TokenLengthScorer(Scorer[None]):
    clamped = True

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        t = ctx.request.estimated_tokens
        fits = []
        for e in candidates:
            m = optimal_min_tokens(e.labels)
            fits.append((m + 1) / (t + 1) if m <= t else 0.5 * (t + 1) / (m + 1))
        best = max(fits)
        return [f / best for f in fits]
