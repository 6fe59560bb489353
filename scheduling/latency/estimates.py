"""The engine-timing fit's estimators (scheduling/latency/fit.py has the model): the decaying weighted
mean of the inter-token time, and the decaying regression sums over the prefill points, whose solution gives the
overhead and the per-token time (the level from every point, the slope from the slope points, both leaning on the
reference's shape).

Pure: the times are the metrics' own timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_WEIGHT = 200.0  # the decaying sums keep about this many points (prefill) / token-weights ×4 (decode)
CLIP = 5.0
HUBER = 0.25  # a prefill point further than this (relative) from the estimate counts for less
PRIOR_SPREAD = 0.5  # window sizes must spread more than ±50% of their mean to outweigh the reference's slope ...
PRIOR_LEVEL = 1.0  # before and beside the prefill points: the reference scaled like the decode, as this many points
SCATTER_REF = 0.05  # ... when the windows scatter 5% (relative) or more off their line; less when they scatter less
MIN_SLOPE_POINTS = 3.0  # the slope stays the reference's until the slope points weigh this much
MIN_ITL_TOKENS = 8.0  # decode timing used once this many tokens were seen


@dataclass(frozen=True, slots=True)
class Timings:
    """An endpoint's timings for one request alone on the engine, in seconds (the scorer's model)."""

    overhead: float
    prefill_per_token: float
    inter_token: float


def decay(dt: float, half_life: float) -> float:
    """What a weight keeps after `dt` seconds: it halves every `half_life` (none lost without a half-life)."""
    return 0.5 ** (max(0.0, dt) / half_life) if half_life > 0 else 1.0


class DecodeEstimate:
    """The inter-token time at load 1: a decaying mean of the intervals' samples weighted by their tokens, a sample
    clipped to `CLIP`× the mean once it rests on enough tokens."""

    __slots__ = ("half_life", "w", "mean", "at")

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self.w = 0.0  # decayed token weight behind the mean
        self.mean = 0.0
        self.at: float | None = None  # when the last sample arrived

    def add(self, sample: float, w: float, now: float) -> None:
        """One interval's mean inter-token time (already divided by the slowdown), weighing `w` tokens."""
        if self.at is not None:
            self.w *= decay(now - self.at, self.half_life)
        if self.w >= 4 * MIN_ITL_TOKENS and self.mean > 0:
            sample = min(self.mean * CLIP, max(self.mean / CLIP, sample))
        total = self.w + w
        self.mean = (self.mean * self.w + sample * w) / total
        self.w = min(total, 4 * MAX_WEIGHT)
        self.at = now

    @property
    def known(self) -> bool:
        """Enough tokens were seen for the mean to be used."""
        return self.w >= MIN_ITL_TOKENS and self.mean > 0


class PrefillEstimate:
    """Decaying weighted regression sums over the prefill points (x̄ uncached tokens per request, ȳ prefill seconds):
    W, Sx, Sy over every level point; V, Tx, Ty, Txx, Txy, Tyy over the slope points."""

    __slots__ = ("half_life", "W", "Sx", "Sy", "V", "Tx", "Ty", "Txx", "Txy", "Tyy", "points", "at")

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self.W = self.Sx = self.Sy = 0.0  # the level: every point
        self.V = self.Tx = self.Ty = self.Txx = self.Txy = self.Tyy = 0.0  # the slope: full windows only
        self.points = 0  # level points ever added
        self.at: float | None = None  # when the sums were last aged

    def level_point(self, x: float, y: float, now: float, weight: float, current: Timings | None) -> None:
        """A level point of relative `weight`, weighted down by its miss of the `current` estimate."""
        self._age(now)
        w = weight * self._huber(x, y, current)
        self.points += 1
        self.W += w
        self.Sx += w * x
        self.Sy += w * y
        if self.W > MAX_WEIGHT:
            self._scale_sums(MAX_WEIGHT / self.W)

    def slope_point(self, x: float, y: float, now: float, current: Timings | None) -> None:
        """A slope point (several consecutive windows together: fewer requests misattributed at the edges)."""
        self._age(now)
        w = self._huber(x, y, current)
        self.V += w
        self.Tx += w * x
        self.Ty += w * y
        self.Txx += w * x * x
        self.Txy += w * x * y
        self.Tyy += w * y * y

    def _age(self, now: float) -> None:
        if self.at is not None:
            self._scale_sums(decay(now - self.at, self.half_life))
        self.at = now

    def _huber(self, x: float, y: float, current: Timings | None) -> float:
        """The weight of a point far from the current estimate (1 near it; none before a few points)."""
        t = current
        if self.W < 3.0 or t is None:
            return 1.0
        pred = t.overhead + x * t.prefill_per_token
        if pred <= 0:
            return 1.0
        miss = abs(min(CLIP, max(1.0 / CLIP, y / pred)) - 1.0)
        return HUBER / miss if miss > HUBER else 1.0

    def _scale_sums(self, f: float) -> None:
        self.W, self.Sx, self.Sy = f * self.W, f * self.Sx, f * self.Sy
        self.V, self.Tx, self.Ty = f * self.V, f * self.Tx, f * self.Ty
        self.Txx, self.Txy, self.Tyy = f * self.Txx, f * self.Txy, f * self.Tyy

    def level_scale(self, ref: Timings) -> float:
        """The level points' mean prefill over the reference's at their mean size (with some points: W > 0)."""
        return (self.Sy / self.W) / (ref.overhead + ref.prefill_per_token * self.Sx / self.W)

    def solve(self, ref: Timings, decode_scale: float | None) -> tuple[float, float] | None:
        """(overhead, per token) from the prefill points: their weighted mean, with the reference scaled by
        `decode_scale` (the fitted inter-token time over the reference's; None before it is known) as
        `PRIOR_LEVEL` more points at the same size, fixes the level; the slope moves from the reference's slope at
        that level towards the slope points' own as far as their spread allows (see fit.py's docstring)."""
        W = self.W
        if W <= 0:
            if decode_scale is None:
                return None
            return ref.overhead * decode_scale, ref.prefill_per_token * decode_scale
        mx, my = self.Sx / W, self.Sy / W
        if decode_scale is not None:
            my = (W * my + PRIOR_LEVEL * decode_scale * (ref.overhead + ref.prefill_per_token * mx)) / (W + PRIOR_LEVEL)
        p0 = my * ref.prefill_per_token / (ref.overhead + ref.prefill_per_token * mx)
        p = p0
        V = self.V
        if V >= MIN_SLOPE_POINTS:
            vx, vy = self.Tx / V, self.Ty / V
            sxx = max(0.0, self.Txx - V * vx * vx)
            sxy = self.Txy - V * vx * vy
            syy = max(0.0, self.Tyy - V * vy * vy)
            # points scattered off their line: sizes misattributed at the windows' edges, which flattens the slope
            scatter = (syy - sxy * sxy / sxx) / V / (vy * vy) if sxx > 0 and vy > 0 else 1.0
            lam = V * (PRIOR_SPREAD * max(vx, 1.0)) ** 2 * min(1.0, max(0.0, scatter) / SCATTER_REF ** 2)
            p = (sxy + lam * p0) / (sxx + lam) if sxx + lam > 0 else p0
        o = my - p * mx
        floor = 1e-9
        if o < 0.0:
            o, p = 0.0, (my / mx if mx > 0 else p0)
        if p < floor:
            p, o = floor, max(0.0, my - floor * mx)
        return o, p
