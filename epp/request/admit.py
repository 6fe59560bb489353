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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from epp.protocol import Outcome
from scheduling.types import Endpoint, ErrorCode

if TYPE_CHECKING:
    from epp.request.usage import Usage

SHEDDABLE_MESSAGE = "the pool is saturated and the request is sheddable (priority < 0)"


class Hold(Protocol):
    """What an admitted request holds until it ends."""

    def undo(self) -> None:
        """The request never reached an engine: give back what admission took."""
        ...

    def response_headers(self, ex: Any, status: int, served: str | None) -> None: ...
    def response_chunk(self, ex: Any, size: int, end_of_stream: bool) -> None: ...

    def closed(self, ex: Any, usage: Usage | None) -> None:
        """The stream ended; `usage` is the response's token usage when it was seen."""
        ...


Verdict: TypeAlias = "Outcome | Hold | None"


class Admitter(Protocol):
    name: str

    def admit(self, ctx: Any, parsed: dict[str, Any] | None, *,
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

    def admit(self, ctx: Any, parsed: dict[str, Any] | None, *, dry_run: bool = False) -> Verdict:
        priority = ctx.request.priority
        if priority >= 0 or self.admit_fn(priority, ctx.candidates, ctx.now):
            return None
        return refusal(ErrorCode.RESOURCE_EXHAUSTED, SHEDDABLE_MESSAGE)
