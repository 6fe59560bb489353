"""Per-request latency objectives (SLOs), as llm-d states them, and what a decision predicted about them.

Headers (llm-d's current names first, then the older ones; values in milliseconds, as llm-d parses them, decimals
accepted): `x-llm-d-slo-ttft-ms` / `x-slo-ttft-ms` (time to first token) and `x-llm-d-slo-tpot-ms` /
`x-slo-tpot-ms` (time per output token). A missing, empty, non-numeric, non-positive or non-finite value states no
objective; a value above `MAX_SLO_MS` (one hour) is taken as one hour, so a huge value can neither overflow a
deadline nor mean anything but "loose".

A scorer that predicts latency (estimated-latency-scorer, through tiers.py) records its verdict in the decision's
state under `SLO_STATE`: the objective, the predicted TTFT and TPOT of every candidate, and whether any candidate is
predicted to meet it. The shell reads it (`decision_slo`) to shed a sheddable request no endpoint can serve in time and to
count predicted and actual attainment. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
TPOT_HEADERS = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")
MAX_SLO_MS = 3_600_000.0
SLO_STATE = "slo.verdict"


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float | None  # None: no TTFT objective
    tpot_s: float | None

    def meets(self, ttft: float, tpot: float, margin: float = 1.0) -> bool:
        """Whether predictions `ttft` and `tpot` are within the objectives × `margin` (< 1: with headroom)."""
        return ((self.ttft_s is None or ttft <= self.ttft_s * margin)
                and (self.tpot_s is None or tpot <= self.tpot_s * margin))

    def describe(self) -> str:
        parts = []
        if self.ttft_s is not None:
            parts.append(f"ttft {self.ttft_s * 1000:g} ms")
        if self.tpot_s is not None:
            parts.append(f"tpot {self.tpot_s * 1000:g} ms")
        return ", ".join(parts)


def _ms(headers: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    for name in names:
        raw = headers.get(name)
        if not raw:
            continue
        try:
            value = float(raw.strip())
        except ValueError:
            return None
        if not math.isfinite(value) or value <= 0:
            return None
        return min(value, MAX_SLO_MS) / 1000.0
    return None


def slo_from_headers(headers: Mapping[str, str]) -> Slo | None:
    """The request's objectives, or None when it states none (see the module docstring)."""
    if not headers:
        return None
    ttft, tpot = _ms(headers, TTFT_HEADERS), _ms(headers, TPOT_HEADERS)
    if ttft is None and tpot is None:
        return None
    return Slo(ttft, tpot)


@dataclass(frozen=True, slots=True)
class SloVerdict:
    slo: Slo
    predicted: Mapping[str, tuple[float, float]]  # endpoint key -> (TTFT, TPOT) seconds
    met: frozenset[str]  # the candidates predicted to meet the objectives
    headroom: frozenset[str]  # ... with headroom
    klass: str = "tight"  # the class it was placed as (classes.py): tight (takes the best) or loose (yields)
    scarce: frozenset[str] = frozenset()  # loose: the tight class's last room (a sheddable request does not take it)
    hold: float = 0.0  # loose: it may be held while its pick is busy (hold.py), its slack = TTFT × hold − predicted
    hold_inflight: int = 0  # loose: its pick is busy also while this many requests are in flight there (> 0)
    hold_slack: float = 1.0  # loose: the share of its slack it may spend held

    def takes_scarce(self, key: str) -> bool:
        """A loose request picked `key`, one of the last endpoints with room for the tight class."""
        return key in self.scarce

    def headroom_of(self, key: str) -> tuple[float | None, float | None]:
        """(TTFT, TPOT) headroom in seconds on `key`: the objective minus the prediction (negative: predicted to
        miss), None for an objective the request does not state or an endpoint not predicted."""
        got = self.predicted.get(key)
        if got is None:
            return None, None
        slo = self.slo
        return (None if slo.ttft_s is None else slo.ttft_s - got[0],
                None if slo.tpot_s is None else slo.tpot_s - got[1])

    @property
    def attainable(self) -> bool:
        return bool(self.met)

    def meets(self, key: str) -> bool:
        return key in self.met


def decision_slo(state: Mapping[Any, Any]) -> SloVerdict | None:
    """The SLO verdict of a decision, when its request stated objectives and a scorer predicted them."""
    got = state.get(SLO_STATE)
    return got if isinstance(got, SloVerdict) else None
