"""The warm board: the KV each endpoint holds for sessions whose next turn is expected soon.

The session scorer (agent-session-scorer) protects a session's context on its endpoint when a turn ends, until the
next turn is due (a learnt gap times a factor), and releases it when the next turn starts (its KV is in use again),
when the session goes quiet (the protection runs out), or when the endpoint leaves. The estimated-latency scorer
reads `current(now)` in its eviction price: evicting protected tokens costs `weight` times their prefill on top of
what any eviction costs, since the session's next turn will recompute them for certain.

One board per loaded scheduler (`warm_board(build)`), shared by the plugins that write and read it; empty when no
session plugin is configured, so the eviction price is unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

WARM = "sessions.warm-board"  # BuildContext.shared key


class WarmBoard:
    def __init__(self) -> None:
        self.weight = 1.0  # extra prefill multiples a protected token's eviction costs (set by the writer)
        self.tokens: dict[str, float] = {}  # endpoint -> protected prompt tokens
        self._by_key: dict[int, tuple[str, float, float]] = {}  # session key -> (endpoint, tokens, until)
        self._heap: list[tuple[float, int]] = []  # (until, session key); stale entries are skipped
        self._next = float("inf")  # the earliest `until` in the heap

    def __len__(self) -> int:
        return len(self._by_key)

    def protect(self, key: int, endpoint: str, tokens: float, until: float) -> None:
        self.release(key)
        if tokens <= 0:
            return
        self._by_key[key] = (endpoint, tokens, until)
        self.tokens[endpoint] = self.tokens.get(endpoint, 0.0) + tokens
        heap = self._heap
        heapq.heappush(heap, (until, key))
        if until < self._next:
            self._next = until
        if len(heap) > 2 * len(self._by_key) + 64:  # many stale entries: rebuild from the live ones
            self._heap = [(u, k) for k, (_, _, u) in self._by_key.items()]
            heapq.heapify(self._heap)

    def release(self, key: int) -> None:
        got = self._by_key.pop(key, None)
        if got is None:
            return
        ep, tokens, _ = got
        left = self.tokens.get(ep, 0.0) - tokens
        if left > 0.5:
            self.tokens[ep] = left
        else:
            self.tokens.pop(ep, None)

    def current(self, now: float) -> Mapping[str, float]:
        """Endpoint -> protected tokens as of `now` (expired protections released first). Read-only."""
        if now >= self._next:
            heap = self._heap
            while heap and heap[0][0] <= now:
                until, key = heapq.heappop(heap)
                got = self._by_key.get(key)
                if got is not None and got[2] == until:
                    self.release(key)
            self._next = heap[0][0] if heap else float("inf")
        return self.tokens

    def until(self, key: int) -> float | None:
        got = self._by_key.get(key)
        return got[2] if got is not None else None

    def forget(self, endpoint: str) -> None:
        for key in [k for k, (ep, _, _) in self._by_key.items() if ep == endpoint]:
            del self._by_key[key]
        self.tokens.pop(endpoint, None)

    def endpoints(self) -> set[str]:
        return set(self.tokens)


def warm_board(shared: dict[Any, Any]) -> WarmBoard:
    """The board of one loaded scheduler (`BuildContext.shared`), created by whichever plugin asks first."""
    board = shared.get(WARM)
    if not isinstance(board, WarmBoard):
        board = shared[WARM] = WarmBoard()
    return board
