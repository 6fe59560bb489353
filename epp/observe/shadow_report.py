"""The shadow profile's report (epp/observe/shadow.py): counters on the loop, a JSON view, a Prometheus collector."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from epp.observe.shadow import Shadow

MAX_PAIRS = 400  # (live, shadow) endpoint pairs kept for the move view


class EndpointCounts:
    __slots__ = ("live", "shadow")

    def __init__(self) -> None:
        self.live = 0
        self.shadow = 0


class ShadowReport:
    """What the shadow found since `since` (wall time); plain counters updated on the loop."""

    def __init__(self, source: str = "") -> None:
        self.source = source
        self.since = time.time()
        self.agree = 0
        self.disagree = 0
        self.errors: dict[str, int] = {}  # the shadow could not pick: by error code
        self.skipped: dict[str, int] = {}  # not shadowed: rate | cpu | backlog | route
        self.cpu_seconds = 0.0
        self.endpoints: dict[str, EndpointCounts] = {}
        self.moves: dict[tuple[str, str], int] = {}  # (live pick, shadow pick) -> disagreements
        # Disagreements whose request ended with a prediction for both picks:
        self.timed = 0
        self.predicted_shadow = 0.0  # seconds the shadow's model predicted for its own pick, summed
        self.timed_live = 0  # ... of which the model also estimated the live pick
        self.predicted_live = 0.0  # ... for the live pick
        self.realised_live = 0.0  # seconds the live pick took, summed
        self.realised_all = 0.0  # every shadowed request that ended (agreements too): seconds, and how many
        self.ended = 0

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def _counts(self, key: str) -> EndpointCounts:
        c = self.endpoints.get(key)
        if c is None:
            c = self.endpoints[key] = EndpointCounts()
        return c

    def decided(self, live: str, shadow: str) -> None:
        self._counts(live).live += 1
        self._counts(shadow).shadow += 1
        if live == shadow:
            self.agree += 1
            return
        self.disagree += 1
        pair = (live, shadow)
        if pair in self.moves or len(self.moves) < MAX_PAIRS:
            self.moves[pair] = self.moves.get(pair, 0) + 1

    @property
    def shadowed(self) -> int:
        return self.agree + self.disagree

    def view(self) -> dict[str, Any]:
        """The report as JSON for the dashboard (and the docs' worked example)."""
        n = self.shadowed
        rows = []
        for key in sorted(self.endpoints):
            c = self.endpoints[key]
            rows.append({"endpoint": key, "live": c.live, "shadow": c.shadow, "delta": c.shadow - c.live,
                         "live_share": c.live / n if n else 0.0, "shadow_share": c.shadow / n if n else 0.0})
        moves = [{"from": a, "to": b, "count": k}
                 for (a, b), k in sorted(self.moves.items(), key=lambda kv: -kv[1])]
        t = self.timed
        return {
            "source": self.source, "since": self.since, "shadowed": n, "agree": self.agree,
            "disagree": self.disagree, "agreement": self.agree / n if n else None,
            "errors": dict(self.errors), "skipped": dict(self.skipped), "cpu_seconds": self.cpu_seconds,
            "disagreements_timed": t,
            "predicted_shadow_ms": self.predicted_shadow / t * 1e3 if t else None,
            "predicted_live_ms": self.predicted_live / self.timed_live * 1e3 if self.timed_live else None,
            "realised_live_ms": self.realised_live / t * 1e3 if t else None,
            "realised_all_ms": self.realised_all / self.ended * 1e3 if self.ended else None,
            "endpoints": rows, "moves": moves[:50],
        }


def shadow_collector(shadow: Shadow) -> Collector:
    """A prometheus collector of the report, read at scrape time (nothing on the request path)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    class _Collector(Collector):
        def collect(self) -> Iterator[Any]:
            r = shadow.report
            dec = CounterMetricFamily("pointsman_shadow_decisions", "Requests the shadow profile decided, by "
                                      "result: agree | disagree with the live pick, error.", labels=["result"])
            dec.add_metric(["agree"], r.agree)
            dec.add_metric(["disagree"], r.disagree)
            dec.add_metric(["error"], sum(r.errors.values()))
            yield dec
            skip = CounterMetricFamily("pointsman_shadow_skipped", "Requests not shadowed, by reason: rate | cpu "
                                       "(the budget), backlog, route (a route's own scheduler).", labels=["reason"])
            for reason in ("rate", "cpu", "backlog", "route"):
                skip.add_metric([reason], r.skipped.get(reason, 0))
            yield skip
            agree = GaugeMetricFamily("pointsman_shadow_agreement_ratio",
                                      "Share of shadowed requests where the shadow picked the live endpoint.")
            agree.add_metric([], r.agree / r.shadowed if r.shadowed else 0.0)
            yield agree
            picks = CounterMetricFamily("pointsman_shadow_picks", "Picks of shadowed requests per endpoint, by the "
                                        "live and the shadow scheduler.", labels=["endpoint", "scheduler"])
            for key, c in sorted(r.endpoints.items()):
                picks.add_metric([key, "live"], c.live)
                picks.add_metric([key, "shadow"], c.shadow)
            yield picks
            lat = CounterMetricFamily("pointsman_shadow_disagreement_seconds", "Over disagreements that ended: "
                                      "seconds predicted for the shadow's pick and the live pick, and realised by "
                                      "the live pick, summed.", labels=["what"])
            lat.add_metric(["predicted_shadow_pick"], r.predicted_shadow)
            lat.add_metric(["predicted_live_pick"], r.predicted_live)
            lat.add_metric(["realised_live_pick"], r.realised_live)
            yield lat
            timed = CounterMetricFamily("pointsman_shadow_disagreements_timed",
                                        "Disagreements that ended with predictions for both picks.")
            timed.add_metric([], r.timed)
            yield timed
            cpu = CounterMetricFamily("pointsman_shadow_cpu_seconds", "Seconds spent in shadow decisions.")
            cpu.add_metric([], r.cpu_seconds)
            yield cpu

    return _Collector()
