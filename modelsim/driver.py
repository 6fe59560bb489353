"""Runs an Engine against the asyncio clock.

Model time = (loop.time() − start) / time_scale. One timer (loop.call_at) is armed for the engine's next
event; each firing advances the engine and hands the events to per-request asyncio queues. Events due
within `coalesce` wall seconds are delivered together to save wake-ups.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from modelsim.engine import Engine, Event, Seq, SimRequest

FinishHook = Callable[[Seq], None]


class EngineDriver:
    def __init__(
        self,
        engine: Engine,
        time_scale: float = 1.0,
        coalesce: float = 0.0005,
        on_finish: FinishHook | None = None,
        on_advance: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.coalesce = coalesce
        self.on_finish = on_finish
        self.on_advance = on_advance
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._sinks: dict[int, asyncio.Queue[Event]] = {}
        self.paused = False
        self.lag_max = 0.0  # worst lateness of a timer firing, wall seconds (CPU starvation shows here)
        self.lag_sum = 0.0
        self.ticks = 0

    def now(self) -> float:
        """Current model time, in seconds."""
        return (self._loop.time() - self._t0) / self.time_scale

    def submit(self, req: SimRequest) -> tuple[Seq, asyncio.Queue[Event]]:
        """Queue a request; returns its Seq and the queue its token/finish events arrive on."""
        seq = self.engine.submit(req, self.now())
        q: asyncio.Queue[Event] = asyncio.Queue()
        self._sinks[id(seq)] = q
        self._after()
        return seq, q

    def cancel(self, seq: Seq) -> None:
        self._sinks.pop(id(seq), None)
        self.engine.cancel(seq, self.now())
        self._after()

    def poke(self) -> None:
        """The engine changed outside submit/cancel (e.g. a cache reset): publish and re-arm the timer."""
        self._after()

    def _tick(self) -> None:
        if self._timer_at is not None:
            lag = self._loop.time() - self._timer_at
            self.lag_max = max(self.lag_max, lag)
            self.lag_sum += lag
            self.ticks += 1
        self._timer = None
        self._timer_at = None
        events = self.engine.advance(self.now() + self.coalesce / self.time_scale)
        sinks = self._sinks
        for ev in events:
            kind, seq, _ = ev
            q = sinks.get(id(seq))
            if kind == "finish":
                sinks.pop(id(seq), None)
                if self.on_finish is not None:
                    self.on_finish(seq)
            if q is not None:
                q.put_nowait(ev)
        self._after()

    def _after(self) -> None:
        if self.on_advance is not None:
            self.on_advance()
        self._rearm()

    def _rearm(self) -> None:
        if self.paused:
            return
        nt = self.engine.next_event_time()
        if nt is None:
            return
        wall = self._t0 + nt * self.time_scale
        if self._timer is not None:
            if self._timer_at is not None and self._timer_at <= wall:
                return
            self._timer.cancel()
        self._timer_at = wall
        self._timer = self._loop.call_at(wall, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
