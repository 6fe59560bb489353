"""One request's hold for tight work (epp/flowcontrol/hold.py): the schedule stage's last step.

`hold(ex)`: a request the scheduler placed as `loose` whose pick is busy (tight work waiting for its first token
there, or sloHoldShare × maxNumSeqs requests in flight; scheduling/latency/hold.py) waits, at most its budget: the
answer is the holds' future, which resolves to the outcome of its turn (`ex.turn`: scheduled afresh and committed)
and which a client going away cancels (what admission charged is then given back). A request is held at most
once, and not after it waited in flow control's queue: it has waited. Anything else goes on at once (no future,
no timer). `why(ex)` says why a request would be held ("" if not), changing nothing: explain's dry run shows it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from epp.protocol import Outcome
from scheduling.latency import decision_slo, hold_budget

if TYPE_CHECKING:
    from epp.request.exchange import RequestExchange


def _busy(ex: RequestExchange) -> tuple[str, float] | None:
    """(its pick, its budget) when the request would be held now, else None."""
    holds, result = ex.d.holds, ex.result
    if holds is None or result is None:
        return None
    key, verdict = result.primary.key, decision_slo(result.state)
    budget = hold_budget(verdict, key)
    if budget <= 0.0 or verdict is None or not holds.busy(key, verdict):
        return None
    return key, budget


def why(ex: RequestExchange) -> str:
    """Why the request would be held now ("": it would go at once)."""
    busy = _busy(ex)
    if busy is None or ex.d.holds is None:
        return ""
    key, budget = busy
    return (f"held as loose: {key} is busy (tight work waiting for its first token, or {ex.d.holds.inflight(key)} "
            f"requests in flight); it goes when it is not, at most in {budget * 1000:.0f} ms")


def hold(ex: RequestExchange) -> asyncio.Future[Outcome] | None:
    """The holds' future when the request is held, else None (go on)."""
    holds = ex.d.holds
    if holds is None or ex.dry_run or holds.releasing or (ex.queue is not None and ex.queue.left is not None):
        return None  # (released now, or it waited in flow control's queue: it goes)
    busy = _busy(ex)
    if busy is None:
        return None
    key, budget = busy
    verdict = decision_slo(ex.result.state) if ex.result is not None else None
    assert verdict is not None
    return holds.hold(key, verdict, budget, ex.turn, ex.ledger.undo)
