"""The dashboard's record of routing decisions, fed from the request path as a request observer.

Cost model (epp/request/observe.py): `decided` runs once per committed decision and returns the record's follow,
whose `closed` runs once when that stream ends; `rejected` runs on the error path. Each does a few attribute writes, counter increments and at most one deque append:
no formatting, no dict building, no copies. Per-plugin scores are not copied either: a record keeps references
to the lists the profile run computed anyway (`ProfileResult.scored` / `score_totals`, `PluginDetail.values`),
so every decision keeps its scores without turning on explain detail. Turning records into rows happens only
when the page asks (epp.api.dashboard.views). The ring keeps the last `capacity` decisions; older ones are dropped.

Cumulative counters (decisions, prefix blocks, errors by code, engine-reported cached tokens, TTFT samples) are
read once a second by the sampler (epp.api.dashboard.series), which turns them into rates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from scheduling.api import ProfileResult, SchedulingResult
from scheduling.plugins.scorers.agent_session import SessionNote, session_note
from scheduling.prefix import decision_matches
from scheduling.types import Endpoint, LLMRequest

if TYPE_CHECKING:
    from epp.request import RequestExchange, Usage

TTFT_SAMPLES_PER_TICK = 256  # per endpoint, between two sampler ticks


class DecisionRecord:
    """One decision (or rejection) as the page shows it. Times are the director's clock (monotonic seconds)."""

    __slots__ = ("seq", "started", "decided", "request_id", "model", "target", "priority", "profile", "decision",
                 "targets", "prefill", "runs", "candidates", "prefix_matched", "prefix_total", "error",
                 "status", "first_byte", "ended", "ttft", "prompt_tokens", "completion_tokens", "cached_tokens",
                 "receipt", "pool", "candidate_list", "trace_id", "shadow", "session")

    def __init__(self, seq: int, started: float, decided: float, request_id: str, model: str, target: str) -> None:
        self.seq = seq
        self.started = started
        self.decided = decided
        self.request_id = request_id
        self.model = model
        self.target = target
        self.priority = 0
        self.profile = ""
        self.decision = ""
        self.targets: list[Endpoint] = []
        self.prefill: Endpoint | None = None
        self.runs: Mapping[str, ProfileResult] = {}
        self.candidates = 0
        self.prefix_matched = 0
        self.prefix_total = 0
        self.error = ""  # the inference error code of a rejected request
        self.status = ""  # the upstream :status, when the response path reports it
        self.first_byte = 0.0  # when the first response body chunk passed (0: not seen)
        self.ended = 0.0  # when the stream ended (0: still in flight)
        self.ttft: float | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        # The receipt (epp/observe/receipts.py): the decision id's number, and what the decision was made over.
        self.receipt = 0
        self.pool = ""
        self.candidate_list: Sequence[Endpoint] = ()  # the candidates, by reference (the context's own list)
        self.trace_id = ""  # the sampled trace's id, when traced
        self.shadow = ""  # the shadow profile's pick, when a shadow ran on this request (epp/observe/shadow.py)
        self.session: SessionNote | None = None  # the agent session: its turn, and why it stayed or moved

    @property
    def endpoint(self) -> str:
        return self.targets[0].key if self.targets else ""


