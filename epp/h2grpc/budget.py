"""How much work a client may ask of a connection without getting any done: the flood budgets.

Each budget is a few counters, checked in O(1) on the frame that spends it; a spent budget ends the connection
with GOAWAY ENHANCE_YOUR_CALM (the caller raises). The rules and defaults follow Envoy's HTTP/2 codec options
(see epp/h2grpc/limits.py and docs/frontdoor.md).
"""

from __future__ import annotations

from epp.h2grpc.limits import ServerLimits


class Budget:
    __slots__ = ("limits", "streams_opened", "premature", "data_frames_sent", "window_updates", "priority_frames",
                 "empty_run", "_tokens", "_refilled")

    def __init__(self, limits: ServerLimits, now: float) -> None:
        self.limits = limits
        self.streams_opened = 0
        self.premature = 0  # streams reset before any work was answered, refused, or reset for a client's error
        self.data_frames_sent = 0
        self.window_updates = 0
        self.priority_frames = 0
        self.empty_run = 0  # consecutive frames with an empty payload and no END_STREAM
        self._tokens = float(limits.max_control_frames)
        self._refilled = now

    def premature_reset(self) -> str | None:
        """Rapid reset and MadeYouReset (Envoy's rule): past N opened streams, at most half may end this way."""
        self.premature += 1
        opened = self.streams_opened
        if opened >= self.limits.premature_reset_streams and self.premature * 2 > opened:
            return f"{self.premature} of {opened} streams were reset prematurely"
        return None

    def control_frame(self, now: float) -> str | None:
        """PING or SETTINGS: a token bucket."""
        lim = self.limits
        tokens = min(float(lim.max_control_frames),
                     self._tokens + (now - self._refilled) * lim.control_frames_per_second)
        self._refilled = now
        if tokens < 1.0:
            self._tokens = tokens
            return "too many PING and SETTINGS frames"
        self._tokens = tokens - 1.0
        return None

    def window_update(self) -> str | None:
        self.window_updates += 1
        allowed = 5 + 2 * (self.streams_opened + self.limits.max_window_updates_per_data_frame * self.data_frames_sent)
        return "too many WINDOW_UPDATE frames" if self.window_updates > allowed else None

    def priority(self) -> str | None:
        self.priority_frames += 1
        allowed = self.limits.max_priority_frames_per_stream * (1 + self.streams_opened)
        return "too many PRIORITY frames" if self.priority_frames > allowed else None

    def empty_frame(self) -> str | None:
        self.empty_run += 1
        return "too many frames with an empty payload" if self.empty_run > self.limits.max_consecutive_empty_frames \
            else None
