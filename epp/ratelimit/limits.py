"""What a limit is: the metric it counts, how much per what time, and how the time is measured.

- `Metric`: input tokens, output tokens, total tokens (input + output) or estimated USD cost.
- `Algorithm.TOKEN_BUCKET` (Kthena's `rateLimit`): capacity = amount, refilled continuously at amount / unit;
  it starts full. `Unit` gives the seconds of Kthena's units; a month is 30 days, as in Kthena.
- `Algorithm.ROLLING_WINDOW` (LLMKube's budgets): the usage charged in the last `period_s` seconds, counted in
  `slots` sub-windows of width max(1 s, period / slots). A charge counts for at least `period_s` and at most
  `period_s` + one slot width, so the cap holds over every window of `period_s` seconds.
- `Price`: USD per million prompt / completion tokens (LLMKube's `costPerMillionTokens`).

Token counts from requests pass through `tokens()`: negative or non-finite values count as 0 and huge ones are
capped at `MAX_TOKENS`. Scope values (a team header, chosen by the client) are hashed for the state key and
sanitized for display by `scope_key()` / `scope_label()`, so neither memory per key nor what is shown grows with
what a client sends.
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
from dataclasses import dataclass, field

MAX_TOKENS = 10**12  # far above any context window; larger counts are capped here
USD_EPSILON = 1e-9  # the smallest USD amount that counts as "something left"
MAX_NAME = 200
_DECIMAL = re.compile(r"^[0-9]+(\.[0-9]+)?$")


class Metric(str, enum.Enum):
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    TOTAL_TOKENS = "total_tokens"
    USD = "usd"

    @property
    def counts_output(self) -> bool:
        return self is not Metric.INPUT_TOKENS

    @property
    def epsilon(self) -> float:
        """How much must remain for a limit that counts output not to be exhausted: one token, or a nano-dollar."""
        return USD_EPSILON if self is Metric.USD else 1.0

    def parts(self, input_tokens: int, output_tokens: int, price: Price | None) -> tuple[float, float]:
        """(the part of a charge due to input, the part due to output) in this metric's unit."""
        if self is Metric.INPUT_TOKENS:
            return float(input_tokens), 0.0
        if self is Metric.OUTPUT_TOKENS:
            return 0.0, float(output_tokens)
        if self is Metric.TOTAL_TOKENS:
            return float(input_tokens), float(output_tokens)
        if price is None:
            return 0.0, 0.0  # a backend without a price costs nothing against dollar budgets (as in LLMKube)
        return price.prompt_cost(input_tokens), price.completion_cost(output_tokens)

    def amount(self, input_tokens: int, output_tokens: int, price: Price | None) -> float:
        a, b = self.parts(input_tokens, output_tokens, price)
        return a + b

    @property
    def noun(self) -> str:
        return {"input_tokens": "input tokens", "output_tokens": "output tokens", "total_tokens": "tokens",
                "usd": "USD"}[self.value]


class Algorithm(str, enum.Enum):
    TOKEN_BUCKET = "token_bucket"
    ROLLING_WINDOW = "rolling_window"


class Kind(str, enum.Enum):
    RATE = "rate"  # a rate limit (Kthena ModelRoute rateLimit)
    BUDGET = "budget"  # a budget (LLMKube policy.budgets)


class Unit(str, enum.Enum):
    """Kthena's RateLimitUnit."""

    SECOND = "second"
    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    MONTH = "month"

    @property
    def seconds(self) -> float:
        return _UNIT_SECONDS[self]

    @classmethod
    def parse(cls, text: str | Unit | None) -> Unit:
        if text is None or text == "":
            return cls.SECOND  # Kthena's default
        if isinstance(text, Unit):
            return text
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise ValueError(f"unit: expected one of {[u.value for u in cls]}, got {text!r}") from None


_UNIT_SECONDS = {Unit.SECOND: 1.0, Unit.MINUTE: 60.0, Unit.HOUR: 3600.0, Unit.DAY: 86400.0,
                 Unit.MONTH: 30 * 86400.0}


