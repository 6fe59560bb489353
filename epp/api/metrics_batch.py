"""The request path's metric updates, batched: plain dict and list updates on the event loop, folded into the
prometheus objects before every collection and whenever 1024 observations are pending (epp/api/metrics.py,
"Cost"), and the labelled children those updates go to, cached.

`Batch` holds the pending updates and the children; `FoldCollector`, registered first in the registry, folds them
whenever the registry is collected, so /metrics and `registry.get_sample_value` always see every update.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from epp.api.metric_twins import TwinFamily, observe_many

FOLD_EVERY = 1024  # pending observations that fold at once (bounded memory when nobody scrapes)


class Batch:
    """Pending increments and observations per labelled child, and the children by (metric, label values).

    `batched` false (prometheus-client multiprocess mode: another process reads the values from memory-mapped files
    and no collection here would fold them): every update goes to prometheus at once."""

    __slots__ = ("batched", "incs", "observations", "n_obs", "children")

    def __init__(self, batched: bool) -> None:
        self.batched = batched
        self.incs: dict[Any, float] = {}  # counter or gauge child -> amount to add
        self.observations: dict[Any, list[float]] = {}  # histogram child -> observations
        self.n_obs = 0
        self.children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: MetricWrapperBase | TwinFamily, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: prometheus_client validates and locks on every labels() call,
        which is a measurable share of the per-request cost on the hot path."""
        key = (id(metric), labels)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = metric.labels(*labels)
        return child

    def forget(self, metric: MetricWrapperBase | TwinFamily, labels: tuple[str, ...]) -> None:
        """The series of `metric` with these label values is removed: drop its cached child."""
        self.children.pop((id(metric), labels), None)

    def inc(self, child: Any, amount: float = 1.0) -> None:
        if not self.batched:
            child.inc(amount)
            return
        incs = self.incs
        incs[child] = incs.get(child, 0.0) + amount

    def observe(self, child: Any, value: float) -> None:
        if not self.batched:
            child.observe(value)
            return
        values = self.observations.get(child)
        if values is None:
            values = self.observations[child] = []
        values.append(value)
        self.n_obs += 1
        if self.n_obs >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Apply the pending updates to the prometheus objects."""
        incs, self.incs = self.incs, {}
        for child, amount in incs.items():
            if amount:
                child.inc(amount)  # a gauge takes a negative amount (more dec than inc)
        observations, self.observations = self.observations, {}
        self.n_obs = 0
        for child, values in observations.items():
            observe_many(child, values)


class FoldCollector(Collector):
    """Exports nothing; collecting it folds the pending updates (it is registered before every metric)."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.batch.fold()
        return iter(())
