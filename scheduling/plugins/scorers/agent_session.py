"""agent-session-scorer (Pointsman): keep an agent session's turns where its context is, and that context warm.

The shell identifies the session before any hashing (scheduling/sessions/identity.py: a session header, OpenAI's
`user` or `prompt_cache_key`, the Responses API's `previous_response_id`, Anthropic's `metadata.user_id`, a route's
session settings) and hands it over as `LLMRequest.session`. This scorer remembers each session
(scheduling/sessions/table.py) and, next to the estimated-latency scorer (weight 1 each, the built-in default):

    no session                            -> 0 everywhere: the request is placed on predicted latency alone
    a session bound to candidate b        -> b: 1 − 1/moveFactor, others 0
    a new session (or one whose endpoint left) whose program has sessions bound elsewhere
                                          -> the program's homes: 1 − 1/programFactor (3), others 0
So the turn stays on b unless b's predicted latency is more than moveFactor (1.5) times the best candidate's: the
estimated-latency scores are best/cost, so b keeps the lead while best/cost(b) + 1 − 1/moveFactor ≥ 1. It is
LLMKube's move rule (stay unless clearly worse), judged by predicted latency instead of queue lengths. Parallel
calls of one turn (a fan-out) get the same preference: they share the turn's context and are co-located while b's
predicted latency, which counts the calls already sent there, stays within the factor; then they spread, and the
binding stays with the context.

Programs: the sessions of one program share its prompt (system prompt, tools: the same head of the prompt, or the
same program header), as RL rollouts do. A new session joins its program's homes (the endpoints holding most of its
sessions) unless they are predicted more than programFactor times slower, so one program's shared prompt is held
once instead of on every endpoint; when the homes are full, new sessions spread by predicted latency; a program new
to the pool starts where the fewest programs live. With programShare (on) a program gathers on at most its share of
the candidates (round(its share of the bound sessions × candidates), at least one): a program holding every
endpoint's worth (a chat app whose users send OpenAI's `user` is one program) gathers nowhere and is placed on
predicted latency alone, as with programFactor 1; a program holding fewer endpoints than its share grows where the
fewest programs live. programShare false gathers every program on its one home. programSpill (off, 0): when its
homes hold more than programSpill times the mean of the sessions bound per candidate, a program's new sessions go
where the fewest sessions are bound. deploy/profiles/agent-sessions.yaml also sets moveFactor 3 (docs/sessions.md).

A turn whose context is predicted evicted (moveWhenEvicted, off): when this decision's prefix matches (the
estimated-latency scorer's index) say that b holds under half of the previous turn's context, or no more of the
prompt than another candidate, the turn gets no stay preference and goes where predicted latency sends it.

Keeping the context warm: when a turn's last call ends, the session's prompt tokens on b are protected on the warm
board (scheduling/sessions/warm.py) until its next turn is due: warmFactor × the expected pause (the session's own
EWMA, else its program's, else priorGapSeconds), at most maxWarmSeconds. The estimated-latency scorer charges
evicting protected tokens warmWeight × their prefill on top of its eviction price, so other traffic goes where it
evicts nothing that is about to be used. The next turn, the session going quiet, or b leaving releases it.

State is bounded: maxSessions sessions (LRU) idle for at most ttlSeconds, 4096 programs. A departed endpoint is
forgotten by every session (they start over by predicted latency). Replication (bus): each turn's binding and each
protection is a record [endpoint, 16-byte key, age s, turns, gap s or -1, program, tokens, warm s left or -1];
the most recent binding of a session wins, wherever it was made.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, Scorer, register
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State, ZeroScores
from scheduling.framework.replication import Record, drain, is_count
from scheduling.prefix import decision_matches
from scheduling.sessions.table import Session, SessionTable
from scheduling.sessions.warm import warm_board
from scheduling.types import Endpoint, SessionRef

SESSION = "agent-session"  # state key: the SessionView of the decision (explain, pre_request)
NOTE = "agent-session.note"  # state key: the SessionNote of a committed decision
MAX_OUTBOX = 4096
SNAPSHOT = 4096


@dataclass(frozen=True)
class Params:
    moveFactor: float = bounded(1.5, min=1.0)
    programFactor: float = bounded(3.0, min=1.0)
    programShare: bool = True
    programSpill: float = bounded(0.0, min=0.0)
    moveWhenEvicted: bool = False
    ttlSeconds: float = bounded(600.0, min=0.0)
    maxSessions: int = bounded(100_000, min=1)
    gapAlpha: float = bounded(0.3, min=0.0, max=1.0)
    priorGapSeconds: float = bounded(10.0, min=0.0)
    warmFactor: float = bounded(2.0, min=0.0)
    maxWarmSeconds: float = bounded(60.0, min=0.0)
    warmWeight: float = bounded(2.0, min=0.0)


@dataclass(frozen=True, slots=True)
class SessionView:
    """One decision's view of its session (scoring never changes state: explain shows this as a dry run)."""

    ref: SessionRef
    turn: int  # the turn this call belongs to (1 = the first)
    parallel: bool  # a parallel call of a turn in flight (fan-out)
    bound: str | None  # the endpoint holding the session's context, if known
    candidate: bool  # whether that endpoint is a candidate
    bonus: float  # the score the bound endpoint got
    expected_gap: float | None  # the learnt pause between turns (None: no turn ended yet)
    warm_until: float | None = None  # until when its context is protected from eviction (None: not protected)
    home: str | None = None  # a session not bound yet: its program's home, when that is a candidate
    homes: tuple[str, ...] = ()  # ... and the rest of its share of the endpoints (programShare), home first
    spread: tuple[str, ...] = ()  # a new program: the candidates where the fewest programs live
    evicted: bool = False  # the bound endpoint is predicted to hold no more of the prompt than another candidate


