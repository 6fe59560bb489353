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

import argparse
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scheduling.sessions.identity import BODY_FIELDS, IdentitySources, ResponseChains, identify
from scheduling.types import ApiKind, LLMRequest

if TYPE_CHECKING:
    from epp.request.exchange import RequestExchange
    from epp.request.observe import Follow
    from epp.request.usage import Usage

log = logging.getLogger(__name__)

FAIRNESS_KEYS = ("tenant", "session", "program")


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


@dataclass(frozen=True)
class SessionSettings:
    enabled: bool = True
    headers: tuple[str, ...] = ("x-session-id",)
    body_fields: tuple[str, ...] = BODY_FIELDS
    previous_response_id: bool = True
    program_header: str = ""
    max_bytes: int = 256
    fairness: str = "tenant"  # what flow control's fairness is keyed by: tenant | session | program

    def __post_init__(self) -> None:
        if self.fairness not in FAIRNESS_KEYS:
            raise ValueError(f"--flow-fairness-key must be one of {', '.join(FAIRNESS_KEYS)}, got {self.fairness!r}")
        bad = [f for f in self.body_fields if f not in BODY_FIELDS]
        if bad:
            raise ValueError(f"--session-body-fields: unknown field(s) {', '.join(bad)}; choose from "
                             f"{', '.join(BODY_FIELDS)}")
        if not 1 <= self.max_bytes <= 4096:
            raise ValueError(f"--session-max-bytes must be in [1, 4096], got {self.max_bytes}")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> SessionSettings:
        d = cls()
        return cls(
            enabled=getattr(ns, "sessions", d.enabled),
            headers=tuple(h.lower() for h in _names(getattr(ns, "session_headers", None) or ",".join(d.headers))),
            body_fields=_names(ns.session_body_fields) if getattr(ns, "session_body_fields", None) is not None
            else d.body_fields,
            previous_response_id=getattr(ns, "session_previous_response_id", d.previous_response_id),
            program_header=(getattr(ns, "program_header", None) or "").lower(),
            max_bytes=getattr(ns, "session_max_bytes", d.max_bytes),
            fairness=getattr(ns, "flow_fairness_key", d.fairness),
        )

    def sources(self) -> IdentitySources:
        return IdentitySources(headers=self.headers, body=self.body_fields,
                               previous_response_id=self.previous_response_id,
                               responses_chain=self.previous_response_id, program_header=self.program_header,
                               max_bytes=self.max_bytes)


def add_flags(p: argparse.ArgumentParser, parse_bool: Any) -> None:
    g = p.add_argument_group("agent sessions (docs/sessions.md)")
    g.add_argument("--sessions", type=parse_bool, default=True,
                   help="identify agent sessions and keep their turns where their context is (true); false: every "
                        "request is placed on its own")
    g.add_argument("--session-headers", default=None,
                   help="request headers naming the session, in order (comma list; default x-session-id)")
    g.add_argument("--session-body-fields", default=None,
                   help=f"body fields naming the session, in order (comma list; default {','.join(BODY_FIELDS)}; "
                        "'' for none)")
    g.add_argument("--session-previous-response-id", type=parse_bool, default=True,
                   help="Responses API: a request continuing a response joins its session (true)")
    g.add_argument("--program-header", default=None,
                   help="request header naming the program a session runs (default: the prompt's first 2,048 "
                        "characters and the model)")
    g.add_argument("--session-max-bytes", type=int, default=256,
                   help="longer session values are ignored (256)")
    g.add_argument("--flow-fairness-key", choices=FAIRNESS_KEYS, default="tenant",
                   help="flow control's fairness: per tenant (x-gateway-inference-fairness-id, the default), per "
                        "session or per program (within the tenant)")


def _route_sources(route: Any) -> Sequence[tuple[str, str]]:
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

    def identify(self, req: LLMRequest, route: Any = None, *, count: bool = True) -> None:
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
