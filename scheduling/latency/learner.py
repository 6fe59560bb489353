"""What the latency model learns from finished requests, per endpoint, and shares with peers.

    D(e)  ← EWMA of the request durations on e (duration_alpha)                     the wait for a slot
    k(e)  ← EWMA of the calibration samples (calibration_alpha)                     on the reference timings
    sample = (observed duration − wait(e) at the pick) / ((overhead + (backlog + uncached) × prefill per token
              + outputTokens × inter-token) × slowdown(e))                          clamped to `CALIBRATION_RANGE`
    an endpoint without samples uses the pool-wide k

On fitted engine timings (the `EngineTimingTable`, table.py) a finished request teaches the weight β(e) of the
backlog instead (see the table's docstring), and only when the backlog was at least `MIN_BACKLOG_SHARE` of its
modelled time. The sample is taken against what the decision saw (`Chosen`: the pick's modelled prefill, D(e),
inter-token time and backlog time, before its own prefill joined the backlog; n(e) from the scoring pass), not
what the endpoint looks like when the request ends.

Replication: every finished request is a record [endpoint, seconds, sample or −1] for the peers, which learn from
it as from their own (so N replicas calibrate as fast as one); a peer that joins gets a snapshot [endpoint, D(e),
k(e) or −1, 1] that fills in only what it has not learnt itself.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from scheduling.framework.replication import Record, drain
from scheduling.latency.config import ModelConfig
from scheduling.latency.table import BACKLOG_WEIGHT_RANGE, EngineTimingTable

CALIBRATION_RANGE = (0.02, 50.0)
MIN_BACKLOG_SHARE = 0.1  # a finished request teaches the backlog's weight when it was this much of its model
MAX_OUTBOX = 4096  # finished requests kept for the bus between two exports
REFERENCE, POOL, ENGINE = "reference", "pool", "engine"


class Chosen(NamedTuple):
    """What calibration needs of a pick, as the decision saw it."""

    prefill: float  # modelled prefill seconds on the base timings (with the backlog on the reference timings)
    duration: float  # D(e) at the pick
    inter_token: float
    queued: float | None  # fitted timings: the backlog's modelled seconds apart; None on the reference timings


class Learner:
    """D(e), k(e) and the pool-wide k, and the fitted timings' table they combine with (`timings_of`)."""

    __slots__ = ("config", "table", "durations", "scales", "pool_scale", "outbox", "version", "durations_version")

    def __init__(self, config: ModelConfig, table: EngineTimingTable) -> None:
        self.config = config
        self.table = table
        self.durations: dict[str, float] = {}  # endpoint -> D(e)
        self.scales: dict[str, float] = {}  # endpoint -> k(e)
        self.pool_scale = 1.0  # the prior of an endpoint without samples
        self.outbox: deque[Record] | None = None  # finished requests for the peers, while replicating
        self.version = 0  # moves whenever a k(e) or the pool-wide k changes (the scoring pass's plans read it)
        self.durations_version = 0  # moves whenever a D(e) changes (likewise)

    def scale(self, key: str) -> float:
        """k(e): how much slower (> 1) or faster (< 1) than the reference engine this endpoint has proved."""
        return self.scales.get(key, self.pool_scale)

    def duration(self, key: str) -> float:
        return self.durations.get(key, self.config.initial_request_seconds)

    def timings_of(self, key: str) -> tuple[float, float, float, float, str, float]:
        """(overhead, prefill per token, inter-token, backlog weight, source, k) for `key`: its fitted timings,
        else the fitted endpoints' mean (an endpoint without its own k), else the reference × k(e)."""
        t = self.table.eff.get(key)
        if t is not None:
            return (*t, ENGINE, 1.0)
        pool = self.table.pool
        if pool is not None and key not in self.scales:
            return (*pool, POOL, 1.0)
        ref = self.config.reference
        k = self.scale(key)
        return k * ref.overhead, k * ref.prefill_per_token, k * ref.inter_token, 1.0, REFERENCE, k

    def drain_rate(self, key: str) -> float:
        """Prefill tokens per second endpoint `key` works off."""
        return 1.0 / self.timings_of(key)[1]

    # ---- finished requests ---------------------------------------------------------------------------------
    def sample(self, chosen: Chosen, n: int, seconds: float, out_tokens: int) -> float | None:
        """(observed − wait) / model for a request that ran `seconds` on an endpoint where the scoring pass saw
        n(e) = `n` (see the module docstring); None when it teaches nothing."""
        c = self.config
        s1 = c.max_num_seqs - 1
        full_decode = chosen.inter_token * out_tokens
        slow = c.slowdown(n)
        model = (chosen.prefill + full_decode) * slow
        wait = (n - s1) * chosen.duration / c.max_num_seqs if n > s1 else 0.0
        queued = chosen.queued
        if queued is not None:  # fitted timings: the weight of the backlog (EngineTimingTable)
            backlog = queued * slow
            if backlog <= 0.0 or backlog < MIN_BACKLOG_SHARE * model:
                return None  # too little backlog to tell its weight (none at all: an engine fitted at zero cost)
            lo, hi = BACKLOG_WEIGHT_RANGE
            return min(hi, max(lo, (seconds - wait - model) / backlog))
        if model <= 0.0:
            return None
        lo, hi = CALIBRATION_RANGE
        return min(hi, max(lo, (seconds - wait) / model))

    def learn(self, key: str, seconds: float, sample: float | None, on_fit: bool | None = None) -> None:
        """One finished request on `key` (here or at a peer): its duration, and its calibration sample, taken on
        the fitted timings (`on_fit`; None: whatever is known of `key` now) or on the reference's."""
        a = self.config.duration_alpha
        prev = self.durations.get(key)
        self.durations[key] = seconds if prev is None else (1 - a) * prev + a * seconds
        self.durations_version += 1
        if sample is None:
            return
        if on_fit is None:
            on_fit = self.table.fitted(key) is not None
        if on_fit:
            self.table.learn(key, sample)
            return
        a = self.config.calibration_alpha
        self.scales[key] = (1 - a) * self.scales.get(key, self.pool_scale) + a * sample
        self.pool_scale = (1 - a) * self.pool_scale + a * sample
        self.version += 1

    def finished(self, key: str, seconds: float, sample: float | None, on_fit: bool) -> None:
        """A request of this process finished: learn from it, and keep its record for the peers."""
        self.learn(key, seconds, sample, on_fit)
        if self.outbox is not None:
            self.outbox.append([key, seconds, -1.0 if sample is None else sample])

    # ---- replication ---------------------------------------------------------------------------------------
    def set_replicating(self, on: bool) -> None:
        self.outbox = deque(maxlen=MAX_OUTBOX) if on else None

    def export(self) -> list[Record]:
        """[endpoint, seconds, calibration sample or −1] per request that finished here since the last call."""
        return drain(self.outbox)

    def snapshot(self) -> list[Record]:
        """What was learnt so far, for a peer that joins: [endpoint, D(e), k(e) or −1, 1]."""
        return [[key, d, self.scales.get(key, -1.0), 1] for key, d in self.durations.items()]

    def apply(self, records: Sequence[Record]) -> int:
        """A peer's records (finished requests, or its snapshot); returns how many were malformed."""
        bad = 0
        hi = CALIBRATION_RANGE[1]
        for rec in records:
            if not (3 <= len(rec) <= 4 and all(finite(v) for v in rec[1:]) and 0.0 <= rec[1] < 1e6
                    and (rec[2] == -1.0 or 0.0 <= rec[2] <= hi)):
                bad += 1
                continue
            key, seconds, sample = rec[0], float(rec[1]), None if rec[2] == -1.0 else float(rec[2])
            if len(rec) == 3:
                self.learn(key, seconds, sample)
            elif key not in self.durations:
                self.durations[key] = seconds
                self.durations_version += 1
                if sample is not None and key not in self.scales:
                    self.scales[key] = sample
                    self.version += 1
        return bad

    def forget(self, key: str) -> None:
        if self.durations.pop(key, None) is not None:
            self.durations_version += 1
        if self.scales.pop(key, None) is not None:
            self.version += 1

    def keys(self) -> set[str]:
        return self.durations.keys() | self.scales.keys()


def finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
