"""Agent sessions in the shell: identify each request's session before scheduling, key flow control's fairness by
session or program when asked, and learn Responses API chains from response bodies (docs/sessions.md).

`SessionIdentity.identify` runs in the resolve stage, after the routing layer: it sets `LLMRequest.session`
(scheduling/sessions/identity.py reads the sources) from the route's own session settings (Kthena's
`sessionSticky.sources`, LLMKube's `sessionAffinity.headers`), then the configured headers and body fields. The
scheduler's agent-session-scorer does the rest. As a request observer it follows Responses API requests: the
response's id (seen in the response body with `--response-phases full`) joins the session, so the next request's
`previous_response_id` finds it. With `lean` or `headers` phases no response body is seen: a chain then needs a
session header or `user` as well (each `previous_response_id` otherwise starts a session of its own).

Bad session values never fail a request: they are skipped and counted (`skipped`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epp.request.settings import SessionSettings
from scheduling.sessions.identity import ResponseChains, identify, named_by
from scheduling.types import ApiKind, LLMRequest

if TYPE_CHECKING:
    from epp.request.exchange import RequestExchange
    from epp.request.observe import Follow
    from epp.request.usage import Usage
    from epp.routing import RouteDecision

log = logging.getLogger(__name__)

def _route_sources(route: RouteDecision | None) -> Sequence[tuple[str, str]]:
    """The session settings of the route that decided: Kthena's sessionSticky sources, LLMKube's headers."""
    if route is None:
        return ()
    sticky = getattr(route, "sticky", None)
    if sticky is not None:
        return tuple(sticky.spec.sources)
    backend = getattr(route, "backend", None)
    session = getattr(getattr(backend, "balancing", None), "session", None)
    if session is not None:
        return tuple(("header", h) for h in session.headers)
    return ()


class SessionIdentity:
    """The shell's side of agent sessions (see the module docstring); also a request observer."""

    def __init__(self, settings: SessionSettings) -> None:
        self.settings = settings
        self.sources = settings.sources()
        self.chains = ResponseChains()
        self.identified: Counter[str] = Counter()  # source -> requests (exact)
        self.skipped: Counter[str] = Counter()  # source -> unusable values seen (huge, empty, not a string)

    def identify(self, req: LLMRequest, route: RouteDecision | None = None, *, count: bool = True) -> None:
        """Set `req.session` (None when the request names none). Never raises on client input. A dry run
        (explain) passes `count=False`: the identity counters do not move."""
        if not self.settings.enabled:
            return
        try:
            ref, skipped = identify(req, self.sources, extra=_route_sources(route), chains=self.chains)
        except Exception:  # a routing hint must never fail a request
            log.exception("session identity failed")
            return
        if count:
            for s in skipped:
                self.skipped[s] += 1
        if ref is not None:
            req.session = ref
            if count:
                self.identified[ref.source] += 1

    def pending(self, headers: Mapping[str, str], arrived: Mapping[str, Any]) -> bool:
        """Whether a body member still to come could name the request's session: sessions are on, body fields may
        name one, and no session header nor any of those fields is among what has arrived (`named_by`). A decision
        on the prompt's head then waits for the body's end (epp/request/early.py)."""
        return self.settings.enabled and bool(self.sources.body) and not named_by(headers, arrived, self.sources)

    def fairness_id(self, req: LLMRequest | None, tenant: str) -> str:
        """Flow control's fairness id: the tenant's, or within it the session's or the program's."""
        mode = self.settings.fairness
        ref = req.session if req is not None else None
        if mode == "tenant" or ref is None:
            return tenant
        part = f"session:{ref.label}" if mode == "session" else f"program:{ref.program:016x}"
        return f"{tenant}/{part}" if tenant else part

    # ---- request observer: Responses API chains ----------------------------------------------------------------
    def decided(self, ex: RequestExchange) -> Follow | None:
        req = ex.request
        if req is None or req.session is None or req.kind is not ApiKind.RESPONSES or not self.settings.enabled:
            return None
        return self

    def rejected(self, ex: RequestExchange, code: str) -> None:
        return None

    def response_headers(self, ex: RequestExchange, status: int, served: str | None) -> None:
        return None

    def response_chunk(self, ex: RequestExchange, size: int, end_of_stream: bool) -> None:
        return None

    def closed(self, ex: RequestExchange, usage: Usage | None) -> None:
        req, scanner = ex.request, ex.scanner
        if req is None or req.session is None or scanner is None or not scanner.response_id:
            return
        self.chains.learn(scanner.response_id, req.session.key, self.settings.max_bytes)