class DecisionRecorder:
    """`capacity` decisions are kept (the receipts' count window); `max_age` seconds (0: no limit) is their age
    window: older records are dropped as new ones come, and never found."""

    def __init__(self, capacity: int = 500, max_age: float = 0.0) -> None:
        if capacity < 1:
            raise ValueError("the decision ring needs room for at least one decision")
        self.capacity = capacity
        self.max_age = max_age
        self.ring: deque[DecisionRecord] = deque(maxlen=capacity)
        self.seq = 0
        # Cumulative counters, read by the sampler.
        self.decisions = 0
        self.rejections = 0
        self.prefix_matched = 0
        self.prefix_total = 0
        self.engine_prompt_tokens = 0
        self.engine_cached_tokens = 0
        self.errors: dict[str, int] = {}  # inference error code or "HTTP <status>" -> count
        self.ttft: dict[str, list[float]] = {}  # endpoint key -> TTFT samples since the sampler took them

    # ---- the record (hot path; RecorderObserver below feeds it) ------------------------------------------
    def decided(
        self, req: LLMRequest, candidates: int, result: SchedulingResult, started: float, now: float
    ) -> DecisionRecord:
        self.seq = seq = self.seq + 1
        self.decisions += 1
        rec = DecisionRecord(seq, started, now, req.request_id, req.model, req.target_model)
        rec.priority = req.priority
        rec.profile = result.profile
        rec.decision = result.decision
        rec.targets = result.targets
        rec.prefill = result.prefill
        rec.runs = result.profile_results
        rec.candidates = candidates
        if req.session is not None:
            rec.session = session_note(result.state)
        got = decision_matches(result.state)
        if got is not None and got[1]:
            rec.prefix_matched = matched = got[0].get(result.targets[0].key, 0)
            rec.prefix_total = got[1]
            self.prefix_matched += matched
            self.prefix_total += got[1]
        self._append(rec, now)
        return rec

    def _append(self, rec: DecisionRecord, now: float) -> None:
        ring = self.ring
        if self.max_age and ring and ring[0].decided < now - self.max_age:
            limit = now - self.max_age
            while ring and ring[0].decided < limit:
                ring.popleft()
        ring.append(rec)

    def rejected(self, model: str, target: str, code: str, request_id: str, started: float, now: float
                 ) -> DecisionRecord:
        self.seq = seq = self.seq + 1
        self.rejections += 1
        self.errors[code] = self.errors.get(code, 0) + 1
        rec = DecisionRecord(seq, started, now, request_id, model, target)
        rec.error = code
        rec.ended = now
        self._append(rec, now)
        return rec

    def finished(self, rec: DecisionRecord, now: float, sse: bool, usage: Usage | None = None) -> None:
        """The stream of a committed decision ended. `sse`: the response was an event stream, so the first body
        chunk marks the first token; `usage`: epp.request.usage.Usage when the response reported it."""
        rec.ended = now
        status = rec.status
        if status and status[0] in "45":
            code = "HTTP " + status
            self.errors[code] = self.errors.get(code, 0) + 1
        if sse and rec.first_byte and rec.targets:
            rec.ttft = ttft = rec.first_byte - rec.started
            samples = self.ttft.get(rec.targets[0].key)
            if samples is None:
                self.ttft[rec.targets[0].key] = [ttft]
            elif len(samples) < TTFT_SAMPLES_PER_TICK:
                samples.append(ttft)
        if usage is not None and usage.found:
            rec.prompt_tokens = usage.prompt_tokens
            rec.completion_tokens = usage.completion_tokens
            rec.cached_tokens = usage.cached_tokens
            self.engine_prompt_tokens += usage.prompt_tokens
            self.engine_cached_tokens += usage.cached_tokens

    # ---- readers (the page) ------------------------------------------------------------------------------
    def since(self, seq: int) -> list[DecisionRecord]:
        """Records newer than `seq`, oldest first."""
        out: list[DecisionRecord] = []
        for rec in reversed(self.ring):
            if rec.seq <= seq:
                break
            out.append(rec)
        out.reverse()
        return out

    def get(self, seq: int) -> DecisionRecord | None:
        ring = self.ring
        if not ring or not ring[0].seq <= seq <= ring[-1].seq:
            return None
        rec = ring[seq - ring[0].seq]  # sequence numbers are consecutive inside the ring
        return rec if rec.seq == seq else None

    def find(self, receipt: int, now: float) -> DecisionRecord | None:
        """The record of decision number `receipt` (DecisionIds), if still inside the count and age windows.
        Decision numbers grow along the ring: a binary search."""
        ring = self.ring
        lo, hi = 0, len(ring)
        while lo < hi:
            mid = (lo + hi) // 2
            if ring[mid].receipt < receipt:
                lo = mid + 1
            else:
                hi = mid
        if lo == len(ring) or ring[lo].receipt != receipt:
            return None
        rec = ring[lo]
        return None if self.max_age and rec.decided < now - self.max_age else rec

    def __iter__(self) -> Iterator[DecisionRecord]:
        return iter(self.ring)

    def take_ttft(self) -> dict[str, list[float]]:
        out, self.ttft = self.ttft, {}
        return out


class RecorderObserver:
    """The recorder as a request observer (epp/request/observe.py)."""

    __slots__ = ("recorder",)

    def __init__(self, recorder: DecisionRecorder) -> None:
        self.recorder = recorder

    def decided(self, ex: RequestExchange) -> _Follow | None:
        """A committed decision (None for an external provider: no endpoint, nothing to show)."""
        result, req, ctx = ex.result, ex.request, ex.ctx
        if result is None or req is None or ctx is None:
            return None
        recorder = self.recorder
        rec = recorder.decided(req, len(ctx.candidates), result, ex.started, ex.d.clock())
        rec.receipt = ex.decision
        rec.pool = ctx.pool
        rec.candidate_list = ctx.candidates
        trace = ex.trace
        if trace is not None:
            rec.trace_id = trace.trace_id_hex
        return _Follow(recorder, rec)

    def rejected(self, ex: RequestExchange, code: str) -> None:
        req = ex.request
        rec = self.recorder.rejected(req.model if req else "", req.target_model if req else "", code,
                                     ex.headers.get("x-request-id", ""), ex.started, ex.d.clock())
        rec.receipt = ex.decision
        pending = ex.pending
        if pending is not None:
            rec.pool = pending.pool
            rec.candidate_list = pending.candidates
        trace = ex.trace
        if trace is not None:
            rec.trace_id = trace.trace_id_hex


class _Follow:
    """One record's response path: status, first body byte, the end with usage."""

    __slots__ = ("recorder", "rec")

    def __init__(self, recorder: DecisionRecorder, rec: DecisionRecord) -> None:
        self.recorder = recorder
        self.rec = rec

    def response_headers(self, ex: RequestExchange, status: int, served: str | None) -> None:
        self.rec.status = str(status) if status else ""

    def response_chunk(self, ex: RequestExchange, size: int, end_of_stream: bool) -> None:
        if size and not self.rec.first_byte:
            self.rec.first_byte = ex.d.clock()

    def closed(self, ex: RequestExchange, usage: Usage | None) -> None:
        self.recorder.finished(self.rec, ex.d.clock(), ex.scanner is not None and ex.scanner.sse, usage)