@dataclass(frozen=True, slots=True)
class SessionNote:
    """What the committed decision did for its session (the dashboard's decision stream reads it)."""

    session: str  # SessionRef.label
    source: str
    turn: int
    parallel: bool
    why: str  # new session | stayed | moved: ... | a parallel call spread: ...


def session_note(state: Mapping[str, Any]) -> SessionNote | None:
    note = state.get(NOTE)
    return note if isinstance(note, SessionNote) else None


def session_view(state: Mapping[str, Any]) -> SessionView | None:
    view = state.get(SESSION)
    return view if isinstance(view, SessionView) else None


def decision(view: SessionView, result: SchedulingResult) -> str:
    """Why the call went where it went: new, stayed, moved (and why)."""
    if not result.targets:
        return ""
    chosen = result.targets[0].key
    b = view.bound
    if b is None:
        what = "new session" if view.turn == 1 else "placed by predicted latency (its endpoint left)"
        if view.spread and view.home is not None:  # programSpill
            return f"{what}: its program's {view.home} is over its share, placed where the fewest sessions live" \
                if chosen in view.spread else f"{what}: its program's {view.home} is over its share"
        if view.spread:
            return f"{what}: a new program, placed where the fewest programs live" if chosen in view.spread else \
                f"{what}: a new program, placed by predicted latency"
        if view.home is None:
            return what
        if chosen == view.home or chosen in view.homes:
            return f"{what}: joined its program on {chosen}"
        return f"{what}: its program's {view.home} predicted clearly slower"
    if chosen == b:
        return "parallel call co-located" if view.parallel else "stayed"
    if view.evicted:
        return f"moved: its context is predicted evicted from {b}"
    if not view.candidate:
        return f"moved: {b} is not a candidate"
    pr = result.profile_results.get(result.profile) or next(iter(result.profile_results.values()), None)
    totals: dict[str, float] = {}
    if pr is not None and pr.scored is not None and pr.score_totals is not None:
        totals = {e.key: t for e, t in zip(pr.scored, pr.score_totals, strict=False)}
    tb, tc = totals.get(b), totals.get(chosen)
    what = "a parallel call spread" if view.parallel else "moved"
    if tb is not None and tc is not None:
        return f"{what}: {b} predicted clearly slower (score {tb:.2f} against {tc:.2f})"
    return f"{what}: {b} predicted clearly slower"


def context_evicted(bound: str | None, state: State, candidates: Sequence[Endpoint], context: float) -> bool:
    """Whether the prefix index (this decision's matches, when a prefix-aware scorer computed them) predicts that
    `bound` lost most of the session's context: it holds less than half of the share `context` of the prompt that
    the previous turn sent, or no more of the prompt than another candidate."""
    got = decision_matches(state)
    if got is None or bound is None or not got[1]:
        return False
    matches, total = got
    held = matches.get(bound, 0)
    return held < 0.5 * context * total or any(matches.get(e.key, 0) >= held for e in candidates if e.key != bound)


