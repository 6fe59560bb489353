"""The gauges Pointsman computes when Prometheus scrapes (so they are never stale), registered by
`epp.api.metrics.EppMetrics.bind_datastore` and `bind_health`:

- the pool gauges, from the datastore: inference_pool_average_kv_cache_utilization{name},
  inference_pool_average_queue_size{name}, inference_pool_ready_pods{name},
  inference_pool_per_pod_queue_size{name, model_server_pod};
- endpoint health, from passive health and the scraper: pointsman_endpoint_state{endpoint, state},
  pointsman_endpoint_scrape_failures{endpoint}.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from epp.fleet import Datastore, PassiveHealth


class PoolCollector(Collector):
    def __init__(self, datastore: Datastore) -> None:
        self.datastore = datastore

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # GIE's pool gauges and llm-d-router's llm_d_epp_* twins, from the same computation (epp/api/metric_twins.py)
        kv = _TwinGauge("inference_pool_average_kv_cache_utilization", "llm_d_epp_average_kv_cache_utilization",
                        "The average KV cache utilization of the pool's model servers (0-1).", ["name"])
        queue = _TwinGauge("inference_pool_average_queue_size", "llm_d_epp_average_queue_size",
                           "The average number of waiting requests per model server.", ["name"])
        running = _TwinGauge("inference_pool_average_running_requests", "llm_d_epp_average_running_requests",
                             "The average number of running requests per model server.", ["name"])
        ready = _TwinGauge("inference_pool_ready_pods", "llm_d_epp_ready_endpoints",
                           "The number of ready model servers in the pool.", ["name"])
        per_pod = _TwinGauge("inference_pool_per_pod_queue_size", "llm_d_epp_per_endpoint_queue_size",
                             "Waiting requests per model server.", ["name", "model_server_pod"],
                             ["name", "model_server_endpoint"])
        for name in self.datastore.pool_names():
            snap = self.datastore.snapshot(name)
            if snap is None:
                continue
            scraped = [e for e in snap.endpoints if e.metrics.updated_at is not None]
            n = len(scraped)
            kv.add([name], sum(e.metrics.kv_usage for e in scraped) / n if n else 0.0)
            queue.add([name], sum(e.metrics.waiting for e in scraped) / n if n else 0.0)
            running.add([name], sum(e.metrics.running for e in scraped) / n if n else 0.0)
            ready.add([name], float(len({e.name or e.address for e in snap.endpoints})))
            for e in scraped:
                per_pod.add([name, e.name or e.key], float(e.metrics.waiting))
        for twin in (kv, queue, running, ready, per_pod):
            yield from twin.families


class _TwinGauge:
    """A GIE gauge family and its llm-d twin, given the same values."""

    def __init__(self, gie: str, llmd: str, doc: str, labels: list[str], llmd_labels: list[str] | None = None):
        self.families = (GaugeMetricFamily(gie, doc, labels=labels),
                         GaugeMetricFamily(llmd, doc, labels=llmd_labels or labels))

    def add(self, labels: list[str], value: float) -> None:
        for family in self.families:
            family.add_metric(labels, value)


class HealthCollector(Collector):
    def __init__(self, passive: PassiveHealth) -> None:
        self.passive = passive

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = GaugeMetricFamily("pointsman_endpoint_state", "1 for the endpoint's health state.",
                                  labels=["endpoint", "state"])
        scrapes = GaugeMetricFamily("pointsman_endpoint_scrape_failures", "Consecutive failed metrics scrapes.",
                                    labels=["endpoint"])
        passive = self.passive
        scraper = passive.scraper
        for key in sorted(passive.datastore.members()):
            state.add_metric([key, passive.view(key)[0]], 1.0)
            if scraper is not None:
                scrapes.add_metric([key], float(scraper.failures(key)))
        yield state
        yield scrapes
