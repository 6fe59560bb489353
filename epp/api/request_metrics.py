"""The request path's Prometheus metrics as a request observer (`RequestMetrics`, epp/request/observe.py): it
reports each request's start, error and end to `epp.api.metrics.EppMetrics`, which holds the series."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.flowcontrol import DEFAULT_FLOW, fairness_id
from scheduling.types import ErrorCode

if TYPE_CHECKING:
    from epp.api.metrics import EppMetrics
    from epp.request import RequestExchange, Usage

PLUGIN_SAMPLE_EVERY = 8  # report per-plugin durations for one request in this many


class RequestMetrics:
    """The request path's metrics, as a request observer (epp/request/observe.py) and its own follow.

    Every routed request is counted once when decided and once when its stream closes (so the running gauge
    returns to zero); every request that never reaches an engine once as an error. Per-plugin latency is
    sampled: a histogram per plugin per request costs more than the plugins."""

    __slots__ = ("m", "_decisions")

    def __init__(self, metrics: EppMetrics) -> None:
        self.m = metrics
        self._decisions = 0

    def decided(self, ex: RequestExchange) -> _Response:
        m = self.m
        req = ex.request
        assert req is not None
        m.request_started(req.model, req.target_model, req.priority, fairness_id(ex.headers) or DEFAULT_FLOW)
        result = ex.result
        if result is not None:
            m.scheduler_duration(ex.schedule_s)
            picked = result.primary
            m.scheduler_attempt(req.target_model, picked.name or picked.key, picked.namespace, str(picked.port))
            self._decisions += 1
            if self._decisions % PLUGIN_SAMPLE_EVERY == 0:
                for pr in result.profile_results.values():
                    for det in pr.details:
                        m.plugin_duration(det.kind, det.type, det.name, det.duration_s)
            if result.decision:
                m.disagg_decision(req.target_model, result.decision)
        return _Response(self)

    def rejected(self, ex: RequestExchange, code: str) -> None:
        req = ex.request
        fairness = fairness_id(ex.headers) or DEFAULT_FLOW
        if req is None:
            self.m.request_error("", "", code, "", fairness)
            return
        self.m.request_error(req.model, req.target_model, code, req.priority, fairness)
        if code == ErrorCode.SERVICE_UNAVAILABLE.value and ex.result is None:
            self.m.scheduler_attempt(req.target_model)  # no endpoint could take it

    def closed(self, ex: RequestExchange, usage: Usage | None, response_bytes: int = 0) -> None:
        req = ex.request
        assert req is not None
        self.m.request_finished(req.model, req.target_model, ex.d.clock() - ex.started,
                                usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0,
                                req.priority, fairness_id(ex.headers) or DEFAULT_FLOW, ex.size, response_bytes)


class _Response:
    """One routed request's response: its body bytes (as they pass through Pointsman), reported when it closes."""

    __slots__ = ("metrics", "size")

    def __init__(self, metrics: RequestMetrics) -> None:
        self.metrics = metrics
        self.size = 0

    def response_headers(self, ex: RequestExchange, status: int, served: str | None) -> None:
        pass

    def response_chunk(self, ex: RequestExchange, size: int, end_of_stream: bool) -> None:
        self.size += size

    def closed(self, ex: RequestExchange, usage: Usage | None) -> None:
        self.metrics.closed(ex, usage, self.size)
