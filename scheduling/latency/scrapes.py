"""The engine-timing fit's inputs (scheduling/latency/fit.py): what two scrapes' cumulative histograms
and counters say about the interval between them, and a short ring of past scrapes' counters, read at another moment
than a scrape's (a request's counters tick at another moment of its life than its first token).

Pure: the times are the metrics' own timestamps.
"""

from __future__ import annotations

import math
from collections import deque

from scheduling.types import EngineTotals, Totals

RING = 256  # scrapes of counters kept to align them with the first tokens (~13 s at 50 ms)


def delta(new: Totals | None, old: Totals | None) -> tuple[float, float] | None:
    """A histogram's (Δsum, Δcount) between two scrapes; None when either did not export it."""
    if new is None or old is None:
        return None
    return new[0] - old[0], new[1] - old[1]


def went_back(new: EngineTotals, old: EngineTotals) -> bool:
    """A count went down since the last scrape: the engine restarted and its counters started over."""
    for a, b in ((new.ttft, old.ttft), (new.itl, old.itl), (new.prefill, old.prefill), (new.queue, old.queue)):
        if a is not None and b is not None and a[1] < b[1]:
            return True
    for x, y in ((new.prompt_tokens, old.prompt_tokens), (new.cached_tokens, old.cached_tokens),
                 (new.requests, old.requests)):
        if x is not None and y is not None and x < y:
            return True
    return False


def quantile(new: tuple[tuple[float, float], ...], old: tuple[tuple[float, float], ...], q: float
             ) -> float | None:
    """The q-quantile of the observations between two cumulative bucket readings (linear within a bucket)."""
    if not new:
        return None
    before = dict(old)
    counts = [(le, c - before.get(le, 0.0)) for le, c in new]
    total = counts[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lo = 0.0
    prev = 0.0
    for le, c in counts:
        if c >= rank:
            if math.isinf(le):
                return lo
            span = c - prev
            return lo + (le - lo) * ((rank - prev) / span if span > 0 else 1.0)
        lo, prev = le, c
    return lo


class CounterRing:
    """The last `RING` scrapes' cumulative counters, each `(time, uncached prompt tokens, requests, generated
    tokens, prefill seconds, prefill count, decode seconds, decode count)`, read interpolated at any moment they
    cover."""

    __slots__ = ("ring",)

    def __init__(self) -> None:
        self.ring: deque[tuple[float, ...]] = deque(maxlen=RING)

    def clear(self) -> None:
        self.ring.clear()

    def remember(self, t: EngineTotals, now: float) -> None:
        """One scrape's counters at `now` (none without prompt-token counters; none out of time order)."""
        if t.prompt_tokens is None:
            return
        ring = self.ring
        if ring and ring[-1][0] >= now:
            return
        pre = t.prefill or (0.0, 0.0)
        dec = t.decode or (0.0, 0.0)
        ring.append((now, t.prompt_tokens - (t.cached_tokens or 0.0), t.requests or 0.0, t.generation_tokens or 0.0,
                     pre[0], pre[1], dec[0], dec[1]))

    def at(self, when: float) -> tuple[float, ...] | None:
        """The cumulative counters (uncached tokens, requests, generated tokens, prefill seconds and count, decode
        seconds and count) interpolated at `when`, if the ring covers it."""
        ring = self.ring
        if not ring or when < ring[0][0] or when > ring[-1][0]:
            return None
        hi = len(ring) - 1
        while hi > 0 and ring[hi - 1][0] >= when:
            hi -= 1
        b = ring[hi]
        if hi == 0 or b[0] == when:
            return b[1:]
        a = ring[hi - 1]
        f = (when - a[0]) / (b[0] - a[0])
        return tuple(x + f * (y - x) for x, y in zip(a[1:], b[1:], strict=True))

    def decode_time(self) -> float | None:
        """The mean time from first to last token of the requests that ended over the ring (vLLM's decode
        histogram): how long after its first token a request's end-of-request histograms count it."""
        ring = self.ring
        if len(ring) < 2:
            return None
        a, b = ring[0], ring[-1]
        n = b[7] - a[7]
        return (b[6] - a[6]) / n if n > 0 else None
