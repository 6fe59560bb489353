"""The request's reports to the director's observers and its response path: the second half of
`epp.request.exchange.RequestExchange`, whose methods these functions are (bound in its class body).

- reporting: `decided` after the commit (each observer may return a follow for the response path), `rejected`
  for a request that never reaches an engine (each exactly once); what the admitters hold is given back
  (`undo_holds`) on a rejection or a failure;
- the response: `response_headers`, `response_body`, `response_end` feed the follows (and scan the usage, undo a
  model rewrite in the body); `close` releases everything exactly once, whatever ended the stream, and settles
  the follows with the response's usage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from epp.protocol import Outcome
from epp.request.director import CONFORMANCE_RESP, LB_NS, SERVED, error_outcome
from epp.request.usage import UsageScanner
from scheduling.types import ErrorCode, SchedulingError

if TYPE_CHECKING:
    from epp.request.exchange import RequestExchange
    from epp.request.resolve import Metadata

log = logging.getLogger("epp.director")


# ---- reporting -----------------------------------------------------------------------------------------------
def decided(ex: RequestExchange) -> None:
    follows = ex._follows
    follows.extend(ex._holds)
    for observer in ex.d.observers:
        try:
            f = observer.decided(ex)
        except Exception:
            log.exception("a request observer failed", extra=ex.log_fields())
            continue
        if f is not None:
            follows.append(f)


def rejected(ex: RequestExchange, code: str) -> None:
    ex.decision = ex.d.ids.take()
    for observer in ex.d.observers:
        try:
            observer.rejected(ex, code)
        except Exception:
            log.exception("a request observer failed", extra=ex.log_fields())


def refuse(ex: RequestExchange, err: SchedulingError) -> Outcome:
    """The request never reaches an engine: give back what the admitters took, report it, answer the error."""
    undo_holds(ex)
    rejected(ex, err.code.value)
    return ex._receipt(error_outcome(err))


def fail(ex: RequestExchange, exc: BaseException) -> Outcome:
    undo_holds(ex)
    ex.request = None  # reported without a model: the failure may lie in what resolved it
    rejected(ex, ErrorCode.INTERNAL.value)
    log.exception("scheduling failed", exc_info=exc, extra=ex.log_fields())
    return ex._receipt(error_outcome(SchedulingError(ErrorCode.INTERNAL, f"scheduling failed: {exc}")))


def undo_holds(ex: RequestExchange) -> None:
    holds, ex._holds = ex._holds, []
    for hold in holds:
        try:
            hold.undo()
        except Exception:
            log.exception("undoing an admission hold failed", extra=ex.log_fields())


# ---- the response ------------------------------------------------------------------------------------------------
def response_headers(ex: RequestExchange, headers: Mapping[str, str], metadata: Metadata) -> list[tuple[str, str]]:
    ex.scanner = UsageScanner(headers.get("content-type", ""))
    served = metadata.get(LB_NS, {}).get(SERVED)
    if isinstance(served, str):
        ex.served = served
    if ex._follows:
        raw = headers.get(":status", "")
        status = int(raw) if raw.isdigit() else 0
        for f in ex._follows:
            _safely(f.response_headers, ex, status, ex.served)
    out: list[tuple[str, str]] = []
    result = ex.result
    if result is not None and result.response_headers:
        out.extend(result.response_headers.items())  # e.g. a session token set by a stateful plugin
    if ex.d.config.conformance:
        served = ex.served or (result.primary.key if result else "")
        if served:
            out.append((CONFORMANCE_RESP, served))
    header = ex.d.ids.header
    if header and ex.decision:
        out.append((header, ex.decision_id))
    return out


def response_body(ex: RequestExchange, chunk: bytes, end_of_stream: bool) -> bytes:
    if ex.scanner is None:
        ex.scanner = UsageScanner()
    ex.scanner.feed(chunk, end_of_stream)
    if ex._follows:
        size = len(chunk)
        for f in ex._follows:
            _safely(f.response_chunk, ex, size, end_of_stream)
    if ex._rewrite_from is not None and ex._rewrite_to is not None:
        chunk = chunk.replace(ex._rewrite_from, ex._rewrite_to).replace(
            ex._rewrite_from.replace(b":", b": ", 1), ex._rewrite_to.replace(b":", b": ", 1)
        )
    return chunk


def response_end(ex: RequestExchange) -> None:
    """The response ended without an end-of-stream body message (trailers, or no body messages at all)."""
    for f in ex._follows:
        _safely(f.response_chunk, ex, 0, True)


def close(ex: RequestExchange) -> None:
    if ex._closed:
        return
    ex._closed = True
    ctx = ex.ctx
    if ctx is None:
        return
    d = ex.d
    live = ex._ticket is not None and d.datastore.inflight.remove(ex._ticket)
    if d.flow is not None:
        d.flow.kick()  # capacity freed: queued requests may go
    ctx.now = d.clock()  # plugins see the time the request ended
    try:
        # An endpoint that left while the request ran was already forgotten by every plugin: telling them how
        # the request ended would only bring its state back.
        if live and ex.scheduler is not None and ex.result is not None:
            ex.scheduler.response_complete(ctx, ex.result)
    except Exception:
        log.exception("response_complete hook failed", extra=ex.log_fields())
    usage = ex.scanner.usage if ex.scanner else None
    for f in ex._follows:  # e.g. settle a rate-limit charge with the usage the response reported
        _safely(f.closed, ex, usage)


def _safely(fn: Callable[..., None], ex: RequestExchange, *args: Any) -> None:
    try:
        fn(ex, *args)
    except Exception:
        log.exception("a request follow failed", extra=ex.log_fields())
