"""The reply side of one request: who follows its response, and the response as it streams back.

`ResponsePath` is the exchange's collaborator for everything after the decision (epp/request/exchange.py):

- `decided(ex, holds)`: the request was committed: the admitters' holds and the observers' follows (each
  observer's `decided` may return one) follow the response from here on;
- `headers`, `body`, `end`: feed the follows, scan the response's usage, undo a model rewrite in the body, and
  add the response headers Pointsman sets (a stateful plugin's, the conformance echo, the decision id);
- `settle(ex)`: the stream ended: each follow is told `closed(ex, usage)` exactly once.

`rejected(ex, code)` tells the observers about a request that never reaches an engine (exactly once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from epp.request.context import CONFORMANCE_RESP, LB_NS, SERVED
from epp.request.usage import UsageScanner

if TYPE_CHECKING:
    from epp.request.admit import Hold
    from epp.request.exchange import RequestExchange
    from epp.request.observe import Follow
    from epp.request.resolve import Metadata

log = logging.getLogger("epp.director")


def rejected(ex: RequestExchange, code: str) -> None:
    """Tell the observers that `ex` never reaches an engine (its decision id is taken)."""
    for observer in ex.d.observers:
        try:
            observer.rejected(ex, code)
        except Exception:
            log.exception("a request observer failed", extra=ex.log_fields())


class ResponsePath:
    __slots__ = ("follows", "scanner", "served", "rewrite_from", "rewrite_to")

    def __init__(self) -> None:
        self.follows: list[Follow | Hold] = []  # the holds, then the observers' follows of the response path
        self.scanner: UsageScanner | None = None  # the response's usage, as it streams back
        self.served: str | None = None  # the endpoint Envoy says served it (override_host fallbacks)
        self.rewrite_from: bytes | None = None  # the model value the engine answers with ...
        self.rewrite_to: bytes | None = None  # ... and the one the client asked for

    def rewrite(self, target: str, model: str) -> None:
        """The request's model was rewritten to `target`: the response names `model` again."""
        self.rewrite_from = f'"model":"{target}"'.encode()
        self.rewrite_to = f'"model":"{model}"'.encode()

    def decided(self, ex: RequestExchange, holds: Sequence[Hold]) -> None:
        follows = self.follows
        follows.extend(holds)
        for observer in ex.d.observers:
            try:
                f = observer.decided(ex)
            except Exception:
                log.exception("a request observer failed", extra=ex.log_fields())
                continue
            if f is not None:
                follows.append(f)

    def headers(self, ex: RequestExchange, headers: Mapping[str, str], metadata: Metadata) -> list[tuple[str, str]]:
        self.scanner = UsageScanner(headers.get("content-type", ""))
        served = metadata.get(LB_NS, {}).get(SERVED)
        if isinstance(served, str):
            self.served = served
        if self.follows:
            raw = headers.get(":status", "")
            status = int(raw) if raw.isdigit() else 0
            for f in self.follows:
                _safely(f.response_headers, ex, status, self.served)
        out: list[tuple[str, str]] = []
        result = ex.result
        if result is not None and result.response_headers:
            out.extend(result.response_headers.items())  # e.g. a session token set by a stateful plugin
        if ex.d.config.conformance:
            served = self.served or (result.primary.key if result else "")
            if served:
                out.append((CONFORMANCE_RESP, served))
        header = ex.d.ids.header
        if header and ex.decision:
            out.append((header, ex.decision_id))
        return out

    def body(self, ex: RequestExchange, chunk: bytes, end_of_stream: bool) -> bytes:
        if self.scanner is None:
            self.scanner = UsageScanner()
        self.scanner.feed(chunk, end_of_stream)
        if self.follows:
            size = len(chunk)
            for f in self.follows:
                _safely(f.response_chunk, ex, size, end_of_stream)
        old, new = self.rewrite_from, self.rewrite_to
        if old is not None and new is not None:
            chunk = chunk.replace(old, new).replace(old.replace(b":", b": ", 1), new.replace(b":", b": ", 1))
        return chunk

    def end(self, ex: RequestExchange) -> None:
        """The response ended without an end-of-stream body message (trailers, or no body messages at all)."""
        for f in self.follows:
            _safely(f.response_chunk, ex, 0, True)

    def settle(self, ex: RequestExchange) -> None:
        """The stream ended: settle every follow with the response's usage (e.g. a rate-limit charge)."""
        usage = self.scanner.usage if self.scanner else None
        for f in self.follows:
            _safely(f.closed, ex, usage)


def _safely(fn: Callable[..., None], ex: RequestExchange, *args: object) -> None:
    try:
        fn(ex, *args)
    except Exception:
        log.exception("a request follow failed", extra=ex.log_fields())
