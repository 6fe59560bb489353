"""One request's ledger of admission charges: the admit stage's own state (epp/request/admit.py).

`admit` asks the admitters in order from `start` and keeps each `Hold` (a rate-limit charge, a budget's); the
first refusal gives back what the earlier ones took and is answered by the caller's `refused` (the exchange
reports it). An admitter that
must ask elsewhere (a shared limit asks Redis) makes the answer awaitable; the admitters after it are asked when
it answers. `undo` gives everything back (the request never reached an engine: refused, failed, or its client
left while it waited); `handed` passes the holds on, once the request is decided, to settle with the response.

A dry run (explain) asks with `dry_run=True` and keeps nothing, so nothing is charged; without `wait`, an admitter
that would have to ask elsewhere is passed over (the synchronous explain).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from epp.protocol import Outcome
from epp.request.admit import Admitter, Hold, Verdict

log = logging.getLogger("epp.director")

Refusal = Outcome | None


class Ledger:
    __slots__ = ("holds", "dry_run", "wait")

    def __init__(self, *, dry_run: bool = False, wait: bool = True) -> None:
        self.holds: list[Hold] = []
        self.dry_run = dry_run
        self.wait = wait

    def admit(self, admitters: Sequence[Admitter], ctx: Any, parsed: dict[str, Any] | None,
              refused: Callable[[Outcome], Outcome], start: int = 0) -> Refusal | Awaitable[Refusal]:
        """None: admitted by every admitter; a refusal (what was taken is given back), as `refused` answers it; an
        awaitable of either. An admitter's exception propagates (after giving back what was taken)."""
        dry = self.dry_run
        for i in range(start, len(admitters)):
            try:
                verdict = admitters[i].admit(ctx, parsed, dry_run=True) if dry else admitters[i].admit(ctx, parsed)
            except Exception:
                self.undo()
                raise
            if inspect.isawaitable(verdict):
                if self.wait:
                    return self._later(verdict, admitters, ctx, parsed, refused, i)
                close = getattr(verdict, "close", None)
                if close is not None:
                    close()  # a coroutine never awaited: close it quietly
                continue
            if verdict is not None:
                refusal = self.keep(verdict)
                if refusal is not None:
                    return refused(refusal)
        return None

    async def _later(self, pending: Awaitable[Verdict], admitters: Sequence[Admitter], ctx: Any,
                     parsed: dict[str, Any] | None, refused: Callable[[Outcome], Outcome], i: int) -> Refusal:
        try:
            verdict = await pending
        except Exception:
            self.undo()
            raise
        if verdict is not None:
            refusal = self.keep(verdict)
            if refusal is not None:
                return refused(refusal)
        rest = self.admit(admitters, ctx, parsed, refused, i + 1)
        return await rest if inspect.isawaitable(rest) else rest

    def keep(self, verdict: Outcome | Hold) -> Outcome | None:
        """Keep an admitter's hold (nothing in a dry run); a refusal gives back what was taken and is returned."""
        if isinstance(verdict, Outcome):
            self.undo()
            return verdict
        if not self.dry_run:
            self.holds.append(verdict)
        return None

    def undo(self) -> None:
        """The request never reaches an engine: give back everything held (once)."""
        holds, self.holds = self.holds, []
        for hold in holds:
            try:
                hold.undo()
            except Exception:
                log.exception("undoing an admission hold failed")

    def handed(self) -> list[Hold]:
        """The request is decided: its holds now follow the response (they settle when the stream ends)."""
        holds, self.holds = self.holds, []
        return holds
