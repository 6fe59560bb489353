"""Class-aware dispatch: loose requests held back while the endpoint they would take has tight work pending.

The policy is the core's (scheduling/latency/hold.py): a request placed as `loose` whose pick is busy (a tight
request sent there has not had its first token yet, or sloHoldShare × maxNumSeqs requests are in flight there)
waits, at most its budget (its TTFT objective × sloHeadroom − its predicted TTFT), and is then scheduled afresh and
sent; it is never held twice. `SloHolds` is the shell's side:

- a request observer (epp/request/observe.py): a committed request placed as tight counts as pending on its
  endpoint until its first response body chunk (seen with Envoy's response phases), the end of its stream, or its
  predicted TTFT after the decision, whichever comes first;
- `hold(key, verdict, budget, go, left)`: the exchange's schedule stage asks it to hold a loose request whose pick
  is busy (`busy`). It answers a future and sets one timer, at the deadline or, when tight work is pending, at
  its predicted start. The request goes (`go()`: the exchange schedules and commits it afresh; its outcome
  resolves the future) when its pick is no longer busy (`released`: tight work started there, or a request there
  ended: `freed`, which the exchange's release calls), oldest first, at the deadline (`deadline`), or when
  Pointsman shuts down (`shutdown`). A client that leaves cancels the
  future: the request is taken out at once (`cancelled`) and `left()` gives back what admission charged.
- `outcomes` counts how each hold ended, exactly; the metrics get the time held by outcome and the number held
  now. Nothing is created for a request that is not held (no future, no timer, no task).

Each Pointsman replica holds for itself and counts only the tight requests it sent (like flow control's queues).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from epp.protocol import Outcome
from scheduling.latency import SloVerdict, TightWork, busy, decision_slo, is_tight

log = logging.getLogger(__name__)

RELEASED, DEADLINE, CANCELLED, SHUTDOWN = "released", "deadline", "cancelled", "shutdown"


class HoldMetrics(Protocol):
    """What the holds report (epp.api.SloMetrics implements it)."""

    def held(self, outcome: str, seconds: float) -> None: ...
    def holding(self, count: int) -> None: ...


class _Held:
    __slots__ = ("key", "verdict", "since", "deadline", "go", "left", "waiter", "timer")

    def __init__(self, key: str, verdict: SloVerdict, since: float, deadline: float, go: Callable[[], Outcome],
                 left: Callable[[], None], waiter: asyncio.Future[Outcome]) -> None:
        self.key, self.verdict, self.since, self.deadline = key, verdict, since, deadline
        self.go, self.left, self.waiter = go, left, waiter
        self.timer: asyncio.TimerHandle | None = None


class _TightFollow:
    """One tight request's response: its first body chunk (or its end) starts its endpoint's tight work."""

    __slots__ = ("holds", "key", "request")

    def __init__(self, holds: SloHolds, key: str, request: int) -> None:
        self.holds: SloHolds | None = holds
        self.key, self.request = key, request

    def _started(self) -> None:
        holds, self.holds = self.holds, None
        if holds is not None:
            holds.started(self.key, self.request)

    def response_headers(self, ex: Any, status: int, served: str | None) -> None:
        pass

    def response_chunk(self, ex: Any, size: int, end_of_stream: bool) -> None:
        if size > 0 or end_of_stream:
            self._started()

    def closed(self, ex: Any, usage: Any) -> None:
        self._started()


class SloHolds:
    """The loose requests held back, by the endpoint whose tight work they wait for (see the module docstring)."""

    def __init__(self, inflight: Callable[[str], int], metrics: HoldMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inflight = inflight  # endpoint key -> requests in flight there (the datastore's exact counts)
        self.metrics = metrics
        self.clock = clock
        self.tight = TightWork()
        self.outcomes: Counter[str] = Counter()  # how holds ended (exact)
        self._held: dict[str, dict[int, _Held]] = {}  # endpoint key -> held requests, in arrival order
        self.releasing = False  # a released request is being scheduled afresh (it is not held again)
        self._count = 0
        self._seq = 0

    # ---- the request observer: tight work per endpoint -----------------------------------------------------------
    def decided(self, ex: Any) -> _TightFollow | None:
        result = ex.result
        verdict = decision_slo(result.state) if result is not None else None
        if result is None or verdict is None or not is_tight(verdict):
            return None
        key = result.primary.key
        predicted = verdict.predicted.get(key)
        self._seq += 1
        self.tight.sent(key, self._seq, self.clock() + (predicted[0] if predicted is not None else 0.0))
        return _TightFollow(self, key, self._seq)

    def rejected(self, ex: Any, code: str) -> None:
        pass

    def busy(self, key: str, verdict: SloVerdict) -> bool:
        """Whether a loose request with `verdict` picked onto `key` waits (scheduling/latency/hold.py)."""
        return busy(verdict, self.tight.busy(key, self.clock()), self.inflight(key))

    def started(self, key: str, request: int) -> None:
        """A tight request on `key` had its first token (or ended)."""
        self.tight.started(key, request)
        self.freed(key)

    def freed(self, key: str) -> None:
        """`key` may no longer be busy (its tight work started, a request there ended): the requests held for it
        go, oldest first, while it is not."""
        held = self._held.get(key)
        while held:
            seq, h = next(iter(held.items()))
            if self.busy(key, h.verdict):
                return
            self._take(h, seq)
            self._release(h, RELEASED)
            held = self._held.get(key)

    @property
    def count(self) -> int:
        """Requests held now."""
        return self._count

    # ---- the exchange's side ----------------------------------------------------------------------------------
    def hold(self, key: str, verdict: SloVerdict, budget: float, go: Callable[[], Outcome],
             left: Callable[[], None]) -> asyncio.Future[Outcome]:
        """Hold a loose request picked onto `key` (busy) for at most `budget` seconds: a future that resolves to
        `go()`'s outcome when it is released. Cancelling the future takes the request out (then `left()`)."""
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        now = self.clock()
        h = _Held(key, verdict, now, now + budget, go, left, waiter)
        self._seq += 1
        seq = self._seq
        self._held.setdefault(key, {})[seq] = h
        self._changed(1)
        self._arm(h, seq, now)
        waiter.add_done_callback(lambda fut: self._settled(h, seq, fut))
        return waiter

    def _arm(self, h: _Held, seq: int, now: float) -> None:
        """Wake `h` at its deadline, or sooner when the tight work pending on its pick is expected to start."""
        at = self.tight.until(h.key)
        at = h.deadline if at is None or at <= now else min(at, h.deadline)
        h.timer = asyncio.get_running_loop().call_later(max(0.0, at - now), self._wake, h, seq)

    def _wake(self, h: _Held, seq: int) -> None:
        self.freed(h.key)  # (its pick's tight work may be due to have started)
        if seq not in self._held.get(h.key, {}):
            return
        now = self.clock()
        if now >= h.deadline:
            self._take(h, seq)
            self._release(h, DEADLINE)
        else:
            self._arm(h, seq, now)

    def _take(self, h: _Held, seq: int) -> bool:
        """Take `h` out of its endpoint's list; False when it is no longer held."""
        held = self._held.get(h.key)
        if held is None or held.pop(seq, None) is None:
            return False
        if not held:
            del self._held[h.key]
        return True

    def _release(self, h: _Held, outcome: str) -> None:
        """`h` leaves the hold (already taken out of its list): count it, then send it (unless its client left)."""
        if h.timer is not None:
            h.timer.cancel()
        self._changed(-1)
        waiter = h.waiter
        if waiter.done():  # the client went away and its callback has not run yet
            self._gone(h)
            return
        self._count_outcome(outcome, h)
        self.releasing = True
        try:
            outcome_ = h.go()
        except Exception as exc:  # never strand a held request: a bug becomes its 500
            log.exception("sending a held request failed")
            outcome_ = Outcome(reject_status=500, reject_body=f"inference error: Internal - dispatch failed: {exc}")
        finally:
            self.releasing = False
        waiter.set_result(outcome_)

    def _settled(self, h: _Held, seq: int, waiter: asyncio.Future[Outcome]) -> None:
        """The waiter is done: when it was cancelled (the client left) while held, take the request out now."""
        if not waiter.cancelled() or not self._take(h, seq):
            return
        if h.timer is not None:
            h.timer.cancel()
        self._changed(-1)
        self._gone(h)

    def _gone(self, h: _Held) -> None:
        self._count_outcome(CANCELLED, h)
        try:
            h.left()
        except Exception:
            log.exception("giving back a held request's admission failed")

    def close(self) -> None:
        """Shutdown: every held request goes now."""
        held, self._held = self._held, {}
        for requests in held.values():
            for h in requests.values():
                self._release(h, SHUTDOWN)

    def _changed(self, delta: int) -> None:
        self._count += delta
        if self.metrics is not None:
            self.metrics.holding(self._count)

    def _count_outcome(self, outcome: str, h: _Held) -> None:
        self.outcomes[outcome] += 1
        if self.metrics is not None:
            self.metrics.held(outcome, max(0.0, self.clock() - h.since))
