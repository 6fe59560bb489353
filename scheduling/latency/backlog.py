"""The prefill backlog of each endpoint as one fluid queue fed by this process and its peers.

Every process that routes to an endpoint adds the prefill tokens it sends there; the engine works the queue off at
one rate, whoever sent the tokens. So the backlog is kept per endpoint as a total that drains at `rate` tokens per
second, with the share of each contributor ("" for this process, else a peer) draining in proportion: between two
updates every share shrinks by the same factor, total(t) / total(t0). Then the total is right whatever the mix (two
replicas each sending 1,000 tokens make 2,000 tokens draining at the engine's rate, not two queues draining twice as
fast), and a peer's share is replaced whole when its next absolute snapshot arrives, or dropped when it expires.

Reading the total costs what the single-process model cost: one dict lookup and a subtraction. A scorer that reads
every endpoint's total in one pass takes `queues()` (endpoint -> Queue, read-only) and computes
`max(0, q.total - (now - q.since) * rate)` inline, as `total` does, instead of a method call per endpoint.
"""

from __future__ import annotations

from collections.abc import Callable, KeysView, Mapping

LOCAL = ""
MAX_TOKENS = 1e12  # anything larger from a peer is nonsense, not a backlog


class Queue:
    __slots__ = ("total", "since", "shares")

    def __init__(self, now: float) -> None:
        self.total = 0.0
        self.since = now
        self.shares: dict[str, float] = {}  # contributor -> tokens as of `since`


Rate = Callable[[str], float]  # endpoint key -> tokens worked off per second


class SharedBacklog:
    def __init__(self) -> None:
        self._queues: dict[str, Queue] = {}
        self._by_peer: dict[str, set[str]] = {}  # peer -> endpoints it has a share in

    def queues(self) -> Mapping[str, Queue]:
        """Endpoint -> its queue (`total` tokens as of `since`), for readers of many endpoints. Read-only."""
        return self._queues

    def total(self, key: str, now: float, rate: float) -> float:
        """Tokens queued on `key` at `now`, from every contributor."""
        q = self._queues.get(key)
        if q is None:
            return 0.0
        return max(0.0, q.total - (now - q.since) * rate)

    def _settle(self, key: str, now: float, rate: float) -> Queue:
        """The endpoint's queue brought forward to `now` (created when absent)."""
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = Queue(now)
            return q
        if now > q.since:
            left = max(0.0, q.total - (now - q.since) * rate)
            if left < q.total:
                f = left / q.total
                for c in q.shares:
                    q.shares[c] *= f
            q.total = left
            q.since = now
        return q

    def add(self, key: str, tokens: float, now: float, rate: float) -> None:
        """This process sent `tokens` more prefill tokens to `key`."""
        q = self._settle(key, now, rate)
        q.shares[LOCAL] = q.shares.get(LOCAL, 0.0) + tokens
        q.total += tokens

    def own(self, now: float, rate: Rate) -> dict[str, float]:
        """This process's share per endpoint at `now` (endpoints where it is positive)."""
        out: dict[str, float] = {}
        for key, q in self._queues.items():
            mine = q.shares.get(LOCAL)
            if mine:
                r = rate(key)
                left = max(0.0, q.total - (now - q.since) * r)
                if left > 0.0:
                    out[key] = mine * left / q.total
        return out

    def set_peer(self, peer: str, values: Mapping[str, float] | None, now: float, rate: Rate) -> None:
        """Replace `peer`'s shares with its latest absolute values (None: the peer is gone)."""
        old = self._by_peer.pop(peer, set())
        new = {k: float(v) for k, v in (values or {}).items() if 0.0 < v < MAX_TOKENS}
        for key in old | new.keys():
            q = self._settle(key, now, rate(key))
            before = q.shares.pop(peer, 0.0)
            after = new.get(key, 0.0)
            if after:
                q.shares[peer] = after
            q.total = max(0.0, q.total - before + after)
            if not q.shares:
                del self._queues[key]
        if new:
            self._by_peer[peer] = set(new)

    def drop_drained(self, now: float, rate: Rate) -> int:
        """Drop the queues of this process alone that have drained by `now` (returns how many). Reading an absent
        queue gives what reading a drained one does (0 tokens), so nothing anyone reads changes; a reader of
        every endpoint then takes its short path for them. Queues with a peer's share stay (set_peer owns them)."""
        queues = self._queues
        gone = [
            key for key, q in queues.items()
            if not q.shares.keys() - {LOCAL} and q.total - (now - q.since) * rate(key) <= 0.0
        ]
        for key in gone:
            del queues[key]
        return len(gone)

    def forget(self, key: str) -> None:
        """The endpoint left: every share in it goes."""
        q = self._queues.pop(key, None)
        if q is None:
            return
        for peer in q.shares:
            keys = self._by_peer.get(peer)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_peer[peer]

    def endpoints(self) -> KeysView[str]:
        return self._queues.keys()

    def peers(self) -> list[str]:
        return sorted(self._by_peer)
