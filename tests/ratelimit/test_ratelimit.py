"""Rate limits and budgets in one process: units and refill math, rolling windows, admission rules, settling,
refunds, exactness under asyncio, bounded memory, headers and messages, hostile input. Time is injected."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from prometheus_client import generate_latest

from epp.ratelimit import (
    MAX_TOKENS,
    Admission,
    Limit,
    Limiter,
    Metric,
    Price,
    RateLimitMetrics,
    RedisStore,
    Unit,
    declared_output,
    scope_key,
    scope_label,
    tokens,
)
from epp.ratelimit.state import LocalStore, Mode, Op


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make(**kw: object) -> tuple[Limiter, Clock]:
    clock = Clock()
    return Limiter(clock=clock, **kw), clock  # type: ignore[arg-type]


def admit(limiter: Limiter, applied: list, input_tokens: object = 0, **kw: object) -> Admission:
    """The synchronous admission (local limits never need to await)."""
    adm = limiter.admit_nowait(applied, input_tokens, **kw)  # type: ignore[arg-type]
    assert adm is not None
    return adm


# ---- units and refill math ----------------------------------------------------------------------------------
@pytest.mark.parametrize("unit,seconds", [("second", 1), ("minute", 60), ("hour", 3600), ("day", 86400),
                                          ("month", 30 * 86400)])
def test_units_are_kthenas(unit: str, seconds: int) -> None:
    assert Unit.parse(unit).seconds == seconds
    lim = Limit.per_unit("r", "input_tokens", 120, unit)
    assert lim.period_s == seconds and lim.rate == pytest.approx(120 / seconds) and lim.per == unit


def test_unit_defaults_to_second_and_rejects_unknown() -> None:
    assert Unit.parse(None) is Unit.SECOND and Unit.parse("") is Unit.SECOND and Unit.parse("Minute") is Unit.MINUTE
    with pytest.raises(ValueError, match="second, minute|'second', 'minute'"):
        Unit.parse("week")


@pytest.mark.parametrize("unit", list(Unit))
def test_bucket_starts_full_then_refills_at_amount_per_unit(unit: Unit) -> None:
    limiter, clock = make()
    lim = Limit.per_unit("r", "input_tokens", 100, unit)
    assert admit(limiter, [(lim, "")], 100).allowed  # a full unit's worth in one burst
    refused = admit(limiter, [(lim, "")], 10)
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(10 * unit.seconds / 100)
    clock.advance(10 * unit.seconds / 100 * 0.99)
    assert not admit(limiter, [(lim, "")], 10).allowed
    clock.advance(10 * unit.seconds / 100 * 0.02)
    assert admit(limiter, [(lim, "")], 10).allowed


def test_bucket_long_run_rate_is_the_limit() -> None:
    limiter, clock = make()
    lim = Limit.per_unit("r", "input_tokens", 60, "minute")  # 1 token per second, burst 60
    admitted = 0
    for _ in range(600 * 4):  # ten minutes of constant pressure in quarter seconds
        adm = admit(limiter, [(lim, "")], 1)
        admitted += adm.allowed
        clock.advance(0.25)
    assert admitted == pytest.approx(60 + 600, abs=1)


def test_refill_never_exceeds_capacity() -> None:
    limiter, clock = make()
    lim = Limit.per_unit("r", "input_tokens", 10, "second")
    clock.advance(3600)
    assert admit(limiter, [(lim, "")], 10).allowed
    assert not admit(limiter, [(lim, "")], 1).allowed


def test_request_larger_than_the_limit_can_never_pass() -> None:
    limiter, _ = make()
    lim = Limit.per_unit("route-x", "input_tokens", 10, "minute")
    adm = admit(limiter, [(lim, "")], 11)
    assert not adm.allowed and adm.retry_after_s is None
    assert "retry-after" not in dict(adm.headers)
    assert adm.message.startswith("inference error: ResourceExhausted - input token rate limit exceeded")
    assert "can never be admitted" in adm.message and "11" in adm.message


# ---- output limits, estimates and settling ---------------------------------------------------------------------
def test_output_limit_refuses_only_once_exhausted_and_charges_usage() -> None:
    limiter, clock = make()
    out = Limit.per_unit("r", "output_tokens", 100, "minute")
    a = admit(limiter, [(out, "")], 50)  # input tokens do not count against an output limit
    assert a.allowed
    limiter.settle(a.ticket, output_tokens=150)  # generation overran: the bucket goes into debt (-50)
    b = admit(limiter, [(out, "")], 1)
    assert not b.allowed and "output token rate limit exceeded" in b.message
    assert b.retry_after_s == pytest.approx((50 + 1) * 60 / 100)  # pay the debt back, then one token
    clock.advance(b.retry_after_s or 0)
    assert admit(limiter, [(out, "")], 1).allowed


def test_output_estimate_is_reserved_then_reconciled() -> None:
    limiter, _ = make()
    out = Limit.per_unit("r", "output_tokens", 100, "hour")
    a = admit(limiter, [(out, "")], 5, output_estimate=80)
    assert a.statuses[0].remaining == pytest.approx(20)
    b = admit(limiter, [(out, "")], 5, output_estimate=80)  # not exhausted: admitted, estimate into debt
    assert b.allowed and b.statuses[0].remaining == pytest.approx(-60)
    assert not admit(limiter, [(out, "")], 5).allowed
    limiter.settle(a.ticket, output_tokens=10)
    limiter.settle(b.ticket, output_tokens=10)
    assert limiter.snapshot()[0].remaining == pytest.approx(80, abs=0.01)


def test_lean_phases_keep_the_estimate_charged() -> None:
    """Without response usage (lean phases), settle() without counts leaves the max_tokens estimate charged."""
    limiter, _ = make()
    out = Limit.per_unit("r", "output_tokens", 1000, "day")
    a = admit(limiter, [(out, "")], 10, output_estimate=256)
    limiter.settle(a.ticket)
    assert limiter.snapshot()[0].used == pytest.approx(256, abs=0.01)


@pytest.mark.parametrize("body,expected", [
    ({"max_completion_tokens": 300, "max_tokens": 100}, 300),  # OpenAI: the newer field wins
    ({"max_tokens": 1024}, 1024),  # OpenAI legacy, Anthropic messages
    ({"max_output_tokens": 64}, 64),  # responses API
    ({"max_tokens": -5}, 0), ({"max_tokens": True}, 42), ({"max_tokens": "9"}, 42), ({"max_tokens": 1e300}, MAX_TOKENS),
    ({}, 42), (None, 42), ([1, 2], 42),
])
def test_declared_output_bound_is_the_estimate(body: object, expected: int) -> None:
    assert declared_output(body, default=42) == expected


def test_settle_reconciles_input_too() -> None:
    limiter, _ = make()
    inp = Limit.per_unit("r", "input_tokens", 1000, "day")
    a = admit(limiter, [(inp, "")], 100)  # an estimate from the prompt's length
    limiter.settle(a.ticket, input_tokens=140, output_tokens=3)  # the engine's count
    assert limiter.snapshot()[0].used == pytest.approx(140, abs=0.01)


def test_every_admission_is_charged_exactly_once() -> None:
    limiter, _ = make()
    lim = Limit.per_unit("r", "total_tokens", 10_000, "day")
    a = admit(limiter, [(lim, "")], 100, output_estimate=50)
    limiter.settle(a.ticket, output_tokens=20)
    limiter.settle(a.ticket, output_tokens=5000)  # a second settle does nothing
    limiter.refund(a.ticket)  # nor does a refund after it
    assert limiter.snapshot()[0].used == pytest.approx(120, abs=0.01)
    b = admit(limiter, [(lim, "")], 300, output_estimate=50)
    limiter.refund(b.ticket)  # admitted, then failed before reaching an engine: nothing stays charged
    limiter.refund(b.ticket)
    limiter.settle(b.ticket, output_tokens=99)
    assert limiter.snapshot()[0].used == pytest.approx(120, abs=0.01)
    limiter.settle(None)
    limiter.refund(None)


def test_refused_request_charges_nothing_anywhere() -> None:
    limiter, _ = make()
    small = Limit.per_unit("small", "input_tokens", 10, "day")
    big = Limit.per_unit("big", "input_tokens", 1000, "day")
    budget = Limit.rolling("b", "total_tokens", 1000, 3600)
    adm = admit(limiter, [(big, ""), (budget, "t"), (small, "")], 50, output_estimate=30)
    assert not adm.allowed
    assert [s.limit.name for s in adm.statuses if s.refused] == ["small"]
    assert all(r.used == 0 for r in limiter.snapshot())


def test_dry_run_decides_without_charging() -> None:
    metrics = RateLimitMetrics()
    limiter, _ = make(metrics=metrics)
    lim = Limit.per_unit("r", "input_tokens", 10, "day")
    assert admit(limiter, [(lim, "")], 10, dry_run=True).allowed
    assert not admit(limiter, [(lim, "")], 11, dry_run=True).allowed
    assert admit(limiter, [(lim, "")], 10).allowed  # nothing was charged by the dry runs
    assert not admit(limiter, [(lim, "")], 1, dry_run=True).allowed
    text = generate_latest(metrics.registry).decode()  # explain does not count as traffic
    assert 'decision="admitted"} 1.0' in text and 'decision="rejected"} 0.0' in text
    assert "pointsman_ratelimit_redis_up" not in text  # no Redis configured: not reported as down


def test_duplicate_limits_in_one_request_are_charged_once() -> None:
    limiter, _ = make()
    lim = Limit.per_unit("r", "input_tokens", 100, "day")
    admit(limiter, [(lim, ""), (lim, "")], 30)
    assert limiter.snapshot()[0].used == pytest.approx(30)


# ---- rolling windows (budgets) ----------------------------------------------------------------------------------
def test_rolling_window_holds_over_every_window() -> None:
    """Random traffic for ten windows: usage in any window of `window_s` seconds never exceeds the budget, and
    the budget is used (usage leaves no later than one slot after the window)."""
    limiter, clock = make()
    budget = Limit.rolling("b", "total_tokens", 10_000, 120)
    rng = random.Random(7)
    admitted: list[tuple[float, int]] = []
    start = clock.t
    while clock.t - start < 1200:
        n = rng.randint(1, 900)
        adm = admit(limiter, [(budget, "")], n)
        if adm.allowed:
            admitted.append((clock.t, n))
        clock.advance(rng.random() * 2)
    times = [t for t, _ in admitted]
    for i, t0 in enumerate(times):
        window = sum(n for t, n in admitted[i:] if t < t0 + 120)
        assert window <= 10_000
    assert sum(n for _, n in admitted) >= 10_000 * (1200 / (120 + budget.width)) * 0.8


def test_window_usage_expires_between_window_and_one_slot_later() -> None:
    limiter, clock = make()
    budget = Limit.rolling("b", "total_tokens", 100, 600)  # 60 slots of 10 s
    assert budget.width == 10 and budget.nslots == 60
    assert admit(limiter, [(budget, "")], 100).allowed
    refused = admit(limiter, [(budget, "")], 1)
    assert not refused.allowed and 600 <= (refused.retry_after_s or 0) <= 610
    clock.advance(599.9)
    assert not admit(limiter, [(budget, "")], 1).allowed
    clock.advance(10.2)
    assert admit(limiter, [(budget, "")], 1).allowed


def test_budget_refuses_at_the_cap_with_a_clear_message() -> None:
    limiter, _ = make()
    budget = Limit.rolling("team-cap", "total_tokens", 1000, 3600)
    a = admit(limiter, [(budget, "team-a")], 400, output_estimate=100)
    limiter.settle(a.ticket, output_tokens=550)
    adm = admit(limiter, [(budget, "team-a")], 60)
    assert not adm.allowed
    assert adm.message == ("inference error: ResourceExhausted - budget \"team-cap\" exhausted: 950 of 1000 tokens "
                           f"used in the last 3600 s; retry after {math.ceil(adm.retry_after_s or 0)} s")
    assert admit(limiter, [(budget, "team-b")], 60).allowed  # another team has its own budget


def test_usd_budget_prices_prompt_and_completion() -> None:
    limiter, _ = make()
    usd = Limit.rolling("spend", "usd", 0.01, 3600)
    price = Price.parse("2.50", "10")  # USD per million prompt / completion tokens
    a = admit(limiter, [(usd, "")], 1000, output_estimate=0, price=price)
    assert a.statuses[0].remaining == pytest.approx(0.01 - 0.0025)
    limiter.settle(a.ticket, output_tokens=500)  # + 0.005
    assert limiter.snapshot()[0].used == pytest.approx(0.0075)
    refused = admit(limiter, [(usd, "")], 1001, price=price)  # 0.0025025 > 0.0025 left
    assert not refused.allowed and "$0.0075 of $0.01 used" in refused.message
    last = admit(limiter, [(usd, "")], 999, price=price)  # 0.0024975 fits
    assert last.allowed
    limiter.settle(last.ticket, output_tokens=1)  # + 0.00001: the budget is now overdrawn
    assert not admit(limiter, [(usd, "")], 10**6, price=None).allowed  # exhausted, even for a free request


def test_backend_without_price_costs_nothing() -> None:
    limiter, _ = make()
    usd = Limit.rolling("spend", "usd", 0.01, 3600)
    for _ in range(5):
        a = admit(limiter, [(usd, "")], 10**6, output_estimate=10**6)
        assert a.allowed
        limiter.settle(a.ticket, output_tokens=10**6)


def test_budget_with_tokens_and_usd_reports_the_larger_utilization() -> None:
    limiter, _ = make()
    tok = Limit.rolling("cap", "total_tokens", 1000, 60)
    usd = Limit.rolling("cap", "usd", 1.0, 60)
    idle = Limit.rolling("idle", "total_tokens", 5, 60)
    limiter.configure([tok, usd, idle])
    a = admit(limiter, [(tok, ""), (usd, "")], 100, price=Price(1000.0, 1000.0))  # $0.10
    limiter.settle(a.ticket, output_tokens=300)  # 400 tokens = 40 %, $0.40 = 40 %
    b = admit(limiter, [(tok, ""), (usd, "")], 10, price=Price(50_000.0, 0.0))  # + 10 tokens, + $0.50
    limiter.settle(b.ticket, output_tokens=0)
    states = {s.name: s for s in limiter.budgets()}
    assert states["cap"].tokens_used == 410 and states["cap"].usd_used == pytest.approx(0.9)
    assert states["cap"].utilization == pytest.approx(0.9) and states["cap"].max_usd == 1.0
    assert states["idle"].utilization == 0 and states["idle"].tokens_used == 0  # configured, unused: listed


def test_refund_on_a_window_goes_back_to_its_own_slot() -> None:
    limiter, clock = make()
    budget = Limit.rolling("b", "total_tokens", 100, 60)  # 1 s slots
    a = admit(limiter, [(budget, "")], 60)
    clock.advance(30)
    b = admit(limiter, [(budget, "")], 30)
    assert b.allowed
    limiter.refund(a.ticket)  # gives back the old slot's 60, not 60 of b's newer usage
    clock.advance(35)  # a's slot would have left the window anyway; b's 30 still counts
    assert limiter.snapshot()[0].used == pytest.approx(30)
    limiter.settle(b.ticket)


# ---- exact under asyncio ----------------------------------------------------------------------------------------
def test_concurrent_admissions_are_exact() -> None:
    """2,000 concurrent requests (interleaved at every await) against a bucket and a budget: what is charged is
    exactly what was admitted, and the budget is filled but overdrawn by at most one output estimate."""

    async def main() -> tuple[int, int, dict[str, float]]:
        limiter = Limiter(clock=lambda: 5.0)
        lim = Limit.per_unit("r", "input_tokens", 10_000, "day")
        budget = Limit.rolling("b", "total_tokens", 7_000, 3600)
        admitted_input = admitted = 0

        async def one(i: int) -> None:
            nonlocal admitted_input, admitted
            await asyncio.sleep(0)
            adm = await limiter.admit([(lim, ""), (budget, "")], 10 + i % 7, output_estimate=3)
            await asyncio.sleep(0)
            if adm.allowed:
                admitted_input += 10 + i % 7
                admitted += 1
                limiter.settle(adm.ticket, output_tokens=3)

        await asyncio.gather(*(one(i) for i in range(2000)))
        return admitted_input, admitted, {r.name: r.used for r in limiter.snapshot()}

    admitted_input, admitted, used = asyncio.run(main())
    assert used["r"] == pytest.approx(admitted_input)
    assert used["b"] == pytest.approx(admitted_input + 3 * admitted)
    assert 7_000 - 17 < used["b"] <= 7_000 + 2


# ---- bounded memory ---------------------------------------------------------------------------------------------
def test_memory_is_bounded_and_new_scopes_wait_for_room() -> None:
    metrics = RateLimitMetrics()
    limiter, clock = make(max_keys=50, metrics=metrics)
    lim = Limit.per_unit("per-team", "input_tokens", 100, "minute")
    for i in range(50):
        assert admit(limiter, [(lim, f"team-{i}")], 10).allowed
    adm = admit(limiter, [(lim, "team-new")], 10)
    assert not adm.allowed and adm.overflow and adm.retry_after_s == 1.0
    assert "too many distinct rate-limit scopes" in adm.message and ("retry-after", "1") in adm.headers
    assert len(limiter.local) == 50
    assert admit(limiter, [(lim, "team-3")], 10).allowed  # a live scope still works
    clock.advance(60)  # every bucket refilled: their state is the default again and can go
    assert admit(limiter, [(lim, "team-new")], 10).allowed
    assert len(limiter.local) <= 50
    assert b"pointsman_ratelimit_scope_overflow_total 1.0" in generate_latest(metrics.registry)


def test_expired_states_are_swept_as_traffic_goes_on() -> None:
    store = LocalStore(max_keys=10_000)
    lim = Limit.per_unit("r", "input_tokens", 10, "second")
    for i in range(1000):
        store.run([Op(f"k{i}", lim, 1, 1)], Mode.ADMIT, float(i))  # each key refills within a second
    assert len(store) < 50


# ---- hostile input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value,expected", [(-5, 0), (-1e300, 0), (float("nan"), 0), (float("inf"), 0),
                                            (10**30, MAX_TOKENS), (1e300, MAX_TOKENS), (True, 0), ("12", 0),
                                            (None, 0), (12.9, 12), (7, 7)])
def test_token_counts_are_made_safe(value: object, expected: int) -> None:
    assert tokens(value) == expected


def test_hostile_token_counts_never_break_the_counters() -> None:
    limiter, _ = make()
    lim = Limit.per_unit("r", "total_tokens", 1000, "day")
    assert admit(limiter, [(lim, "")], -500, output_estimate=float("nan")).allowed  # counts as 0
    huge = admit(limiter, [(lim, "")], 10**30)
    assert not huge.allowed and huge.retry_after_s is None  # capped, and more than the whole limit
    a = admit(limiter, [(lim, "")], 10)
    limiter.settle(a.ticket, input_tokens=-3, output_tokens=float("inf"))  # nonsense usage counts as 0
    assert limiter.snapshot()[0].used == pytest.approx(0, abs=1e-6)


def test_unicode_and_huge_team_values_are_distinct_bounded_and_never_shown() -> None:
    limiter, _ = make()
    budget = Limit.rolling("team-cap", "total_tokens", 100, 3600)
    teams = ["équipe", "equipe", "\u202eevil", "team\x00nul", "🚀" * 5000, "a\r\nx-injected: 1", "", " "]
    for t in teams:
        assert admit(limiter, [(budget, t)], 100).allowed  # each value is its own scope
    assert len({scope_key(t) for t in teams}) == len(teams)
    assert all(len(scope_key(t)) <= 24 for t in teams)
    for t in teams:
        adm = admit(limiter, [(budget, t)], 1)
        assert not adm.allowed
        shown = adm.message + repr(adm.headers)
        assert "\r" not in shown and "\n" not in shown and "🚀" not in shown and "x-injected" not in shown
    labels = {r.scope for r in limiter.snapshot()}
    assert all(len(lbl) <= 64 and all(" " <= c <= "~" or c == "…" for c in lbl) for lbl in labels)
    assert scope_label("team\x00nul") == "team?nul"


def test_limit_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="amount must be a finite number > 0"):
        Limit.per_unit("r", "input_tokens", 0, "minute")
    with pytest.raises(ValueError, match="amount"):
        Limit.per_unit("r", "input_tokens", float("nan"), "minute")
    with pytest.raises(ValueError, match="period must be > 0"):
        Limit.rolling("b", "total_tokens", 10, 0)
    with pytest.raises(ValueError, match="limit name"):
        Limit.per_unit("", "input_tokens", 1, "minute")
    with pytest.raises(ValueError):
        Limit.per_unit("r", "bogus", 1, "minute")
    with pytest.raises(ValueError, match="promptUSD"):
        Price.parse("-1", "1")
    with pytest.raises(ValueError, match="completionUSD"):
        Price.parse("1", "1e5")
    assert Price.parse("0.15", "0.6") == Price(0.15, 0.6)


# ---- what the client sees ---------------------------------------------------------------------------------------
def test_rejection_headers_follow_envoys_x_ratelimit_draft_03() -> None:
    limiter, _ = make()
    inp = Limit.per_unit("default/deepseek", "input_tokens", 10, "minute")
    out = Limit.per_unit("default/deepseek", "output_tokens", 5000, "minute")
    assert admit(limiter, [(inp, ""), (out, "")], 7).allowed
    adm = admit(limiter, [(inp, ""), (out, "")], 5)
    h = dict(adm.headers)
    assert adm.status_code == 429 and list(h) == ["retry-after", "x-ratelimit-limit", "x-ratelimit-remaining",
                                                  "x-ratelimit-reset"]
    assert h["retry-after"] == "12"  # 2 more tokens at 1 per 6 s
    assert h["x-ratelimit-limit"] == '10, 10;w=60;name="default/deepseek", 5000;w=60;name="default/deepseek"'
    assert h["x-ratelimit-remaining"] == "3"
    assert h["x-ratelimit-reset"] == "42"  # 7 tokens to refill
    assert adm.message == ('inference error: ResourceExhausted - input token rate limit exceeded: '
                           '"default/deepseek" allows 10 input tokens per minute; this request needs 5, 3 remain; '
                           'retry after 12 s')
    assert adm.reason == adm.message.split(" - ", 1)[1]


def test_admitted_headers_show_the_tightest_limit() -> None:
    limiter, _ = make()
    a = Limit.per_unit("a", "input_tokens", 100, "minute")
    b = Limit.rolling("b", "total_tokens", 1000, 3600)
    adm = admit(limiter, [(a, ""), (b, "")], 80)
    h = dict(adm.headers)
    assert adm.allowed and "retry-after" not in h
    assert h["x-ratelimit-limit"].startswith("100, ") and h["x-ratelimit-remaining"] == "20"
    assert adm.reason == "" and adm.message == "" and adm.retry_after_s is None


def test_no_limits_is_a_free_pass() -> None:
    limiter, _ = make()
    adm = admit(limiter, [], 10**9)
    assert adm.allowed and adm.ticket is None and adm.headers == []


def test_admit_nowait_answers_local_requests_and_defers_redis_ones() -> None:
    redis = RedisStore("127.0.0.1:1")  # never contacted here
    limiter = Limiter(redis=redis, clock=Clock())
    local = Limit.per_unit("l", "input_tokens", 10, "minute")
    shared = Limit.per_unit("s", "input_tokens", 10, "minute", shared=True)
    adm = limiter.admit_nowait([(local, "")], 4)
    assert adm is not None and adm.allowed
    assert limiter.admit_nowait([(local, ""), (shared, "")], 4) is None
    without = Limiter(clock=Clock())  # no Redis configured: a shared limit is enforced in the process
    assert without.admit_nowait([(shared, "")], 4) is not None


# ---- metrics ----------------------------------------------------------------------------------------------------
def test_metrics_count_decisions_and_show_budget_utilization() -> None:
    metrics = RateLimitMetrics()
    limiter, _ = make(metrics=metrics)
    metrics.bind(limiter)
    budget = Limit.rolling("team-cap", "total_tokens", 1000, 3600)
    rate = Limit.per_unit("route", "input_tokens", 100, "minute")
    limiter.configure([budget, rate])
    a = admit(limiter, [(budget, "secret-team-value"), (rate, "")], 50)
    limiter.settle(a.ticket, output_tokens=200)
    assert not admit(limiter, [(rate, "")], 60).allowed
    text = generate_latest(metrics.registry).decode()
    assert 'pointsman_ratelimit_requests_total{decision="admitted"} 1.0' in text
    assert 'pointsman_ratelimit_requests_total{decision="rejected"} 1.0' in text
    assert 'pointsman_ratelimit_rejections_total{kind="rate",limit="route",metric="input_tokens"} 1.0' in text
    assert 'pointsman_budget_utilization{budget="team-cap"} 0.25' in text
    assert 'pointsman_ratelimit_utilization{kind="rate",limit="route",metric="input_tokens"} 0.5' in text
    assert "secret-team-value" not in text
    assert metrics.registry is not None and Metric.USD.noun == "USD"
