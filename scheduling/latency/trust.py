"""How much the estimated-latency scorer believes a predicted prefix hit, per endpoint: its prefix trust.

    exact        the endpoint's prefix state comes from its KV events (the precise index is live for it), the stream
                 has had no gap, replay or restart lately, and the hits the engine reports agree with the hits
                 Pointsman predicted for the requests it sent there
    degraded     KV events, but the stream was disrupted within `window` seconds (a publisher restart, lost batches;
                 a gap the replay filled, within a fifth of it), or the engine reports fewer hits than predicted
    approximate  no live KV events: Pointsman's own past picks (the approximate index), or an event stream that is
                 pending or unknown (a failed replay)

Agreement. Every request Pointsman sends adds its prompt tokens (S) and its predicted cached tokens (P) to the
endpoint's decaying sums; every scrape adds the engine's prefix-cache queries (Q) and hits (H) since the previous
one (vLLM `prefix_cache_queries/hits`, SGLang `prompt/cached_tokens`). The engine's hits include those of requests
that bypass Pointsman, so the hits on Pointsman's own requests are at most min(H, S):

    agreement = min(H, S) / P          (measured once S and P are large enough; at most 1)
    outside   = max(0, 1 − S / Q)      (the share of the engine's prompt tokens Pointsman did not send)

An agreement below `agree` means the predictions are hits the engine does not deliver (traffic that bypasses
Pointsman evicting them, an index that drifted); the state says so. The belief b(e) multiplies the predicted cached
tokens when scoring:

    exact: 1;   degraded: min(a, disruption factor);   approximate: a
    a = agreement while traffic bypasses Pointsman (outside ≥ `OUTSIDE_MIN`), else 1: without bypass a shortfall is
        the index's own approximation of the engine's evictions, which the eviction price covers (measured: believing
        every hit less there only spreads prefixes and costs hits)
    disruption factor = 0.5 right after the disruption, back to 1 linearly over `window`

and never goes below `floor`. Everything decays with `half_life`, so a recovered endpoint is believed again. Pure:
time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.types import EngineTotals

EXACT, DEGRADED, APPROXIMATE = "exact", "degraded", "approximate"
STATES = (EXACT, DEGRADED, APPROXIMATE)
MIN_PREDICTED = 2048.0  # predicted cached tokens (decayed) before the agreement is measured
MIN_RATIO = 0.05  # nor while the predicted hits are a negligible share of what was sent
MINOR = 0.2  # a gap the replay filled degrades for this share of the window
OUTSIDE_MIN = 0.1  # the share of an engine's prompt tokens not sent by Pointsman that reveals bypassing traffic


@dataclass(frozen=True, slots=True)
class TrustView:
    state: str
    belief: float
    reason: str
    agreement: float | None  # None: not measured yet
    engine_hit_ratio: float | None
    predicted_hit_ratio: float | None
    outside_share: float | None


class EndpointTrust:
    """The decaying sums behind one endpoint's agreement."""

    __slots__ = ("sent", "predicted", "queries", "hits", "at", "prev")

    def __init__(self) -> None:
        self.sent = self.predicted = self.queries = self.hits = 0.0
        self.at: float | None = None
        self.prev: tuple[float, float] | None = None  # the engine's cumulative (prompt, cached) tokens

    def age(self, now: float, half_life: float) -> None:
        if self.at is not None and now > self.at and half_life > 0:
            f = 0.5 ** ((now - self.at) / half_life)
            self.sent, self.predicted, self.queries, self.hits = (
                f * self.sent, f * self.predicted, f * self.queries, f * self.hits)
        if self.at is None or now > self.at:
            self.at = now

    def agreement(self) -> float | None:
        if self.predicted < MIN_PREDICTED or self.sent <= 0 or self.predicted < MIN_RATIO * self.sent:
            return None
        if self.queries <= 0:
            return None
        return min(1.0, min(self.hits, self.sent) / self.predicted)


