"""Engine timings fitted online from the engines' own metrics (the estimated-latency scorer's per-endpoint timings).

Every scrape brings an endpoint's cumulative latency histograms and prefix-cache counters (`EngineTotals`); the
difference between two scrapes describes the requests of that interval. `EndpointFit` turns those differences into
three timings of the scorer's model, for one request alone on the engine (load 1):

    prefill(x)  = overhead + x × prefill_per_token        x: the request's uncached prompt tokens
    decode      = inter_token per output token

Measurements are taken under load, so each is divided by the scorer's own slowdown at the engine's mean batch over
the interval (the `running` gauge at both scrapes): slowdown(n) = 1 + (F − 1) × min(n, S − 1) / (S − 1) with n the
other requests running.

- Decode: every interval with new tokens gives mean ITL = Δsum / Δcount (vLLM's inter-token latency, or the older
  time per output token; SGLang's ITL, whose count is per token too); divided by the slowdown, it is one sample of
  `inter_token`, weighted by its token count (at most 64), kept as a decaying weighted mean.
- Prefill: intervals are pooled until at least `MIN_REQUESTS` requests got their first token (`FIRST_REQUESTS` for
  the first two points; or `MAX_POOL_S` passed with at least one), then give one point (x̄, ȳ) about the requests
  whose first token came in that window. ȳ = their mean prefill time / slowdown: mean TTFT − mean queue time while
  no request waited in the engine's queue (no queue time to take out); when some did, vLLM's prefill histogram
  (queue excluded), which counts a request at its end, read over the window shifted by the mean decode time (its
  decode histogram); an engine without it (SGLang) gives no point for such a window (the queue histogram, observed
  at another moment, cannot take the queue out reliably). x̄ =
  the uncached prompt tokens per request of the same requests, from the prefix-cache counters. Those counters tick at
  another moment of a request's life than its first token (vLLM: at admission, one prefill earlier; SGLang: at its
  end, one decode later), so they are read from a short ring of past scrapes, interpolated at the pool's window
  shifted by that lag (a window's own mean prefill; the mean decode time of the finished requests): counting other
  requests than the TTFTs' would blur x̄ and flatten the fitted slope. The points' weighted mean fixes the level
  (ȳ at x̄); a point of fewer than `MIN_REQUESTS` requests weighs in proportion. Slope points are `SLOPE_GROUP`
  consecutive full windows taken together (as many edges for three times the requests: fewer misattributed). The
  slope starts from (and, until the slope points weigh `MIN_SLOPE_POINTS`, stays at) the reference's slope at
  that level, p₀ = ȳ × per_token_ref / (overhead_ref + per_token_ref × x̄), and moves towards the windows' own
  regression slope by var(x̄) / (var(x̄) + (`PRIOR_SPREAD` × x̄)² × min(1, (scatter / `SCATTER_REF`)²)), scatter being
  the windows' relative spread off their line. A window pools many requests, so its x̄ varies only as much as the
  traffic's mix does over time, and the requests a window's edges misattribute blur x̄ (which flattens a regression
  slope) and scatter the points: the slope is trusted when window sizes spread widely (short prompts for a while,
  then long ones) and the windows lie on a line; otherwise the split of the level between overhead and per-token
  time stays near the reference's.

Before the first prefill point, and beside the first few, the prefill level is the reference's scaled as the decode
is (fitted inter-token / reference inter-token): an engine's decode speed is known within a few scrapes of its first
tokens, long before enough requests have had a first token to measure the prefill, and an engine twice as fast at
decoding is the best first guess of one twice as fast at prefill. It counts as `PRIOR_LEVEL` points.

Robust: once the estimate rests on a few points, a new point is clipped to `CLIP`× the estimate and weighted down
by how far it lies from it (Huber: weight HUBER / relative miss beyond HUBER); counters that go back (an engine
restart) start the differences over and keep the estimates. Bounded: a few floats and two short rings per endpoint,
whatever the traffic. Decaying: every weight halves each `half_life` seconds, and the total weight is capped, so an
engine that changes speed is relearnt within about a half-life.

Pure and deterministic: time comes from the metrics' own timestamps. Here: the pooling of windows and their points;
the differences between two scrapes and the ring of past scrapes' counters are in scrapes.py; the decode mean,
the prefill points' regression sums and their solution (and `CLIP`, `HUBER`, `PRIOR_*` ...) in estimates.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from scheduling.latency.estimates import DecodeEstimate, PrefillEstimate, Timings
from scheduling.latency.scrapes import CounterRing, delta, quantile, went_back
from scheduling.types import EngineTotals

__all__ = ["EndpointFit", "FitView", "Timings", "quantile"]

MIN_REQUESTS = 16  # requests per prefill point (longer windows: fewer requests misattributed at their edges)
FIRST_REQUESTS = 4  # for the first points: a quick first scale, which later points outweigh
MAX_POOL_S = 4.0  # or this long with at least one request
ITL_WEIGHT_CAP = 64.0  # tokens one interval counts for at most
SLOPE_GROUP = 3  # consecutive full windows per slope point
HALF_LIFE_S = 60.0
WINDOWS = 16  # pooled windows waiting for their counters (SGLang's tick after the requests end)


Window = tuple[float, float, float, float, float, bool]


@dataclass(frozen=True, slots=True)
class FitView:
    """What explain and `epp endpoints` show of one endpoint's fit."""

    timings: Timings | None  # None until something was fitted
    prefill_points: float  # decayed weight of the prefill points (0: overhead and per-token are the reference's)
    decode_tokens: float  # decayed token weight behind inter_token
    updated_at: float | None  # when a new point last arrived
    ttft_mean: float | None  # the last interval with first tokens: mean and p90 of TTFT (engine-reported)
    ttft_p90: float | None