@register("agent-session-scorer")
class AgentSessionScorer(Scorer[Params]):
    Params = Params
    clamped = True

    def setup(self, build: BuildContext) -> None:
        p = self.params
        self.board = warm_board(build.shared)
        self.board.weight = p.warmWeight
        self.table = SessionTable(max_sessions=p.maxSessions, ttl_s=p.ttlSeconds, gap_alpha=p.gapAlpha,
                                  on_drop=self.board.release)
        self.bonus = 1.0 - 1.0 / p.moveFactor
        self.program_bonus = 1.0 - 1.0 / p.programFactor
        self._zeros = ZeroScores()
        self._outbox: deque[tuple[Record, float]] | None = None  # (record as of its time, that time)

    def _zero(self, n: int) -> ZeroScores:
        z = self._zeros
        if len(z) != n:
            z = self._zeros = ZeroScores([0.0] * n)
        return z

    def view(self, ctx: SchedulingContext, candidates: Sequence[Endpoint]) -> SessionView | None:
        ref = ctx.request.session
        if ref is None:
            return None
        table = self.table
        s = table.get(ref.key, ctx.now)
        if s is None or s.endpoint is None:
            turn, gap = (1, None) if s is None else (s.turns + 1, s.gap)
            if not self.program_bonus or not ref.program:
                return SessionView(ref, turn, False, None, False, 0.0, gap)
            return self._program_view(ref, turn, gap, candidates)
        parallel = bool(s.calls)
        b = s.endpoint
        cand = any(e.key == b for e in candidates)
        gap = s.gap if s.gap is not None else table.program_gap(s.program)
        return SessionView(ref, s.turns if parallel else s.turns + 1, parallel, b, cand,
                           self.bonus if cand else 0.0, gap, self.board.until(ref.key))

    def _program_view(self, ref: SessionRef, turn: int, gap: float | None,
                      candidates: Sequence[Endpoint]) -> SessionView:
        """A session not bound (yet): join its program's home(s), or start a new program where the fewest live."""
        table = self.table
        keys = {e.key for e in candidates}
        homes = table.program_homes(ref.program, len(keys))
        if homes and homes[0] in keys:
            if not self.params.programShare:
                homes = homes[:1]
            else:
                # A program gathers on its share of the endpoints: one program (a chat app whose users send `user`)
                # gathers nowhere; while it holds fewer than its share, its sessions go by predicted latency.
                k = max(1, round(table.program_share(ref.program) * len(keys)))
                if k >= len(keys):
                    return SessionView(ref, turn, False, None, False, 0.0, gap)
                homes = [h for h in homes[:k] if h in keys]
                if len(homes) < k:  # holding fewer: it grows where the fewest programs live
                    homes += self._fewest_programs(candidates, homes)
            spill = self._spill(homes, candidates)
            if spill:
                return SessionView(ref, turn, False, None, False, self.program_bonus, gap, None, homes[0],
                                   spread=spill)
            return SessionView(ref, turn, False, None, False, self.program_bonus, gap, None, homes[0],
                               tuple(homes[1:]))
        # A program new here: it starts where the fewest programs live (programs spread over the endpoints).
        spread = tuple(self._fewest_programs(candidates, ()))
        if len(spread) == len(candidates):
            spread = ()
        return SessionView(ref, turn, False, None, False, self.program_bonus if spread else 0.0, gap,
                           spread=spread)

    def _fewest_programs(self, candidates: Sequence[Endpoint], skip: Collection[str]) -> list[str]:
        """The candidates (but `skip`) that the fewest programs call home."""
        claims = self.table.claims
        rest = [e.key for e in candidates if e.key not in skip]
        fewest = min((claims(k) for k in rest), default=0)
        return [k for k in rest if claims(k) == fewest]

    def _spill(self, homes: list[str], candidates: Sequence[Endpoint]) -> tuple[str, ...]:
        """programSpill: when every home holds more than programSpill times the mean of the sessions bound per
        candidate, the candidates holding the fewest (a program larger than its endpoints spills over; () if not)."""
        f = self.params.programSpill
        if not f or len(candidates) < 2:
            return ()
        at = self.table.bound_at
        counts = [at.get(e.key, 0) for e in candidates]
        mean = sum(counts) / len(counts)
        if any(at.get(h, 0) <= f * mean for h in homes):
            return ()
        low = min(counts)
        return tuple(e.key for e, c in zip(candidates, counts, strict=True) if c == low)

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        n = len(candidates)
        if ctx.request.session is None:
            return self._zero(n)
        v = self.view(ctx, candidates)
        if v is not None and v.bonus and v.candidate and not v.parallel and self.params.moveWhenEvicted:
            s = self.table.get(v.ref.key, ctx.now)
            tokens = float(ctx.request.estimated_tokens)
            context = min(1.0, s.tokens / tokens) if s is not None and tokens > 0 else 1.0
            if context_evicted(v.bound, state, candidates, context):
                v = replace(v, bonus=0.0, evicted=True)
        state[SESSION] = v
        if v is None or not v.bonus:
            return self._zero(n)
        if v.spread:
            spread, bonus = set(v.spread), v.bonus
            return [bonus if e.key in spread else 0.0 for e in candidates]
        if v.homes:
            homes, bonus = {v.home, *v.homes}, v.bonus
            return [bonus if e.key in homes else 0.0 for e in candidates]
        b = v.bound if v.candidate else v.home
        return [v.bonus if e.key == b else 0.0 for e in candidates]

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        v: SessionView | None = state.get(SESSION)
        if v is None or not result.targets:
            return
        chosen = result.targets[0].key
        now = ctx.now
        s, new_turn = self.table.begin(v.ref, chosen, float(ctx.request.estimated_tokens), now)
        why = decision(v, result)
        state[NOTE] = SessionNote(v.ref.label, v.ref.source, s.turns, not new_turn, why)
        if new_turn:
            self.board.release(s.key)  # its context is in use again
            s.decision = why
            self._export(s, now, -1.0)

    def response_complete(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        v: SessionView | None = state.get(SESSION)
        if v is None or not result.targets:
            return
        now = ctx.now
        s = self.table.end(v.ref.key, result.targets[0].key, now)
        if s is None or s.endpoint is None:
            return
        p = self.params
        warm = min(p.maxWarmSeconds, p.warmFactor * self.table.expected_gap(s, p.priorGapSeconds))
        if warm > 0:
            self.board.protect(s.key, s.endpoint, s.tokens, now + warm)
        self._export(s, now, warm)

    def endpoint_removed(self, key: str) -> None:
        self.table.endpoint_removed(key)
        self.board.forget(key)

    def tracked_endpoints(self) -> Collection[str]:
        return self.table.endpoints() | self.board.endpoints()

    # ---- replication -------------------------------------------------------------------------------------
    def _export(self, s: Session, now: float, warm: float) -> None:
        """Queue the session for the bus: its binding as of `now`, and a protection of `warm` s from `now`."""
        if self._outbox is not None and s.endpoint is not None:
            self._outbox.append((_record(s, now, warm), now))

    def replication_key(self) -> str:
        return "agent-session"

    def set_replicating(self, on: bool) -> None:
        self._outbox = deque(maxlen=MAX_OUTBOX) if on else None

    def export_records(self, now: float) -> list[Record]:
        """The bindings and protections since the last call, with ages and what is left of the protection as of
        `now` (so receivers on other clocks place them right)."""
        out: list[Record] = []
        for rec, at in drain(self._outbox):
            late = max(0.0, now - at)
            rec[2] += late
            if rec[7] >= 0:
                rec[7] = max(0.0, rec[7] - late)
            out.append(rec)
        return out

    def snapshot_records(self, now: float) -> list[Record]:
        out: list[Record] = []
        for s in reversed(list(self.table)):
            if len(out) >= SNAPSHOT or now - s.last > self.table.ttl_s:
                break
            if s.endpoint is not None:
                until = self.board.until(s.key)
                out.append(_record(s, now, -1.0 if until is None else max(0.0, until - now)))
        return out

    def apply_records(self, peer: str, records: Sequence[Record], now: float) -> int:
        bad = 0
        ttl = self.table.ttl_s
        for rec in records:
            if not _valid(rec):
                bad += 1
                continue
            ep, raw, age, turns, gap, program, tokens, warm = rec
            s = self.table.place(int.from_bytes(raw, "big"), "peer", int(program), ep, now - min(float(age), ttl),
                                 int(turns), None if gap < 0 else float(gap), float(tokens))
            if s is not None and warm > 0:
                self.board.protect(s.key, ep, s.tokens, now + float(warm))
            elif s is not None and warm < 0 and not s.calls:
                self.board.release(s.key)
        return bad


def _record(s: Session, now: float, warm: float) -> Record:
    return [s.endpoint, s.key.to_bytes(16, "big"), max(0.0, now - s.last), s.turns,
            -1.0 if s.gap is None else s.gap, s.program, s.tokens, warm]


def _num(v: Any, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v < hi


def _valid(rec: Record) -> bool:
    return (len(rec) == 8 and isinstance(rec[1], bytes) and len(rec[1]) == 16 and _num(rec[2], 0.0, 1e9)
            and is_count(rec[3], 2**31) and (rec[4] == -1.0 or _num(rec[4], 0.0, 1e9)) and is_count(rec[5])
            and _num(rec[6], 0.0, 1e9) and (rec[7] == -1.0 or _num(rec[7], 0.0, 1e6)))
