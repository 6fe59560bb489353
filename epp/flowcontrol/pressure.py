"""The pool saturation flow control dispatches by: the configured detector over the pool's routable endpoints.

The utilization detector reads scraped queue depths, which lag the picks by up to a scrape interval: dispatching
a whole queue between two scrapes would overshoot. So requests picked since an endpoint's metrics last arrived
(the rise of its in-flight count since then) count as waiting on it until the next scrape shows them. The
concurrency detector reads the in-flight counts themselves and needs no correction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from epp.fleet import Datastore, Detector, SaturationDetector
from scheduling.types import Endpoint


class PoolPressure:
    def __init__(
        self,
        datastore: Datastore,
        endpoints: Callable[[str], Sequence[Endpoint]],
        detector: Detector,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.datastore = datastore
        self.endpoints = endpoints  # pool name -> its routable endpoints
        self.detector = detector
        self.clock = clock
        self._base: dict[str, int] = {}  # endpoint key -> in-flight requests when its metrics last arrived

    def __call__(self, pool: str) -> float:
        eps = self.endpoints(pool)
        extra: dict[str, int] | None = None
        if isinstance(self.detector, SaturationDetector):
            get = self.datastore.inflight.get
            base = self._base
            extra = {}
            for e in eps:
                n = get(e.key).requests - base.get(e.key, 0)
                if n > 0:
                    extra[e.key] = n
        return self.detector.saturation(eps, self.clock(), extra)

    def metrics_updated(self, keys: Iterable[str]) -> None:
        """Fresh metrics for these endpoints: what was in flight now is in them."""
        get = self.datastore.inflight.get
        for key in keys:
            self._base[key] = get(key).requests

    def forget(self, key: str) -> None:
        self._base.pop(key, None)
