"""Limit state in the process: token buckets and rolling windows per (limit, scope), with bounded memory.

Every operation is synchronous and never awaits, so under asyncio each `run` is atomic: no other request sees a
half-charged set of limits. Time comes from the caller (`now`, seconds on any monotonic clock), never from here.

`run(ops, mode, now)` is the one operation, shared with the Redis store (which runs the same steps in a Lua
script, see `redis_store.py`):
- `Mode.ADMIT`: every op must fit (`remaining >= need`), or nothing is charged (all or nothing); when all fit,
  each op's `charge` is applied.
- `Mode.CHARGE`: apply each op's `charge` unconditionally (settling a request's real usage, or a refund when
  negative). A negative charge on a rolling window goes back to the slot it was charged in (`op.slot`), so a
  refund never lowers usage that is newer than the charge it undoes; a refund whose slot left the window is moot.
- `Mode.PEEK`: decide like ADMIT, but charge nothing (explain, state snapshots).

Token bucket: level = min(capacity, level + elapsed × rate); a charge may take it below zero (debt), which the
refill pays back before anything fits again. A full bucket is the default state and is not stored.
Rolling window: slot index = floor(now / width); slots with index >= current - nslots count, which covers at
least the window and at most one slot more. An empty window is not stored.

Memory: at most `max_keys` states. Keys are kept in least-recently-used order; expired ones (a bucket refilled
to capacity, a window emptied) are dropped, up to two on every call and all of them when the store is full. When
it is full of live state, `run` in ADMIT mode raises `StoreFull` for a request that would add a key: forgetting a
live key would let its scope start over, so new scopes are refused instead (and counted).
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from epp.ratelimit.limits import Algorithm, Limit

INF = math.inf
TOLERANCE = 1e-9  # relative to a limit's amount: float rounding never refuses what fits (same in the Lua script)
_SWEEP_SMALL = 2  # least recently used keys looked at (and dropped when expired) by every call
_FULL_SWEEP_INTERVAL_S = 1.0


class Mode(str, enum.Enum):
    ADMIT = "a"
    CHARGE = "c"
    PEEK = "p"


@dataclass(slots=True)
class Op:
    """One limit's part in one call: its state key, the limit, what must fit, what to charge."""

    key: str
    limit: Limit
    need: float = 0.0
    charge: float = 0.0
    slot: int = -1  # rolling window: the slot a negative charge goes back to (-1: none)
    label: str = ""  # the scope as shown in snapshots
    known: float = 0.0  # the part of `need` the request surely uses (its input), for messages


@dataclass(slots=True)
class OpResult:
    remaining: float  # after the charge (before it when refused or peeking); may be negative (debt)
    retry_after: float = 0.0  # 0: fits; INF: can never fit; else seconds until it would
    reset_after: float = 0.0  # seconds until the limit is back to full (no usage counted)
    slot: int = -1  # rolling window: the slot this call charged


class StoreFull(Exception):
    """The store holds `max_keys` live states and a request needs a new one."""


