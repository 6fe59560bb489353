"""Request observers: the one way to see what happens to a request.

    observer.decided(ex) -> Follow | None          (the request was routed: committed to an endpoint or a provider)
    observer.rejected(ex, code)                    (it never reached an engine: `code` is the inference error code)
    follow.response_headers(ex, status, served)    (status 0 when unknown; `served` from Envoy's envoy.lb metadata)
    follow.response_chunk(ex, size, end_of_stream) (every response body chunk; size 0 with trailers)
    follow.closed(ex, usage)                       (once, when the stream ends for any reason; usage when seen)

`ex` is the request's `RequestExchange` (read it, never change it): `ex.ctx.request` (model, target, priority,
request id), `ex.result` (the scheduler's result, None for a provider), `ex.started` / `ex.clock()` (the director's
clock), `ex.scanner` (the response's usage scanner), `ex.schedule_s` (scheduling time, 0 for a dry run).

Subscribers: Prometheus metrics (epp/api/request_metrics.py), the dashboard's decision recorder (epp/api/dashboard),
passive health (epp/fleet/passive.py), LLMKube's quarantine (epp/routing/dialects/llmkube/runtime.py); a rate-limit hold is a
follow too (epp/request/admit.py). A stateless observer returns itself as its follow. The calls come in that order
per request; the response calls only with Envoy's response phases (with lean phases a follow sees `closed` alone).
Everything here is on the request path: keep it cheap, and never raise (the exchange logs and goes on if one does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from epp.request.exchange import RequestExchange
    from epp.request.usage import Usage


class Follow(Protocol):
    def response_headers(self, ex: RequestExchange, status: int, served: str | None) -> None: ...
    def response_chunk(self, ex: RequestExchange, size: int, end_of_stream: bool) -> None: ...
    def closed(self, ex: RequestExchange, usage: Usage | None) -> None: ...


class RequestObserver(Protocol):
    def decided(self, ex: RequestExchange) -> Follow | None: ...
    def rejected(self, ex: RequestExchange, code: str) -> None: ...
