"""The once-a-second sampler: the fleet table and the last 15 minutes of charts.

A task calls `Sampler.sample()` every second (never the request path). It reads the recorder's cumulative
counters and the datastore and appends one point:

- rate:        decisions and rejections per second
- hit:         the picker's prefix hit rate, Σ matched blocks / Σ prompt blocks over the decisions of the second
               (blocks the chosen endpoint was believed to hold, from the prefix index); None when no decision
               ran a prefix-aware plugin
- engine_hit:  Σ cached_tokens / Σ prompt_tokens as the model servers reported them in response usage
- errors:      per second, by inference error code (rejections) and by "HTTP <status>" (upstream 4xx/5xx)
- ttft:        per endpoint, the median time from the decision to the first body chunk of event-stream
               responses that ended during the second (needs the response phases; absent with lean phases)
- queue:       per endpoint, waiting requests as last scraped; inflight: the picker's exact in-flight total

Each endpoint's sparkline holds its last 60 load samples: running + waiting as scraped (the picker's in-flight
count for an endpoint never scraped). With an estimated-latency scorer, each row also has `model`: its prefix trust
(exact / degraded / approximate, the belief and why) and the timings the latency model uses, with their age.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from epp.api.dashboard.recorder import DecisionRecorder
from epp.fleet import Datastore
from scheduling.types import Metrics

WINDOW_SECONDS = 900
SPARK_POINTS = 60


def health(key: str, metrics: Metrics, unhealthy: set[str]) -> str:
    if key in unhealthy:
        return "out"  # taken out of rotation after consecutive scrape failures
    if metrics.updated_at is None:
        return "unscraped"
    return "stale" if metrics.stale else "ok"


class Sampler:
    def __init__(
        self,
        recorder: DecisionRecorder,
        datastore: Datastore,
        clock: Callable[[], float] = time.monotonic,
        *,
        window: int = WINDOW_SECONDS,
        wall: Callable[[], float] = time.time,
        model: Callable[[str, float], dict[str, Any] | None] | None = None,
    ) -> None:
        self.recorder = recorder
        self.model = model  # the latency model's trust and timings per endpoint (None: not shown)
        self.datastore = datastore
        self.clock = clock  # the clock of Metrics.updated_at (the director's)
        self.wall = wall
        self.points: deque[dict[str, Any]] = deque(maxlen=window)
        self.spark: dict[str, deque[float]] = {}
        self.fleet: list[dict[str, Any]] = []
        self.version = 0
        self._prev: tuple[float, int, int, int, int, int, dict[str, int]] | None = None

    def sample(self) -> dict[str, Any]:
        self.fleet = self._fleet()
        point = self._point()
        self.points.append(point)
        self.version += 1
        return point

    # ---- one chart point ---------------------------------------------------------------------------------
    def _point(self) -> dict[str, Any]:
        r = self.recorder
        now = self.clock()
        cur = (now, r.decisions + r.rejections, r.prefix_matched, r.prefix_total, r.engine_prompt_tokens,
               r.engine_cached_tokens, dict(r.errors))
        prev = self._prev or cur
        self._prev = cur
        dt = max(cur[0] - prev[0], 1e-6)
        d_prefix_total = cur[3] - prev[3]
        d_engine_prompt = cur[4] - prev[4]
        errors = {code: (n - prev[6].get(code, 0)) / dt for code, n in cur[6].items() if n != prev[6].get(code, 0)}
        queue: dict[str, int] = {}
        for row in self.fleet:
            queue[row["key"]] = queue.get(row["key"], 0) + row["waiting"]
        return {
            "t": round(self.wall(), 3),
            "rate": (cur[1] - prev[1]) / dt,
            "hit": (cur[2] - prev[2]) / d_prefix_total if d_prefix_total else None,
            "engine_hit": (cur[5] - prev[5]) / d_engine_prompt if d_engine_prompt else None,
            "errors": errors,
            "ttft": {k: statistics.median(v) for k, v in r.take_ttft().items() if v},
            "queue": queue,
            "inflight": sum(load.requests for load in self.datastore.inflight.view().values()),
        }

    # ---- the fleet table ---------------------------------------------------------------------------------
    def _fleet(self) -> list[dict[str, Any]]:
        ds = self.datastore
        now = self.clock()
        unhealthy = ds.unhealthy
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for pool in ds.pool_names():
            snap = ds.snapshot(pool)
            if snap is None:
                continue
            for ep in snap.endpoints:
                m = ep.metrics
                load = ds.inflight.get(ep.key)
                scraped = m.updated_at is not None
                if ep.key not in seen:
                    seen.add(ep.key)
                    spark = self.spark.get(ep.key)
                    if spark is None:
                        spark = self.spark[ep.key] = deque(maxlen=SPARK_POINTS)
                    spark.append(float(m.running + m.waiting) if scraped else float(load.requests))
                rows.append({
                    "pool": pool,
                    "key": ep.key,
                    "name": ep.name,
                    "role": ep.role or "",
                    "models": sorted(ep.models),
                    "waiting": m.waiting,
                    "running": m.running,
                    "kv": m.kv_usage,
                    "inflight": load.requests,
                    "loras": sorted(m.active_loras),
                    "waiting_loras": sorted(m.waiting_loras),
                    "max_lora": m.max_lora,
                    "age": round(now - m.updated_at, 3) if m.updated_at is not None else None,
                    "health": health(ep.key, m, unhealthy),
                    "spark": list(self.spark[ep.key]),
                    "model": self.model(ep.key, now) if self.model is not None else None,
                })
        for gone in set(self.spark) - seen:
            del self.spark[gone]
        return rows

    # ---- the charts, columnar ----------------------------------------------------------------------------
    def series(self) -> dict[str, Any]:
        pts = list(self.points)
        out: dict[str, Any] = {
            "t": [p["t"] for p in pts],
            "rate": [p["rate"] for p in pts],
            "hit": [p["hit"] for p in pts],
            "engine_hit": [p["engine_hit"] for p in pts],
            "inflight": [p["inflight"] for p in pts],
        }
        for field, missing in (("errors", 0.0), ("ttft", None), ("queue", None)):
            keys = sorted({k for p in pts for k in p[field]})
            out[field] = {k: [p[field].get(k, missing) for p in pts] for k in keys}
        return out
