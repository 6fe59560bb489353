"""Session stickiness for one pool backend: session key -> endpoint, with an idle TTL.

The key comes from the backend's sources in order (header, query, cookie, JWT claim; the first non-empty value
wins; scheduling.plugins.scorers.session_affinity.session_key reads them). Only an xxh3-128 hash of it is kept.
A binding pins the request to its endpoint while that endpoint is a routable candidate and the binding has been
used within the TTL; each use refreshes it. A binding whose endpoint left is dropped (endpoint lifecycle).
Lookups never change state, so explain stays a dry run; `bind` (after a committed pick) does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import xxhash

from epp.routing.model import Sticky
from scheduling.plugins.scorers.session_affinity import session_key


class StickyTable:
    def __init__(self, spec: Sticky, max_sessions: int = 100_000) -> None:
        self.spec = spec
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, tuple[str, float]] = OrderedDict()  # hash -> (endpoint key, last use)

    def __len__(self) -> int:
        return len(self._sessions)

    def key_hash(self, headers: Mapping[str, str]) -> int | None:
        key = session_key(headers, self.spec.sources)
        return xxhash.xxh3_128_intdigest(key.encode("utf-8")) if key else None

    def lookup(self, h: int, now: float) -> str | None:
        """The endpoint the session is bound to, if the binding is still alive."""
        got = self._sessions.get(h)
        if got is None or now - got[1] > self.spec.ttl_s:
            return None
        return got[0]

    def bind(self, h: int, endpoint: str, now: float) -> None:
        sessions = self._sessions
        while sessions:  # expire idle bindings, oldest use first
            _, (_, last) = next(iter(sessions.items()))
            if now - last <= self.spec.ttl_s:
                break
            sessions.popitem(last=False)
        sessions[h] = (endpoint, now)
        sessions.move_to_end(h)
        while len(sessions) > self.max_sessions:
            sessions.popitem(last=False)

    def endpoint_removed(self, key: str) -> None:
        for h in [h for h, (ep, _) in self._sessions.items() if ep == key]:
            del self._sessions[h]

    def stored(self) -> list[tuple[int, str]]:
        """(hash, endpoint) pairs, for tests and introspection: the session keys themselves are never kept."""
        return [(h, ep) for h, (ep, _) in self._sessions.items()]
