"""One observation, two families: a GIE metric family and its llm-d-router (`llm_d_epp_*`) twin.

llm-d-router v0.10 writes every series GIE defined (`inference_objective_*`, `inference_extension_*`,
`inference_pool_*`) together with an `llm_d_epp_*` twin that has its own labels (request series add `fairness_id`
and `priority`; the scheduler's attempts say `endpoint_name` where GIE says `pod_name`) and llm-d's buckets. GIE's
Grafana dashboards query the first family, llm-d's the second, so Pointsman emits both.

A `TwinFamily` is the pair. Its `labels(...)` takes the twin's (the richer) label values and returns a `TwinChild`
that applies every update to both children at once: the two families are written by the same call, from the same
value, so they cannot drift apart. Nothing here keeps its own count.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# llm-d-router v0.10's bucket sets (pkg/epp/metrics), by what they measure.
LLMD_DURATION_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20,
                         30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
LLMD_REQUEST_SIZE_BUCKETS = tuple(float(2 ** i) for i in range(6, 31))  # 64 B .. 1 GiB, powers of two
LLMD_RESPONSE_SIZE_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
LLMD_INPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072,
                            262144, 524288, 1048576)
LLMD_OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
LLMD_SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
LLMD_FLOW_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                     60.0)


def observe_many(child: Any, values: list[float]) -> None:
    """`child.observe(v)` for every value, one increment per bucket (the bucket observe() would choose: the
    first upper bound >= v). Falls back to observe() if prometheus_client's internals ever change."""
    if isinstance(child, TwinChild):
        observe_many(child.gie, values)
        observe_many(child.llmd, values)
        return
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values:
            child.observe(v)
        return
    counts = [0] * len(bounds)
    for v in values:
        counts[bisect_left(bounds, v)] += 1
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
    total.inc(sum(values))


class TwinChild:
    """One labelled child of each family; every update goes to both."""

    __slots__ = ("gie", "llmd")

    def __init__(self, gie: Any, llmd: Any) -> None:
        self.gie = gie
        self.llmd = llmd

    def inc(self, amount: float = 1.0) -> None:
        self.gie.inc(amount)
        self.llmd.inc(amount)

    def set(self, value: float) -> None:
        self.gie.set(value)
        self.llmd.set(value)

    def observe(self, value: float) -> None:
        self.gie.observe(value)
        self.llmd.observe(value)


class TwinFamily:
    """A GIE family and its llm-d twin. Label values are given in the twin's label order; the GIE family gets the
    ones it has (by name, or through `rename`: twin label -> GIE label)."""

    def __init__(self, gie: Any, llmd: Any, gie_labels: Sequence[str],
                 llmd_labels: Sequence[str], rename: Mapping[str, str] | None = None) -> None:
        self.gie = gie
        self.llmd = llmd
        as_gie = [(rename or {}).get(name, name) for name in llmd_labels]
        missing = [name for name in gie_labels if name not in as_gie]
        if missing:
            raise ValueError(f"the twin of {gie_labels} lacks {missing}")
        self._pick = tuple(as_gie.index(name) for name in gie_labels)
        self._labelled = bool(llmd_labels)

    def labels(self, *values: str) -> TwinChild:
        if not self._labelled:
            return TwinChild(self.gie, self.llmd)
        return TwinChild(self.gie.labels(*(values[i] for i in self._pick)), self.llmd.labels(*values))

    def remove(self, *values: str) -> None:
        """Drop a series from both families (for twins with the same labels: the GIE series of a twin with more
        labels may still be fed by another twin series, so it stays)."""
        self.llmd.remove(*values)
        if len(self._pick) == len(values):
            self.gie.remove(*(values[i] for i in self._pick))

    def collect(self) -> list[Any]:
        return [*self.gie.collect(), *self.llmd.collect()]


def twin_counter(registry: CollectorRegistry, gie: str, llmd: str, doc: str, gie_labels: Sequence[str],
                 llmd_labels: Sequence[str], rename: Mapping[str, str] | None = None) -> TwinFamily:
    return TwinFamily(Counter(gie, doc, list(gie_labels), registry=registry),
                      Counter(llmd, doc, list(llmd_labels), registry=registry), gie_labels, llmd_labels, rename)


def twin_gauge(registry: CollectorRegistry, gie: str, llmd: str, doc: str, gie_labels: Sequence[str],
               llmd_labels: Sequence[str], multiprocess_mode: Literal["all", "livesum"] = "all") -> TwinFamily:
    return TwinFamily(Gauge(gie, doc, list(gie_labels), registry=registry, multiprocess_mode=multiprocess_mode),
                      Gauge(llmd, doc, list(llmd_labels), registry=registry, multiprocess_mode=multiprocess_mode),
                      gie_labels, llmd_labels)


def twin_histogram(registry: CollectorRegistry, gie: str, llmd: str, doc: str, gie_labels: Sequence[str],
                   llmd_labels: Sequence[str], gie_buckets: Sequence[float],
                   llmd_buckets: Sequence[float]) -> TwinFamily:
    return TwinFamily(Histogram(gie, doc, list(gie_labels), buckets=gie_buckets, registry=registry),
                      Histogram(llmd, doc, list(llmd_labels), buckets=llmd_buckets, registry=registry),
                      gie_labels, llmd_labels)