class TrustTable:
    """Per endpoint trust; `belief` holds only the endpoints believed less than fully (the scoring pass's lookup)."""

    __slots__ = ("half_life", "window", "agree", "floor", "entries", "belief")

    def __init__(self, half_life: float = 30.0, window: float = 30.0, agree: float = 0.8, floor: float = 0.2) -> None:
        self.half_life = half_life
        self.window = window
        self.agree = agree
        self.floor = floor
        self.entries: dict[str, EndpointTrust] = {}
        self.belief: dict[str, float] = {}

    def entry(self, key: str) -> EndpointTrust:
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = EndpointTrust()
        return e

    def sent(self, key: str, tokens: float, predicted: float, now: float) -> None:
        """Pointsman sent a request of `tokens` prompt tokens to `key`, predicting `predicted` of them cached."""
        e = self.entry(key)
        e.age(now, self.half_life)
        e.sent += tokens
        e.predicted += predicted

    def engine(self, key: str, totals: EngineTotals, now: float) -> None:
        """A scrape of the engine's cumulative prefix-cache counters."""
        if totals.prompt_tokens is None:
            return
        cur = (totals.prompt_tokens, totals.cached_tokens or 0.0)
        e = self.entry(key)
        prev, e.prev = e.prev, cur
        if prev is None or cur[0] < prev[0] or cur[1] < prev[1]:
            return  # the first reading, or the engine restarted: differences start over
        e.age(now, self.half_life)
        e.queries += cur[0] - prev[0]
        e.hits += cur[1] - prev[1]

    def view(self, key: str, now: float, events: bool, disrupted: tuple[float, str, bool] | None) -> TrustView:
        """The trust of `key` now. `events`: its prefix state comes from live KV events; `disrupted`: (when, what,
        minor) of the event stream's last gap, replay or restart (minor: a gap the replay filled, which counts for
        a fifth of the window)."""
        e = self.entries.get(key)
        agreement = e.agreement() if e is not None else None
        eng = e.hits / e.queries if e is not None and e.queries > 0 else None
        pred = e.predicted / e.sent if e is not None and e.sent > 0 else None
        outside = max(0.0, 1.0 - e.sent / e.queries) if e is not None and e.queries > 0 else None
        low = agreement is not None and agreement < self.agree
        # A shortfall counts against the predictions when traffic bypasses Pointsman: then the caches change in
        # ways its own picks do not show. Without bypass it is the index's own approximation of the engine's
        # eviction, which the eviction price already covers (discounting every hit then only spreads prefixes).
        bypass = outside is not None and outside >= OUTSIDE_MIN
        a = max(self.floor, agreement) if agreement is not None and bypass else 1.0
        if not events:
            reason = "no live KV events"
            if low:
                reason += f"; the engine delivers {agreement:.0%} of the predicted hits"
            if bypass:
                reason += f"; {outside:.0%} of its prompt tokens bypass Pointsman"
            return TrustView(APPROXIMATE, a, reason, agreement, eng, pred, outside)
        window = self.window * (MINOR if disrupted is not None and disrupted[2] else 1.0)
        recent = disrupted is not None and now - disrupted[0] < window
        if not recent and not low:
            return TrustView(EXACT, 1.0, "", agreement, eng, pred, outside)
        belief = a
        reasons = []
        if recent and disrupted is not None:
            age = max(0.0, now - disrupted[0])
            belief = min(belief, 0.5 + 0.5 * age / window)
            reasons.append(f"KV events: {disrupted[1]} {age:.0f} s ago")
        if low and agreement is not None:
            reasons.append(f"the engine delivers {agreement:.0%} of the predicted hits")
        if bypass and outside is not None:
            reasons.append(f"{outside:.0%} of its prompt tokens bypass Pointsman")
        return TrustView(DEGRADED, max(self.floor, belief), "; ".join(reasons), agreement, eng, pred, outside)

    def refresh(self, key: str, now: float, events: bool, disrupted: tuple[float, str, bool] | None) -> TrustView:
        v = self.view(key, now, events, disrupted)
        if v.belief < 1.0:
            self.belief[key] = v.belief
        else:
            self.belief.pop(key, None)
        return v

    def forget(self, key: str) -> None:
        self.entries.pop(key, None)
        self.belief.pop(key, None)
