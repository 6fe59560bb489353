"""Response watchers: who sees the response path of a request the director committed.

    watcher.watch(ctx, result) -> ResponseWatch | None      (after the commit; `result` None for a provider)
    w.response_headers(status, served)                      (status 0 when unknown; `served` from envoy.lb)
    w.response_chunk(end_of_stream)                         (every response body chunk)
    w.closed()                                              (once, when the stream ends for any reason)

These are reports: a watch never changes the response. The calls come only with Envoy's response phases (full
phases); with lean phases a watch sees `closed()` alone. LLMKube's quarantine and first-byte latencies are one
watcher (epp/routing/llmkube_router.py); a watch must never raise (the director logs and ignores it if it does).
"""

from __future__ import annotations

from typing import Any, Protocol


class ResponseWatch(Protocol):
    def response_headers(self, status: int, served: str | None) -> None: ...
    def response_chunk(self, end_of_stream: bool) -> None: ...
    def closed(self) -> None: ...


class Watcher(Protocol):
    def watch(self, ctx: Any, result: Any) -> ResponseWatch | None: ...
