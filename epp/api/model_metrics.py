"""The latency model's view of each endpoint as Prometheus gauges, computed at scrape time from the current
scheduler's estimated-latency scorer (none when the config has no such scorer):

- pointsman_endpoint_prefix_trust{endpoint, state}            1 for its prefix trust: exact | degraded | approximate
- pointsman_endpoint_prefix_belief{endpoint}                  the share of a predicted prefix hit scoring counts
- pointsman_endpoint_outside_share{endpoint}                  the share of its prompt tokens not sent by Pointsman
                                                              (from the engine's prefix-cache counters; when known)
- pointsman_endpoint_prefix_agreement{endpoint}               engine-reported / predicted hits (when measured)
- pointsman_endpoint_timing_seconds{endpoint, timing, source} the timings scoring uses: overhead, prefill_per_token,
                                                              inter_token; source engine | pool | reference
- pointsman_endpoint_timing_age_seconds{endpoint}             since the engine's metrics last brought a measurement
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.api.explain import latency_model
from epp.fleet import Datastore


class ModelCollector(Collector):
    def __init__(self, director: Callable[[], Any], datastore: Datastore) -> None:
        self.director = director
        self.datastore = datastore

    def collect(self) -> Iterator[GaugeMetricFamily]:
        trust = GaugeMetricFamily("pointsman_endpoint_prefix_trust", "1 for the endpoint's prefix trust state.",
                                  labels=["endpoint", "state"])
        belief = GaugeMetricFamily("pointsman_endpoint_prefix_belief",
                                   "The share of a predicted prefix hit the latency model counts.", labels=["endpoint"])
        outside = GaugeMetricFamily("pointsman_endpoint_outside_share",
                                    "The share of the engine's prompt tokens Pointsman did not send.",
                                    labels=["endpoint"])
        agreement = GaugeMetricFamily("pointsman_endpoint_prefix_agreement",
                                      "Engine-reported prefix hits / hits Pointsman predicted for what it sent.",
                                      labels=["endpoint"])
        timing = GaugeMetricFamily("pointsman_endpoint_timing_seconds", "The timings the latency model uses.",
                                   labels=["endpoint", "timing", "source"])
        age = GaugeMetricFamily("pointsman_endpoint_timing_age_seconds",
                                "Seconds since the engine's metrics last brought a timing measurement.",
                                labels=["endpoint"])
        director = self.director()
        scorer = latency_model(director) if director is not None else None
        if scorer is not None:
            now = director.clock()
            for key in sorted(self.datastore.members()):
                m = scorer.endpoint_model(key, now)
                t = m.trust
                trust.add_metric([key, t.state], 1.0)
                belief.add_metric([key], t.belief)
                if t.outside_share is not None:
                    outside.add_metric([key], t.outside_share)
                if t.agreement is not None:
                    agreement.add_metric([key], t.agreement)
                for name, value in (("overhead", m.overhead_s), ("prefill_per_token", m.prefill_per_token_s),
                                    ("inter_token", m.inter_token_s)):
                    timing.add_metric([key, name, m.timings], value)
                if m.fitted_age_s is not None:
                    age.add_metric([key], m.fitted_age_s)
        yield from (trust, belief, outside, agreement, timing, age)