class StoreUnavailable(Exception):
    """The shared store (Redis) did not answer in time or failed; `reason` is 'timeout' or 'error'."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class _Bucket:
    limit: Limit
    label: str
    level: float
    ts: float


@dataclass(slots=True)
class _Window:
    limit: Limit
    label: str
    slots: deque[list[float]] = field(default_factory=deque)  # [index, amount], oldest first
    used: float = 0.0


_State = _Bucket | _Window


def bucket_level(level: float, ts: float, limit: Limit, now: float) -> float:
    if now > ts:
        level += (now - ts) * limit.rate
    return level if level < limit.amount else limit.amount


def bucket_retry(level: float, need: float, limit: Limit) -> float:
    if need > limit.amount:
        return INF
    if level >= need - TOLERANCE * limit.amount:
        return 0.0
    return (need - level) / limit.rate


def window_retry(slots: Sequence[list[float]], used: float, need: float, limit: Limit, now: float) -> float:
    """Seconds until enough old slots have left the window for `need` to fit."""
    if need > limit.amount:
        return INF
    remaining = limit.amount - used
    tol = TOLERANCE * limit.amount
    if remaining >= need - tol:
        return 0.0
    for idx, amount in slots:
        remaining += amount
        if remaining >= need - tol:
            return max(0.0, (idx + limit.nslots + 1) * limit.width - now)
    return max(0.0, (slots[-1][0] + limit.nslots + 1) * limit.width - now) if slots else 0.0


class LocalStore:
    def __init__(self, *, max_keys: int = 100_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self._states: OrderedDict[str, _State] = OrderedDict()
        self._last_full_sweep = -INF
        self.dropped = 0  # CHARGE-mode charges that found the store full (lost)

    def __len__(self) -> int:
        return len(self._states)

    # ---- the one operation ----------------------------------------------------------------------------------
    def run(self, ops: Sequence[Op], mode: Mode, now: float) -> tuple[bool, list[OpResult]]:
        states = self._states
        if states and mode is not Mode.PEEK:
            self._sweep_front(now, _SWEEP_SMALL)  # faster than keys can be added: expired state never piles up
        ok = True
        results: list[OpResult] = []
        current: list[float] = []  # bucket level / window used, per op
        for op in ops:
            limit = op.limit
            st = states.get(op.key)
            if limit.algorithm is Algorithm.TOKEN_BUCKET:
                b = st if isinstance(st, _Bucket) else None
                level = limit.amount if b is None else bucket_level(b.level, b.ts, limit, now)
                current.append(level)
                res = OpResult(level, 0.0, (limit.amount - level) / limit.rate)
                if mode is not Mode.CHARGE and level < op.need - TOLERANCE * limit.amount:
                    ok = False
                    res.retry_after = bucket_retry(level, op.need, limit)
            else:
                w = st if isinstance(st, _Window) else None
                used = 0.0 if w is None else self._window_used(w, limit, now)
                current.append(used)
                res = OpResult(limit.amount - used, 0.0, self._window_reset(w, limit, now))
                if mode is not Mode.CHARGE and limit.amount - used < op.need - TOLERANCE * limit.amount:
                    ok = False
                    res.retry_after = window_retry(w.slots if w is not None else (), used, op.need, limit, now)
            results.append(res)
            if st is not None:
                states.move_to_end(op.key)
        if not ok or mode is Mode.PEEK:
            return ok, results
        if mode is Mode.ADMIT:
            new = sum(1 for op in ops if op.charge > 0 and op.key not in states)
            if new and len(states) + new > self.max_keys:
                self._make_room(now, new)
                if len(states) + new > self.max_keys:
                    raise StoreFull(f"{len(states)} rate-limit states are live (the limit is {self.max_keys})")
        for op, res, value in zip(ops, results, current, strict=True):
            self._apply(op, res, value, now)
        return ok, results

    def _apply(self, op: Op, res: OpResult, value: float, now: float) -> None:
        limit = op.limit
        states = self._states
        st = states.get(op.key)
        if limit.algorithm is Algorithm.TOKEN_BUCKET:
            level = value - op.charge
            if level > limit.amount:
                level = limit.amount
            res.remaining = level
            res.reset_after = (limit.amount - level) / limit.rate
            if level >= limit.amount:
                if st is not None:
                    del states[op.key]
            elif isinstance(st, _Bucket):
                st.limit, st.level, st.ts = limit, level, now
            elif st is not None:
                states[op.key] = _Bucket(limit, op.label, level, now)  # the limit changed algorithm
            elif self._room(now):
                states[op.key] = _Bucket(limit, op.label, level, now)
            return
        if op.charge == 0:
            return
        w = st if isinstance(st, _Window) else None
        if w is None:
            if op.charge < 0 or (st is None and not self._room(now)):
                return
            w = states[op.key] = _Window(limit, op.label)
        w.limit = limit
        if op.charge > 0 or op.slot < 0:
            cur = math.floor(now / limit.width)
            if w.slots and w.slots[-1][0] == cur:
                w.slots[-1][1] += op.charge
            else:
                w.slots.append([cur, op.charge])
            w.used += op.charge
            res.slot = cur
        else:
            for i, entry in enumerate(w.slots):
                if entry[0] == op.slot:
                    back = min(-op.charge, entry[1])
                    entry[1] -= back
                    w.used -= back
                    if entry[1] <= 0:
                        del w.slots[i]
                    break
        res.remaining = limit.amount - w.used
        res.reset_after = self._window_reset(w, limit, now)

    # ---- rolling windows --------------------------------------------------------------------------------------
    @staticmethod
    def _window_used(w: _Window, limit: Limit, now: float) -> float:
        oldest = math.floor(now / limit.width) - limit.nslots
        slots = w.slots
        if slots and slots[0][0] < oldest:
            while slots and slots[0][0] < oldest:
                slots.popleft()
            w.used = math.fsum(a for _, a in slots)
        return w.used

    @staticmethod
    def _window_reset(w: _Window | None, limit: Limit, now: float) -> float:
        if w is None or not w.slots:
            return 0.0
        return max(0.0, (w.slots[-1][0] + limit.nslots + 1) * limit.width - now)

    # ---- memory ----------------------------------------------------------------------------------------------
    def _expired(self, st: _State, now: float) -> bool:
        if isinstance(st, _Bucket):
            return bucket_level(st.level, st.ts, st.limit, now) >= st.limit.amount
        return self._window_used(st, st.limit, now) <= 0  # nothing counted: the same as no state

    def _sweep_front(self, now: float, budget: int) -> None:
        states = self._states
        for _ in range(budget):
            if not states:
                return
            key, st = next(iter(states.items()))
            if not self._expired(st, now):
                return
            del states[key]

    def _make_room(self, now: float, wanted: int) -> None:
        self._sweep_front(now, len(self._states))
        if len(self._states) + wanted > self.max_keys and now - self._last_full_sweep >= _FULL_SWEEP_INTERVAL_S:
            self._last_full_sweep = now
            for key in [k for k, st in self._states.items() if self._expired(st, now)]:
                del self._states[key]

    def _room(self, now: float) -> bool:
        if len(self._states) < self.max_keys:
            return True
        self._make_room(now, 1)
        if len(self._states) < self.max_keys:
            return True
        self.dropped += 1
        return False

    # ---- reading -----------------------------------------------------------------------------------------------
    def states(self, now: float) -> Iterator[tuple[Limit, str, float, float]]:
        """(limit, scope label, remaining, reset_after) of every stored state."""
        for st in list(self._states.values()):
            limit = st.limit
            if isinstance(st, _Bucket):
                level = bucket_level(st.level, st.ts, limit, now)
                yield limit, st.label, level, (limit.amount - level) / limit.rate
            else:
                used = self._window_used(st, limit, now)
                yield limit, st.label, limit.amount - used, self._window_reset(st, limit, now)

    def clear(self) -> None:
        self._states.clear()
