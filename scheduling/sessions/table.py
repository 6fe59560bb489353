"""What Pointsman remembers of each agent session, bounded (LRU and an idle TTL), keyed by a hash.

A session is bound to the endpoint that served the first call of its latest turn (where its context is). A turn is
the calls that start while none of the session's calls is in flight: a call that starts while another is in flight
is a parallel call of the same turn (a fan-out) and never moves the binding. Between turns the table learns the gap
(the pause while the client's tool ran): an EWMA per session, and per program as the prior for sessions that have
not paused yet. The table also counts each program's sessions per endpoint: the endpoint holding most of them is
the program's home, where its shared prompt (system prompt, tools) already is; each endpoint's programs, so
that a new program can start where no other program lives; and each program's share of all bound sessions and each
endpoint's bound sessions, so that a program gathers on at most its share of the endpoints.

Memory: at most `max_sessions` sessions (the least recently used go first) and `max_programs` programs; a session
idle for `ttl_s` is dropped. Each session holds a few numbers and the endpoints of its calls in flight.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from scheduling.types import SessionRef


class Session:
    __slots__ = ("key", "source", "program", "endpoint", "last", "turns", "gap", "tokens", "ended", "calls",
                 "decision")

    def __init__(self, key: int, source: str, program: int, now: float) -> None:
        self.key = key
        self.source = source
        self.program = program
        self.endpoint: str | None = None  # where the context is (the first call of the latest turn went)
        self.last = now  # the last activity (a call started or ended)
        self.turns = 0
        self.gap: float | None = None  # EWMA of the pauses between turns (seconds)
        self.tokens = 0.0  # prompt tokens of the latest turn (its context)
        self.ended: float | None = None  # when the latest turn's last call ended (None while one is in flight)
        self.calls: list[str] = []  # endpoints of the calls in flight
        self.decision = ""  # why the latest turn stayed or moved


class SessionTable:
    def __init__(self, *, max_sessions: int = 100_000, ttl_s: float = 600.0, gap_alpha: float = 0.3,
                 max_programs: int = 4096, on_drop: Callable[[int], None] | None = None) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.gap_alpha = gap_alpha
        self.max_programs = max_programs
        self.on_drop = on_drop  # told the key of every session dropped (idle, least recently used)
        self._sessions: OrderedDict[int, Session] = OrderedDict()
        self._programs: OrderedDict[int, float] = OrderedDict()  # program -> EWMA gap
        self._homes: dict[int, dict[str, int]] = {}  # program -> endpoint -> sessions bound there
        self._home_of: dict[int, str] = {}  # program -> its home (the endpoint with most of its sessions)
        self._claims: dict[str, int] = {}  # endpoint -> programs whose home it is
        self._bound: dict[int, int] = {}  # program -> its sessions bound to an endpoint
        self.bound_total = 0  # sessions with a program bound to an endpoint
        self.bound_at: dict[str, int] = {}  # endpoint -> sessions with a program bound to it

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(self._sessions.values())

    def get(self, key: int, now: float) -> Session | None:
        """The live session (read-only: scoring and explain call it)."""
        s = self._sessions.get(key)
        if s is None or now - s.last > self.ttl_s:
            return None
        return s

    def program_gap(self, program: int) -> float | None:
        return self._programs.get(program)

    def _learn_gap(self, s: Session, gap: float) -> None:
        a = self.gap_alpha
        s.gap = gap if s.gap is None else (1 - a) * s.gap + a * gap
        if s.program:
            progs = self._programs
            prev = progs.get(s.program)
            progs[s.program] = gap if prev is None else (1 - a) * prev + a * gap
            progs.move_to_end(s.program)
            while len(progs) > self.max_programs:
                progs.popitem(last=False)

    def _touch(self, s: Session, now: float) -> None:
        s.last = now
        sessions = self._sessions
        sessions[s.key] = s
        sessions.move_to_end(s.key)
        self.expire(now)
        while len(sessions) > self.max_sessions:
            self._drop(next(iter(sessions)))

    def _bind(self, s: Session, endpoint: str | None) -> None:
        """Move the session's binding (and its program's count of sessions, in all and per endpoint)."""
        old = s.endpoint
        if old == endpoint:
            return
        s.endpoint = endpoint
        p = s.program
        if not p:
            return
        homes = self._homes
        if old is not None:
            self.bound_total -= 1
            _decrement(self._bound, p)
            _decrement(self.bound_at, old)
            counts = homes.get(p)
            if counts is not None:
                _decrement(counts, old)
                if not counts:
                    del homes[p]
        if endpoint is not None:
            self.bound_total += 1
            self._bound[p] = self._bound.get(p, 0) + 1
            self.bound_at[endpoint] = self.bound_at.get(endpoint, 0) + 1
            counts = homes.setdefault(p, {})
            counts[endpoint] = counts.get(endpoint, 0) + 1
        self._rehome(p)

    def _rehome(self, program: int) -> None:
        """Keep the program's home (the endpoint with most of its sessions; a tie keeps the current one) and each
        endpoint's count of programs calling it home."""
        counts = self._homes.get(program)
        old = self._home_of.get(program)
        new: str | None = None
        if counts:
            best = max(counts.values())
            new = old if old is not None and counts.get(old) == best else max(counts, key=counts.__getitem__)
        if new == old:
            return
        claims = self._claims
        if old is not None:
            n = claims.get(old, 0) - 1
            if n > 0:
                claims[old] = n
            else:
                claims.pop(old, None)
            del self._home_of[program]
        if new is not None:
            self._home_of[program] = new
            claims[new] = claims.get(new, 0) + 1

    def program_home(self, program: int) -> tuple[str, int] | None:
        """The endpoint holding most of the program's sessions, and how many (None: none bound)."""
        ep = self._home_of.get(program) if program else None
        if ep is None:
            return None
        return ep, self._homes[program][ep]

    def program_share(self, program: int) -> float:
        """The program's share of the sessions bound anywhere (0 when none is)."""
        n = self._bound.get(program, 0) if program else 0
        return n / self.bound_total if n else 0.0

    def program_homes(self, program: int, k: int) -> list[str]:
        """The (at most) `k` endpoints holding most of the program's sessions, the home first."""
        counts = self._homes.get(program) if program else None
        if not counts:
            return []
        home = self._home_of.get(program)
        return sorted(counts, key=lambda e: (e != home, -counts[e], e))[:k]

    def claims(self, endpoint: str) -> int:
        """How many programs call `endpoint` home."""
        return self._claims.get(endpoint, 0)

    def _drop(self, key: int) -> None:
        s = self._sessions.pop(key)
        self._bind(s, None)
        if self.on_drop is not None:
            self.on_drop(key)

    def expire(self, now: float) -> None:
        sessions = self._sessions
        ttl = self.ttl_s
        while sessions:
            key, s = next(iter(sessions.items()))
            if now - s.last <= ttl:
                break
            self._drop(key)

    def begin(self, ref: SessionRef, endpoint: str, tokens: float, now: float) -> tuple[Session, bool]:
        """A call of the session was sent to `endpoint`: (the session, whether it starts a new turn)."""
        s = self.get(ref.key, now)
        if s is None:
            s = Session(ref.key, ref.source, ref.program, now)
        new_turn = not s.calls
        if new_turn:
            if s.ended is not None:
                self._learn_gap(s, max(0.0, now - s.ended))
            s.turns += 1
            if ref.program and ref.program != s.program:
                self._bind(s, None)
                s.program = ref.program
            self._bind(s, endpoint)
            s.tokens = tokens
            s.ended = None
        elif tokens > s.tokens and endpoint == s.endpoint:
            s.tokens = tokens
        s.calls.append(endpoint)
        self._touch(s, now)
        return s, new_turn

    def end(self, key: int, endpoint: str, now: float) -> Session | None:
        """A call of the session ended: the session when that was its last call in flight (its turn ended)."""
        s = self._sessions.get(key)
        if s is None:
            return None
        try:
            s.calls.remove(endpoint)
        except ValueError:
            return None
        self._touch(s, now)
        if s.calls:
            return None
        s.ended = now
        return s

    def expected_gap(self, s: Session, prior: float) -> float:
        """The pause expected before the session's next turn: its own, else its program's, else `prior`."""
        if s.gap is not None:
            return s.gap
        g = self._programs.get(s.program) if s.program else None
        return g if g is not None else prior

    def endpoint_removed(self, key: str) -> list[int]:
        """Forget `key` in every session (their calls there are over; their context is gone): the keys of the
        sessions that were bound to it."""
        unbound = []
        for s in self._sessions.values():
            if s.calls and key in s.calls:
                s.calls = [c for c in s.calls if c != key]
                if not s.calls and s.ended is None:
                    s.ended = s.last
            if s.endpoint == key:
                self._bind(s, None)
                unbound.append(s.key)
        return unbound

    def endpoints(self) -> set[str]:
        out: set[str] = set()
        for s in self._sessions.values():
            if s.endpoint is not None:
                out.add(s.endpoint)
            out.update(s.calls)
        return out

    def place(self, key: int, source: str, program: int, endpoint: str, last: float, turns: int,
              gap: float | None, tokens: float) -> Session | None:
        """A binding learnt from a peer (replication): applied when it is newer than what this table knows."""
        s = self._sessions.get(key)
        if s is not None and s.last >= last:
            return None
        if s is None:
            s = Session(key, source, 0, last)
        if program and program != s.program:
            self._bind(s, None)
            s.program = program
        self._bind(s, endpoint)
        s.turns, s.tokens = max(s.turns, turns), tokens
        if gap is not None:
            s.gap = gap
        if not s.calls:
            s.ended = last
        self._touch(s, max(last, s.last))
        s.last = last
        return s


def _decrement(counts: dict[Any, int], key: Any) -> None:
    n = counts.get(key, 0) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)