def parse_usd(value: str | float | int, what: str) -> float:
    """A non-negative decimal ("1.50", the CRDs' pattern ^[0-9]+(\\.[0-9]+)?$) or a number, as float USD."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a decimal number of USD, got {value!r}")
    if isinstance(value, str):
        if not _DECIMAL.match(value.strip()):
            raise ValueError(f"{what}: expected a decimal number like \"1.50\", got {value!r}")
        out = float(value.strip())
    elif isinstance(value, (int, float)):
        out = float(value)
    else:
        raise ValueError(f"{what}: expected a decimal number of USD, got {type(value).__name__}")
    if not math.isfinite(out) or out < 0:
        raise ValueError(f"{what}: expected a finite amount >= 0, got {value!r}")
    return out


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens of one backend (LLMKube `costPerMillionTokens.promptUSD` / `completionUSD`)."""

    prompt_usd_per_million: float = 0.0
    completion_usd_per_million: float = 0.0

    def __post_init__(self) -> None:
        for name in ("prompt_usd_per_million", "completion_usd_per_million"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"Price.{name}: expected a finite number >= 0, got {v!r}")

    @classmethod
    def parse(cls, prompt_usd: str | float | None, completion_usd: str | float | None) -> Price:
        return cls(parse_usd(prompt_usd or 0, "promptUSD"), parse_usd(completion_usd or 0, "completionUSD"))

    def prompt_cost(self, tokens: int) -> float:
        return tokens * self.prompt_usd_per_million / 1e6

    def completion_cost(self, tokens: int) -> float:
        return tokens * self.completion_usd_per_million / 1e6

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return self.prompt_cost(input_tokens) + self.completion_cost(output_tokens)


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit. Build with `Limit.per_unit` (Kthena) or `Limit.rolling` (LLMKube budgets).

    `name` identifies it in messages, headers, metrics and (with metric and kind) its state key; it comes from
    configuration, never from a request. `shared=True` keeps its state in Redis when the limiter has one.
    """

    name: str
    metric: Metric
    amount: float
    period_s: float
    algorithm: Algorithm
    kind: Kind = Kind.RATE
    shared: bool = False
    slots: int = 60
    unit: str = ""  # how the period reads in messages: "minute", or "" for "<period> s"
    id: str = field(init=False, repr=False, compare=False, default="")
    rate: float = field(init=False, repr=False, compare=False, default=0.0)  # bucket: refill per second
    width: float = field(init=False, repr=False, compare=False, default=0.0)  # window: slot width, s
    nslots: int = field(init=False, repr=False, compare=False, default=0)  # window: slots that cover period_s

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > MAX_NAME:
            raise ValueError(f"limit name: expected 1 to {MAX_NAME} characters, got {self.name!r}")
        if not isinstance(self.metric, Metric):
            object.__setattr__(self, "metric", Metric(self.metric))
        if not isinstance(self.algorithm, Algorithm):
            object.__setattr__(self, "algorithm", Algorithm(self.algorithm))
        if not isinstance(self.kind, Kind):
            object.__setattr__(self, "kind", Kind(self.kind))
        amount = self.amount
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) \
                or amount <= 0:
            raise ValueError(f"limit {self.name!r}: amount must be a finite number > 0, got {amount!r}")
        if isinstance(self.period_s, bool) or not isinstance(self.period_s, (int, float)) \
                or not math.isfinite(self.period_s) or self.period_s <= 0:
            raise ValueError(f"limit {self.name!r}: period must be > 0 seconds, got {self.period_s!r}")
        if not isinstance(self.slots, int) or not 1 <= self.slots <= 3600:
            raise ValueError(f"limit {self.name!r}: slots must be an integer in [1, 3600], got {self.slots!r}")
        object.__setattr__(self, "amount", float(amount))
        object.__setattr__(self, "period_s", float(self.period_s))
        object.__setattr__(self, "id", f"{self.kind.value}:{self.name}:{self.metric.value}")
        if self.algorithm is Algorithm.TOKEN_BUCKET:
            object.__setattr__(self, "rate", float(amount) / float(self.period_s))
        else:
            width = max(1.0, float(self.period_s) / self.slots)
            object.__setattr__(self, "width", width)
            object.__setattr__(self, "nslots", max(1, math.ceil(float(self.period_s) / width - 1e-9)))

    @classmethod
    def per_unit(cls, name: str, metric: Metric | str, amount: float, unit: Unit | str | None = None, *,
                 shared: bool = False) -> Limit:
        """A Kthena-style limit: `amount` per unit, as a token bucket (capacity = amount)."""
        u = Unit.parse(unit)
        return cls(name, Metric(metric), amount, u.seconds, Algorithm.TOKEN_BUCKET, Kind.RATE, shared, unit=u.value)

    @classmethod
    def rolling(cls, name: str, metric: Metric | str, amount: float, window_s: float, *, shared: bool = False,
                kind: Kind = Kind.BUDGET, slots: int = 60) -> Limit:
        """An LLMKube-style budget: at most `amount` in any rolling window of `window_s` seconds."""
        return cls(name, Metric(metric), amount, window_s, Algorithm.ROLLING_WINDOW, kind, shared, slots)

    def scaled(self, factor: float) -> Limit:
        """The same limit with `amount` multiplied (a global limit split across replicas)."""
        return Limit(self.name, self.metric, self.amount * factor, self.period_s, self.algorithm, self.kind,
                     self.shared, self.slots, self.unit)

    @property
    def per(self) -> str:
        """'minute', or '3600 s' for a rolling window."""
        return self.unit or f"{_num(self.period_s)} s"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def tokens(value: object) -> int:
    """A token count from a request or a response, made safe: not a finite number or negative → 0; capped."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return 0 if value < 0 else min(value, MAX_TOKENS)
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            return 0
        return int(min(value, MAX_TOKENS))
    return 0


OUTPUT_BOUND_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def declared_output(body: object, default: int = 0) -> int:
    """The output bound a request declares (OpenAI `max_completion_tokens` / `max_tokens`, responses API
    `max_output_tokens`, Anthropic `max_tokens`), or `default`: the output estimate to charge at admission."""
    if isinstance(body, dict):
        for name in OUTPUT_BOUND_FIELDS:
            value = body.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return tokens(value)
    return tokens(default)


def scope_key(scope: str) -> str:
    """A bounded, opaque key for a scope value (a team header may be any length and any characters)."""
    if not scope:
        return "-"
    return hashlib.blake2b(scope.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def scope_label(scope: str, limit: int = 64) -> str:
    """A scope value fit for display: printable ASCII only (others become '?'), at most `limit` characters."""
    out = "".join(c if " " <= c <= "~" else "?" for c in scope[: limit + 1])
    return out if len(out) <= limit else out[: limit - 1] + "…"
