"""Requests on each engine that Pointsman did not send: traffic that bypasses it, seen through the engines' queues.

The latency model counts an endpoint's requests as n(e) = max(in flight, waiting + running from a fresh scrape).
The maximum hides the bypassing requests whenever Pointsman's own count has caught up with the scrape: an engine
reporting 7 requests while Pointsman had 5 in flight there carries 2 it did not send, and after Pointsman sends two
more the maximum says 7 where 9 are running. So at every scrape the excess is kept as that endpoint's outside load,

    outside(e) = max(0, waiting(e) + running(e) − in flight(e) as the scrape arrives)

and the scoring pass counts n(e) = in flight(e) + outside(e): Pointsman's own picks since the scrape land on top of
the traffic it cannot see, and its own finished requests leave it. Engines report at every scrape (50 ms by
default), so the outside load follows the bypassing traffic within one scrape; an endpoint whose scrapes stop (stale
for `max_age` seconds) or that reports no excess has none. Without traffic that bypasses Pointsman the excess is
zero (or a request or two in the instants when the engine still counts requests Pointsman has seen end) and n(e) is
what it was. Pure: time is passed in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from scheduling.api import NO_LOAD, InflightLoad
from scheduling.types import Endpoint


class OutsideLoad:
    """outside(e) per endpoint, from the scrapes (see the module docstring)."""

    def __init__(self, max_age: float = 2.0) -> None:
        self.max_age = max_age
        self._outside: dict[str, tuple[int, float]] = {}  # endpoint -> (requests it did not send, scrape time)
        self.inflight: Mapping[str, InflightLoad] = {}  # the in-flight view of the latest decision

    def __len__(self) -> int:
        return len(self._outside)

    def get(self, key: str) -> int:
        got = self._outside.get(key)
        return got[0] if got is not None else 0

    def scraped(self, endpoints: Sequence[Endpoint], now: float) -> None:
        """A scrape batch arrived: each fresh endpoint's excess over Pointsman's own in-flight count."""
        out = self._outside
        inflight = self.inflight
        for e in endpoints:
            load = e.metrics.fresh_load
            own = inflight.get(e.key, NO_LOAD).requests
            if load > own:
                out[e.key] = (load - own, now)
            else:
                out.pop(e.key, None)
        if out:
            old = [k for k, (_, at) in out.items() if now - at > self.max_age]
            for k in old:
                del out[k]

    def view(self, inflight: Mapping[str, InflightLoad]) -> Mapping[str, InflightLoad]:
        """`inflight` with the outside load added (itself when there is none); remembers it for the next scrape."""
        self.inflight = inflight
        if not self._outside:
            return inflight
        return WithOutside(inflight, self._outside)

    def forget(self, key: str) -> None:
        self._outside.pop(key, None)


class WithOutside(Mapping[str, InflightLoad]):
    """The in-flight view plus each endpoint's outside requests (what the scoring pass reads as n(e))."""

    __slots__ = ("_inflight", "_outside")

    def __init__(self, inflight: Mapping[str, InflightLoad], outside: Mapping[str, tuple[int, float]]) -> None:
        self._inflight = inflight
        self._outside = outside

    def get(self, key: str, default: InflightLoad | None = None) -> InflightLoad | None:  # type: ignore[override]
        own = self._inflight.get(key)
        extra = self._outside.get(key)
        if extra is None:
            return own if own is not None else default
        base = own if own is not None else NO_LOAD
        return InflightLoad(base.requests + extra[0], base.tokens)

    def __getitem__(self, key: str) -> InflightLoad:
        got = self.get(key)
        if got is None:
            raise KeyError(key)
        return got

    def __iter__(self) -> Iterator[str]:
        yield from self._inflight
        for k in self._outside:
            if k not in self._inflight:
                yield k

    def __len__(self) -> int:
        return len(self._inflight) + sum(1 for k in self._outside if k not in self._inflight)

    def __bool__(self) -> bool:
        return True  # there is outside load (the view is only made when there is)
