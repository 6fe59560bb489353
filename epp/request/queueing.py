"""One request's turn in flow control's queue (epp/flowcontrol): the queue stage's own state.

`enter` asks the flow controller with the request's flow (its fairness id: the tenant's header, or within it the
agent session's or program's with `--flow-fairness-key`): None (go now), the refusal (the queue is at capacity) or
a future, which the request waits on. The controller calls `turn` when the request's turn comes (the exchange
schedules and commits it there); `left` is told how the wait ended: the evicting reply (TTL, shutdown; it carries
`x-llm-d-request-dropped-reason`), else None (routed, or cancelled because the client went away: the controller
took the request out at once).

A dry run (explain) asks `preview` instead: nothing is queued or counted, and `why` says why a real request would
wait ("" when it would go at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from epp.flowcontrol import DROPPED_REASON, fairness_id
from epp.protocol import Outcome

if TYPE_CHECKING:
    from epp.flowcontrol import FlowController
    from epp.request.context import ShellContext
    from epp.request.sessions import SessionIdentity


class QueueTurn:
    __slots__ = ("flow", "why", "left")

    def __init__(self, flow: FlowController) -> None:
        self.flow = flow
        self.why = ""  # a dry run: why a real request would wait ("": it would go at once)
        self.left: Callable[[Outcome | None], None] | None = None

    def enter(self, headers: Mapping[str, str], sessions: SessionIdentity | None, ctx: ShellContext, size: int,
              turn: Callable[[], Outcome], left: Callable[[Outcome | None], None]
              ) -> Outcome | asyncio.Future[Outcome] | None:
        fid = fairness_id(headers)
        if sessions is not None:  # per session or program when configured (--flow-fairness-key)
            fid = sessions.fairness_id(ctx.request, fid)
        waiting = self.flow.admit(ctx.pool, fid, ctx.request, size, turn)
        if isinstance(waiting, asyncio.Future):
            self.left = left
            waiting.add_done_callback(self._done)  # (run before the transport resumes: callbacks run in order)
        return waiting

    def preview(self, ctx: ShellContext, size: int) -> Outcome | None:
        """What `enter` would answer, changing nothing; a request that would wait goes on (`why` says why)."""
        answer = self.flow.preview(ctx.pool, ctx.request, size)
        if isinstance(answer, str):
            self.why = answer
            return None
        return answer

    def _done(self, waiting: asyncio.Future[Outcome]) -> None:
        assert self.left is not None
        if waiting.cancelled():
            self.left(None)
            return
        outcome = waiting.result()
        evicted = any(name == DROPPED_REASON for name, _ in outcome.reject_headers or ())
        self.left(outcome if evicted else None)
