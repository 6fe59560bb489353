"""Admission gates: what a request must pass between parsing and scheduling (token rate limits, budgets, ...).

A gate looks at the built request (`ShellContext`: the parsed request and, with routes, the route decision) and
answers at once or later:

    gate.check(ctx, parsed) -> None | Outcome | Hold | Awaitable[None | Outcome | Hold]

- None: nothing to hold, go on;
- an `Outcome`: the request is refused (a 429 with its headers); the gates after it are not asked;
- a `Hold`: admitted, with something the request holds until it ends (a rate-limit charge). The director keeps it:
  `undo()` if the request never reaches an engine (scheduling failed after admission), else `done(usage)` exactly
  once when the stream ends, with the response's usage when the response phases carried it (None otherwise).

An awaitable answer (a shared limit asks Redis) makes the director's decision awaitable; the grpc layer awaits it
while still reading the stream, and a client that goes away cancels it (the gate must then hold nothing). A dry run
(explain) passes `dry_run=True`: gates report what they would do and charge nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol, TypeAlias

from epp.protocol import Outcome
from epp.request.usage import Usage


class Hold(Protocol):
    def undo(self) -> None:
        """The request never reached an engine: give back what admission took."""
        ...

    def done(self, usage: Usage | None) -> None:
        """The stream ended; `usage` is the response's token usage when it was seen."""
        ...


Answer: TypeAlias = Outcome | Hold | None


class Gate(Protocol):
    name: str

    def check(self, ctx: Any, parsed: dict[str, Any] | None, *, dry_run: bool = False) -> Answer | Awaitable[Answer]:
        ...
