"""The values the limiter hands back: an `Admission` (with its `Ticket`), and state rows for metrics and explain."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from epp.ratelimit.headers import PREFIX, LimitStatus, primary, rate_limit_headers, rejection_message
from epp.ratelimit.limits import Price
from epp.ratelimit.state import INF, Op

OVERFLOW_REASON = "too many distinct rate-limit scopes are in use; try again later"


class RedisDownPolicy(str, enum.Enum):
    """What a shared (global) limit does while Redis cannot answer."""

    FAIL_OPEN = "fail-open"  # the shared limit is not enforced (local limits still are)
    LOCAL = "local"  # enforced in this process alone, with its amount divided by the expected replica count

    @classmethod
    def parse(cls, text: str | RedisDownPolicy) -> RedisDownPolicy:
        if isinstance(text, RedisDownPolicy):
            return text
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise ValueError(f"redis-down policy: expected one of {[p.value for p in cls]}, got {text!r}") from None


@dataclass(slots=True)
class Charged:
    """What one admission charged to one limit, and where."""

    op: Op  # op.charge is the amount charged; op.limit is the limit as charged (scaled in the fallback)
    store: str  # local | redis | fallback | none (fail-open: nothing was charged)
    slot: int = -1  # rolling windows: the slot charged


@dataclass(slots=True, eq=False)
class Ticket:
    """An admitted request's charges. Settle it (real usage) or refund it exactly once; later calls do nothing."""

    entries: list[Charged]
    input_tokens: int
    output_estimate: int
    price: Price | None
    closed: bool = False


@dataclass(slots=True)
class Admission:
    allowed: bool
    statuses: list[LimitStatus] = field(default_factory=list)
    ticket: Ticket | None = None
    overflow: bool = False  # refused because the state store is full of live scopes

    @property
    def retry_after_s(self) -> float | None:
        """Seconds until a retry could succeed; None when admitted or when it never can."""
        if self.allowed:
            return None
        if self.overflow:
            return 1.0
        first = primary([s for s in self.statuses if s.refused])
        if first is None or first.retry_after == INF:
            return None
        return first.retry_after

    @property
    def reason(self) -> str:
        """'' when admitted; else one sentence (the message without its `inference error:` prefix)."""
        if self.allowed:
            return ""
        return self.message[len(PREFIX):]

    @property
    def message(self) -> str:
        """`inference error: ResourceExhausted - ...`, the body of the 429 (empty when admitted)."""
        if self.allowed:
            return ""
        if self.overflow:
            return PREFIX + OVERFLOW_REASON
        return rejection_message(self.statuses)

    @property
    def headers(self) -> list[tuple[str, str]]:
        """`retry-after` (refusals that can succeed later) and `x-ratelimit-limit/-remaining/-reset`."""
        if self.overflow:
            return [("retry-after", "1")]
        return rate_limit_headers(self.statuses, refused=not self.allowed)

    @property
    def degraded(self) -> bool:
        """A shared limit was answered by the Redis-down policy instead of Redis."""
        return any(s.source in ("fallback", "fail-open") for s in self.statuses)

    @property
    def status_code(self) -> int:
        return 200 if self.allowed else 429


ADMITTED = Admission(True)


@dataclass(frozen=True, slots=True)
class LimitState:
    """One (limit, scope) state for the metrics page and explain."""

    name: str
    kind: str
    metric: str
    algorithm: str
    scope: str
    shared: bool
    amount: float
    period_s: float
    remaining: float
    used: float
    utilization: float  # used / amount, in [0, 1]
    reset_after_s: float
    source: str  # local | redis (as of the last answer from Redis) | fallback
    age_s: float = 0.0  # how old a Redis value is

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class BudgetState:
    """LLMKube's `status.budgetUtilization` entry: one budget (and, for team budgets, one team)."""

    name: str
    scope: str
    tokens_used: int
    usd_used: float
    max_tokens: float | None
    max_usd: float | None
    utilization: float  # the larger of the token and the USD fraction, in [0, 1]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def utilization(used: float, amount: float) -> float:
    if amount <= 0 or not math.isfinite(used):
        return 0.0
    return min(1.0, max(0.0, used / amount))
