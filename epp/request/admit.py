"""Admission: one interface for everything that may hold a request back before it is scheduled.

An admitter looks at the resolved request (`ShellContext`: the parsed request, its candidates and, with routes, the
route decision) and answers at once or later:

    admitter.admit(ctx, parsed, dry_run=False) -> None | Outcome | Hold | Awaitable[None | Outcome | Hold]

- None: nothing to hold, go on;
- an `Outcome`: the request is refused (429 with its headers); the admitters after it are not asked;
- a `Hold`: admitted, with something the request holds until it ends (a rate-limit charge). The exchange keeps
  it: `undo()` if the request never reaches an engine (refused or failed after admission), else it is told
  `closed(exchange, usage)` exactly once when the stream ends, like any follow (epp/request/observe.py).

The admitters, in the order the exchange asks them: sheddable saturation (`SheddableAdmitter`, below), token rate
limits (epp/ratelimit/gate.py), budgets (epp/ratelimit/budgets.py). Flow control is the queue stage after them
(epp/flowcontrol): it either lets the request go now, refuses it, or holds it until capacity frees.

An awaitable answer (a shared limit asks Redis) makes the decision awaitable; the transport awaits it while still
reading the stream, and a client that goes away cancels it (the admitter must then hold nothing). A dry run
(explain) passes `dry_run=True`: admitters report what they would do and charge nothing.

`Ledger` is one request's ledger of admission charges, the admit stage's own state: it asks the admitters in order
and keeps each `Hold`; the first refusal gives back what the earlier ones took and is answered by the caller's
`refused` (the exchange reports it). An admitter that must ask elsewhere makes the answer awaitable; the admitters
after it are asked when it answers. `undo` gives everything back (the request never reached an engine: refused,
failed, or its client left while it waited); `handed` passes the holds on, once the request is decided, to settle
with the response. In a dry run it asks with `dry_run=True` and keeps nothing; without `wait`, an admitter that would
have to ask elsewhere is passed over (the synchronous explain).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from epp.protocol import Outcome
from scheduling.types import Endpoint, ErrorCode

if TYPE_CHECKING:
    from epp.request.context import ShellContext
    from epp.request.exchange import RequestExchange
    from epp.request.usage import Usage

log = logging.getLogger("epp.director")

SHEDDABLE_MESSAGE = "the pool is saturated and the request is sheddable (priority < 0)"


class Hold(Protocol):
    """What an admitted request holds until it ends."""

    def undo(self) -> None:
        """The request never reached an engine: give back what admission took."""
        ...

    def response_headers(self, ex: RequestExchange, status: int, served: str | None) -> None: ...
    def response_chunk(self, ex: RequestExchange, size: int, end_of_stream: bool) -> None: ...

    def closed(self, ex: RequestExchange, usage: Usage | None) -> None:
        """The stream ended; `usage` is the response's token usage when it was seen."""
        ...


Verdict: TypeAlias = "Outcome | Hold | None"


class Admitter(Protocol):
    name: str

    def admit(self, ctx: ShellContext, parsed: dict[str, Any] | None, *,
              dry_run: bool = False) -> Verdict | Awaitable[Verdict]: ...


def refusal(code: ErrorCode, message: str) -> Outcome:
    return Outcome(reject_status=code.http_status, reject_body=f"inference error: {code.value} - {message}")


class SheddableAdmitter:
    """GIE's saturation admission: a sheddable request (priority < 0) is refused while the pool is saturated.

    `admit_fn(priority, candidates, now)` is the current saturation detector's `admit` (epp/fleet/saturation.py);
    every request with priority >= 0 passes without a look."""

    name = "sheddable-saturation"
    __slots__ = ("admit_fn",)

    def __init__(self, admit_fn: Callable[[int, Iterable[Endpoint], float], bool]) -> None:
        self.admit_fn = admit_fn

    def admit(self, ctx: ShellContext, parsed: dict[str, Any] | None, *, dry_run: bool = False) -> Verdict:
        priority = ctx.request.priority
        if priority >= 0 or self.admit_fn(priority, ctx.candidates, ctx.now):
            return None
        return refusal(ErrorCode.RESOURCE_EXHAUSTED, SHEDDABLE_MESSAGE)


Refusal = Outcome | None


class Ledger:
    __slots__ = ("holds", "dry_run", "wait")

    def __init__(self, dry_run: bool = False, wait: bool = True) -> None:
        self.holds: list[Hold] = []
        self.dry_run = dry_run
        self.wait = wait

    def admit(self, admitters: Sequence[Admitter], ctx: ShellContext, parsed: dict[str, Any] | None,
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

    async def _later(self, pending: Awaitable[Verdict], admitters: Sequence[Admitter], ctx: ShellContext,
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
