"""Class-aware dispatch: a loose request waits while the endpoint it would take is busy, so tight ones go first.

Engines serve first come, first served, and slow down with every request they run: a tight request that reaches an
endpoint right behind loose ones shares their prefill or waits for them, and its prefill runs at the slowdown of
the batch they fill. A request placed as `loose` (classes.py) has slack: it may start later than a tight one and
still meet its objective. So while its pick is busy it is held back in Pointsman instead of sent:

    busy(e)     e has tight work pending (a tight request sent there has not had its first token yet: until it is
                seen, its stream ends, or its predicted TTFT has passed, whichever comes first), or at least
                `hold_inflight` requests in flight (sloHoldShare × maxNumSeqs; 0: tight work only)
    slack       = its TTFT objective × headroom − its predicted TTFT on the pick
    budget      = sloHoldSlack (0.5) × slack: how long it may wait, keeping the rest for the prediction's error
    held        while the pick is busy, at most `budget` seconds
    released    when the pick is no longer busy (its tight work started, a request there ended), or at the
                deadline (held since + budget), whichever comes first, oldest first; it is then scheduled afresh
                (the pool as it is then) and sent, never held twice

Requests without objectives, tight requests and loose ones whose pick is not busy go at once, as before: a tight
request always finds the room the held loose ones left. `TightWork` keeps the tight work per endpoint,
`hold_budget` and `busy` are the decision. Pure: no I/O, time passed in.
"""

from __future__ import annotations

from scheduling.latency.classes import LOOSE, TIGHT
from scheduling.latency.slo import SloVerdict


def hold_budget(verdict: SloVerdict | None, key: str) -> float:
    """How long a request with this verdict, picked onto `key`, may be held (seconds): 0 for a request without
    objectives or placed as tight, when holding is off, or when its predicted TTFT leaves it no slack."""
    if verdict is None or verdict.klass != LOOSE or verdict.hold <= 0.0 or verdict.slo.ttft_s is None:
        return 0.0
    got = verdict.predicted.get(key)
    if got is None:
        return 0.0
    return max(0.0, verdict.hold_slack * (verdict.slo.ttft_s * verdict.hold - got[0]))


def busy(verdict: SloVerdict, tight_pending: bool, inflight: int) -> bool:
    """Whether a loose request with this verdict waits for its pick: tight work pending there, or at least
    `hold_inflight` requests in flight (when > 0)."""
    return tight_pending or 0 < verdict.hold_inflight <= inflight


def is_tight(verdict: SloVerdict | None) -> bool:
    """A request whose first token loose requests wait for: it stated objectives and was placed as tight."""
    return verdict is not None and verdict.klass == TIGHT


class TightWork:
    """Per endpoint: the tight requests sent there that have not started yet, each until its first token is seen,
    its stream ends, or its predicted TTFT has passed (without the response's body the first token is never seen).
    Exact: an endpoint with none is not kept."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: dict[str, dict[int, float]] = {}  # endpoint -> request -> when it is expected to start

    def sent(self, key: str, request: int, until: float) -> None:
        self.pending.setdefault(key, {})[request] = until

    def started(self, key: str, request: int) -> None:
        """A tight request sent to `key` had its first token, or ended."""
        got = self.pending.get(key)
        if got is not None and got.pop(request, None) is not None and not got:
            del self.pending[key]

    def busy(self, key: str, now: float) -> bool:
        """Whether `key` has tight work pending at `now` (the ones whose predicted TTFT has passed are dropped)."""
        got = self.pending.get(key)
        if not got:
            return False
        for request in [r for r, until in got.items() if until <= now]:
            del got[request]
        if not got:
            del self.pending[key]
            return False
        return True

    def until(self, key: str) -> float | None:
        """When the last tight request pending on `key` is expected to start (None: none pending)."""
        got = self.pending.get(key)
        return max(got.values()) if got else None