class EndpointFit:
    """One endpoint's fit (see the module docstring)."""

    __slots__ = ("ref", "slowdown", "half_life", "prev", "prev_running", "prev_at", "p_n", "p_sum", "p_load", "p_queued",
                 "p_dt", "p_since", "ring", "windows", "prefill", "group", "inter_token", "itl_raw", "timings",
                 "updated_at", "ttft_mean", "ttft_p90")

    def __init__(self, reference: Timings, slowdown: Callable[[float], float], half_life: float = HALF_LIFE_S
                 ) -> None:
        self.ref = reference
        self.slowdown = slowdown
        self.half_life = half_life
        self.prev: EngineTotals | None = None
        self.prev_running = 0.0
        self.prev_at = 0.0
        # the TTFT window being pooled: first tokens, their prefill seconds, ∫ running dt, seconds, start
        self.p_n = self.p_sum = self.p_load = self.p_dt = 0.0
        self.p_since: float | None = None
        self.p_queued = False  # requests waited in the engine's queue during the window
        self.ring = CounterRing()  # past scrapes' counters, to read them when they count a window's requests
        # pooled windows waiting for their counters: (start, end, first tokens, TTFT − queue seconds, mean running,
        # whether requests waited in the engine's queue meanwhile)
        self.windows: deque[Window] = deque(maxlen=WINDOWS)
        self.prefill = PrefillEstimate(half_life)  # decaying regression sums over the prefill points
        self.group: list[Window] = []  # consecutive full windows, for the slope
        self.inter_token = DecodeEstimate(half_life)
        self.itl_raw: float | None = None  # the last interval's mean ITL as measured (under load)
        self.timings: Timings | None = None
        self.updated_at: float | None = None
        self.ttft_mean: float | None = None
        self.ttft_p90: float | None = None

    # ---- input --------------------------------------------------------------------------------------------
    def observe(self, totals: EngineTotals, running: float, now: float, waiting: float = 0.0) -> bool:
        """One scrape's totals and running and waiting gauges at `now`. True when the timings changed."""
        prev = self.prev
        self.prev = totals
        prev_running, prev_at = self.prev_running, self.prev_at
        self.prev_running, self.prev_at = running, now
        if prev is not None and went_back(totals, prev):
            self.ring.clear()  # an engine restart: the counters start over, the timings stay
            self.windows.clear()
            self.p_n = self.p_sum = self.p_load = self.p_dt = 0.0
            self.p_since = None
            prev = None
        self.ring.remember(totals, now)
        if prev is None or now <= prev_at:
            return False
        load = 0.5 * (running + prev_running)  # the batch over the interval
        changed = self._decode(totals, prev, load, now)
        self._ttft(totals, prev)
        self._pool(totals, prev, load, now - prev_at, now, waiting > 0)
        return self._resolve(totals, now) or changed

    def _decode(self, new: EngineTotals, old: EngineTotals, load: float, now: float) -> bool:
        d = delta(new.itl, old.itl)
        if d is None or d[1] <= 0 or d[0] < 0:
            return False
        self.itl_raw = d[0] / d[1]
        sample = self.itl_raw / self.slowdown(max(0.0, load - 1.0))
        self.inter_token.add(sample, min(d[1], ITL_WEIGHT_CAP), now)
        self.updated_at = now
        self._refresh()
        return True

    def _ttft(self, new: EngineTotals, old: EngineTotals) -> None:
        d = delta(new.ttft, old.ttft)
        if d is None or d[1] <= 0:
            return
        self.ttft_mean = d[0] / d[1]
        self.ttft_p90 = quantile(new.ttft_buckets, old.ttft_buckets, 0.9)

    def _pool(self, new: EngineTotals, old: EngineTotals, load: float, dt: float, now: float, queued: bool) -> None:
        """Add the interval's first tokens to the window being pooled; close it when it has enough."""
        ttft, queue = delta(new.ttft, old.ttft), delta(new.queue, old.queue)
        if ttft is None:
            return
        if self.p_since is None:
            self.p_since = now - dt
        self.p_load += load * dt
        self.p_dt += dt
        self.p_queued = self.p_queued or queued
        if ttft[1] > 0 and ttft[0] >= 0:
            pre = ttft[0]
            if queue is not None and queue[1] > 0:
                pre = max(0.0, pre - ttft[1] * queue[0] / queue[1])
            self.p_n += ttft[1]
            self.p_sum += pre
        least = MIN_REQUESTS if self.prefill.points >= 2 else FIRST_REQUESTS
        if self.p_n < least and not (self.p_n >= 1 and now - self.p_since >= MAX_POOL_S):
            if self.p_n == 0 and now - self.p_since >= MAX_POOL_S:
                self.p_since, self.p_load, self.p_dt = None, 0.0, 0.0  # an idle stretch: start afresh
                self.p_queued = False
            return
        mean_load = self.p_load / self.p_dt if self.p_dt > 0 else load
        self.windows.append((self.p_since, now, self.p_n, self.p_sum, mean_load, self.p_queued))
        self.p_n = self.p_sum = self.p_load = self.p_dt = 0.0
        self.p_since = None
        self.p_queued = False

    def _resolve(self, totals: EngineTotals, now: float) -> bool:
        """Turn pooled windows into prefill points once the counters of their requests are in the ring: each full
        window is a level point; `SLOPE_GROUP` consecutive full windows together are a slope point."""
        changed = False
        while self.windows:
            window = self.windows[0]
            got = self._measure(window, totals, now)
            if got is None:
                break  # its requests have not all been counted yet
            self.windows.popleft()
            if not got:
                self.group.clear()
                continue  # no counters for it, or its TTFTs hold queue time that cannot be taken out
            x, y = got
            n = window[2]
            # a window of few requests misattributes more of them at its edges: it counts for less
            self._point(x, y, now, min(1.0, n / MIN_REQUESTS))
            changed = True
            if n < MIN_REQUESTS or (self.group and self.group[-1][1] != window[0]):
                self.group.clear()
                if n < MIN_REQUESTS:
                    continue
            self.group.append(window)
            if len(self.group) >= SLOPE_GROUP:
                g = self.group
                total = sum(w[2] for w in g)
                union = (g[0][0], g[-1][1], total, sum(w[3] for w in g), sum(w[4] * w[2] for w in g) / total,
                         any(w[5] for w in g))
                self.group = []
                both = self._measure(union, totals, now)
                if both:
                    self._slope_point(*both, now)
        return changed

    def _measure(self, window: Window, totals: EngineTotals, now: float) -> tuple[float, float] | tuple[()] | None:
        """(x̄, ȳ) of a pooled window; () when it gives none; None when its requests are not all counted yet.

        ȳ: TTFT − queue time for a window without queueing; else, with vLLM's prefill histogram (queue excluded,
        observed at the requests' end), its mean over the window shifted by the mean decode time, which counts the
        same requests. x̄: the uncached prompt tokens over the window shifted to when the counters count its
        requests (see the module docstring)."""
        start, end, n, seconds, load, queued = window
        if not queued:
            prefill = seconds / n
        elif totals.prefill is not None:
            decode = self.ring.decode_time()
            if decode is None:
                return ()
            if end + decode > now:
                return None
            a, b = self.ring.at(start + decode), self.ring.at(end + decode)
            if a is None or b is None or b[4] - a[4] <= 0:
                return ()
            prefill = (b[3] - a[3]) / (b[4] - a[4])
        else:
            return ()
        if totals.counted_at == "end":  # counted when the requests end: one decode after their first token
            a, b = self.ring.at(start), self.ring.at(end)
            lag = 0.0
            if a is not None and b is not None and b[1] > a[1] and self.itl_raw is not None:
                lag = (b[2] - a[2]) / (b[1] - a[1]) * self.itl_raw
        else:  # counted at admission: one prefill before the first token
            lag = -prefill
        if end + lag > now:
            return None
        a, b = self.ring.at(start + lag), self.ring.at(end + lag)
        if a is None or b is None:
            return ()
        requests = (b[1] - a[1]) if totals.counted_at == "end" else n
        if requests <= 0:
            return ()
        return max(0.0, b[0] - a[0]) / requests, prefill / self.slowdown(max(0.0, load - 1.0))

    def _point(self, x: float, y: float, now: float, weight: float = 1.0) -> None:
        """A level point."""
        self.prefill.level_point(x, y, now, weight, self.timings)
        self.updated_at = now
        self._refresh()

    def _slope_point(self, x: float, y: float, now: float) -> None:
        """A slope point (several consecutive windows together: fewer requests misattributed at the edges)."""
        self.prefill.slope_point(x, y, now, self.timings)
        self._refresh()

    # ---- the estimate ---------------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """The timings, once the decode or a prefill point is known: the fitted overhead and per-token time (before
        prefill points, the reference's scaled like the decode), the fitted inter-token time (before enough tokens,
        the reference's scaled like the prefill)."""
        ref = self.ref
        decode_scale = self.inter_token.mean / ref.inter_token if self.has_decode and ref.inter_token > 0 else None
        prefill = self.prefill.solve(ref, decode_scale)
        if prefill is None:
            return
        o, p = prefill
        if self.has_decode:
            itl = self.inter_token.mean
        else:
            itl = ref.inter_token * self.prefill.level_scale(ref)
        self.timings = Timings(o, p, itl)

    @property
    def W(self) -> float:
        """The level points' decayed weight (the regression sums' W)."""
        return self.prefill.W

    @property
    def has_prefill(self) -> bool:
        return self.prefill.W > 0

    @property
    def has_decode(self) -> bool:
        return self.inter_token.known

    def view(self) -> FitView:
        return FitView(self.timings, self.prefill.W, self.inter_token.w, self.updated_at, self.ttft_mean, self.ttft_p90)
