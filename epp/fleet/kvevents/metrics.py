"""Prometheus metrics of the KV-event subscriber (all names start with ``pointsman_kv_events_``).

Counters:
- ``pointsman_kv_events_batches_total{source}``           batches applied; source = live | replay
- ``pointsman_kv_events_events_total{type}``              events applied; type = BlockStored | BlockRemoved |
                                                          AllBlocksCleared | ignored (other groups, tiers, types)
- ``pointsman_kv_events_blocks_total{op}``                engine blocks; op = stored | removed | orphaned
- ``pointsman_kv_events_malformed_total{reason}``         messages dropped; reason = frames | seq | payload |
                                                          tokens (a BlockStored whose tokens do not fit its hashes)
- ``pointsman_kv_events_gaps_total``                      sequence gaps detected
- ``pointsman_kv_events_replays_total{outcome}``          replay requests; outcome = ok | incomplete | timeout |
                                                          unavailable (no replay socket) | error
- ``pointsman_kv_events_restarts_total``                  publishers seen starting afresh (seq 0 or a new stream)
- ``pointsman_kv_events_unknown_total``                   times an endpoint rank was marked unknown
- ``pointsman_kv_events_errors_total``                    unexpected errors while handling a message (logged)

Gauges (computed at scrape time): ``pointsman_kv_events_subscriptions`` (endpoints subscribed),
``pointsman_kv_events_endpoints{state}`` (endpoints in the index by state) and ``pointsman_kv_events_index_keys``
(distinct block keys in the index).

`KVEventMetrics` registers into a given CollectorRegistry (the EPP's, or a private one in tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from scheduling.prefix.precise import LIVE, PENDING, UNKNOWN, PreciseIndex


class _Gauges(Collector):
    def __init__(self, index: PreciseIndex, subscriptions: Callable[[], int]) -> None:
        self.index = index
        self.subscriptions = subscriptions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        subs = GaugeMetricFamily("pointsman_kv_events_subscriptions", "Endpoints whose KV events are subscribed.")
        subs.add_metric([], float(self.subscriptions()))
        states = GaugeMetricFamily("pointsman_kv_events_endpoints", "Endpoints in the precise index by state.",
                                   labels=["state"])
        counts = dict.fromkeys((LIVE, PENDING, UNKNOWN), 0)
        for state in self.index.states().values():
            counts[state] = counts.get(state, 0) + 1
        for state, n in counts.items():
            states.add_metric([state], float(n))
        keys = GaugeMetricFamily("pointsman_kv_events_index_keys", "Distinct block keys in the precise index.")
        keys.add_metric([], float(len(self.index)))
        yield from (subs, states, keys)


class KVEventMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.batches = Counter("pointsman_kv_events_batches_total", "KV event batches applied.", ["source"],
                               registry=r)
        self.events = Counter("pointsman_kv_events_events_total", "KV events applied, by type.", ["type"],
                              registry=r)
        self.blocks = Counter("pointsman_kv_events_blocks_total", "Engine blocks stored, removed or orphaned.",
                              ["op"], registry=r)
        self.malformed = Counter("pointsman_kv_events_malformed_total", "KV event messages dropped as malformed.",
                                 ["reason"], registry=r)
        self.gaps = Counter("pointsman_kv_events_gaps_total", "Sequence gaps detected.", registry=r)
        self.replays = Counter("pointsman_kv_events_replays_total", "Replay requests by outcome.", ["outcome"],
                               registry=r)
        self.restarts = Counter("pointsman_kv_events_restarts_total", "Publishers seen starting afresh.",
                                registry=r)
        self.unknown = Counter("pointsman_kv_events_unknown_total", "Endpoint ranks marked unknown.", registry=r)
        self.errors = Counter("pointsman_kv_events_errors_total", "Unexpected errors handling KV events.",
                              registry=r)
        self._gauges: _Gauges | None = None

    def watch(self, index: PreciseIndex, subscriptions: Callable[[], int]) -> None:
        """Export the scrape-time gauges for this index (once)."""
        if self._gauges is None:
            self._gauges = _Gauges(index, subscriptions)
            self.registry.register(self._gauges)
