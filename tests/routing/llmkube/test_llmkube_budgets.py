"""Budgets: scope router / rule / team (team from headerKey), maxTokens and/or maxUSD over windowSeconds with the
cost from costPerMillionTokens, a 429 with a clear message over budget, utilization as a metric and in explain.
(Across two processes sharing a real Redis: test_llmkube_budgets_redis.py.)"""

from __future__ import annotations

from llmkube_helpers import Rig, finish, local, router_doc
from prometheus_client import CollectorRegistry, generate_latest

from epp.ratelimit import RateLimitMetrics
from epp.request.usage import Usage

POOLS = {"svc-a": ["10.0.1.1:8000"], "svc-b": ["10.0.2.1:8000"]}


def rig(budgets: list[dict], **spec) -> Rig:
    backends = spec.pop("backends", [local("a", "svc-a", costPerMillionTokens={"promptUSD": "2", "completionUSD": "10"}),
                                     local("b", "svc-b")])
    r = Rig(router_doc({"backends": backends, "defaultRoute": "a", "policy": {"budgets": budgets}, **spec}), POOLS)
    assert not r.errors, r.errors
    return r


def ask(r: Rig, prompt_chars: int = 400, max_tokens: int = 0, **kw):
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * prompt_chars}]}
    if max_tokens:
        body["max_tokens"] = max_tokens
    return r.decide(body=body, **kw)


def settle(ex, prompt: int, completion: int) -> None:
    ex.response_headers({":status": "200", "content-type": "application/json"}, {})
    ex.scanner.usage = Usage(prompt, completion, prompt + completion, found=True)  # what the body would report
    ex.close()


def test_a_router_budget_caps_total_tokens_and_answers_429_with_a_clear_message():
    r = rig([{"name": "daily", "scope": "router", "maxTokens": 1000, "windowSeconds": 3600}])
    admitted = 0
    while True:
        ex, out = ask(r, max_tokens=50)
        if out.reject_status:
            break
        settle(ex, 110, 40)
        admitted += 1
        assert admitted < 50
    assert out.reject_status == 429
    assert out.reject_body.startswith('inference error: ResourceExhausted - budget "default/r/daily" exhausted')
    assert "retry after" in out.reject_body
    h = dict(out.reject_headers)
    assert int(h["retry-after"]) > 0 and "x-ratelimit-limit" in h
    assert 6 <= admitted <= 7  # 150 tokens each, 1,000 in the window
    [state] = r.limiter.budgets()
    assert state.tokens_used == 150 * admitted and state.max_tokens == 1000


def test_the_window_rolls():
    r = rig([{"name": "minute", "scope": "router", "maxTokens": 300, "windowSeconds": 60}])
    ex, out = ask(r, prompt_chars=1000)  # 250 tokens
    finish(ex)
    _, out = ask(r, prompt_chars=1000)
    assert out.reject_status == 429
    r.clock.t += 62
    ex, out = ask(r, prompt_chars=1000)
    assert not out.reject_status


def test_a_rule_budget_counts_only_that_rules_requests():
    r = rig([{"name": "cloudy", "scope": "rule", "ruleName": "to-b", "maxTokens": 200, "windowSeconds": 600}],
            rules=[{"name": "to-b", "match": {"headers": {"x-b": "1"}}, "route": {"backends": ["b"]}}])
    for _ in range(5):  # the default route is not counted
        ex, out = ask(r, prompt_chars=800)
        assert not out.reject_status
        finish(ex)
    ex, out = ask(r, prompt_chars=600, headers={"x-b": "1"})
    assert not out.reject_status
    finish(ex)
    _, out = ask(r, prompt_chars=600, headers={"x-b": "1"})
    assert out.reject_status == 429 and "cloudy" in out.reject_body


def test_a_team_budget_is_per_team_and_a_missing_header_has_its_own():
    r = rig([{"name": "per-team", "scope": "team", "headerKey": "X-Team", "maxTokens": 150, "windowSeconds": 600}])
    for team in ("red", "blue", None):
        headers = {"x-team": team} if team else {}
        ex, out = ask(r, prompt_chars=400, headers=headers)  # 100 tokens
        assert not out.reject_status, team
        finish(ex)
        _, out = ask(r, prompt_chars=400, headers=headers)
        assert out.reject_status == 429, team
    assert sorted(b.scope for b in r.limiter.budgets()) == ["", "blue", "red"]
    assert "red" not in out.reject_body  # a team value (client input) is never echoed


def test_a_usd_budget_prices_prompt_and_completion_by_the_serving_backend():
    r = rig([{"name": "dollars", "scope": "router", "maxUSD": "0.01", "windowSeconds": 3600}],
            rules=[{"name": "free", "match": {"headers": {"x-free": "1"}}, "route": {"backends": ["b"]}}])
    for _ in range(3):  # backend b has no price: it costs nothing
        ex, out = ask(r, headers={"x-free": "1"})
        assert not out.reject_status
        settle(ex, 10_000, 10_000)
    ex, out = ask(r, prompt_chars=4000)
    assert not out.reject_status
    settle(ex, 1000, 500)  # 1000 × $2/M + 500 × $10/M = $0.007
    [state] = r.limiter.budgets()
    assert abs(state.usd_used - 0.007) < 1e-9 and state.tokens_used == 0
    ex, out = ask(r, prompt_chars=4000)
    settle(ex, 1000, 500)  # $0.014 > $0.01
    _, out = ask(r)
    assert out.reject_status == 429 and "$0.014 of $0.01" in out.reject_body, out.reject_body


def test_both_caps_and_utilization_is_the_larger_fraction():
    r = rig([{"name": "both", "scope": "router", "maxTokens": 10_000, "maxUSD": "1", "windowSeconds": 600}])
    ex, _ = ask(r)
    settle(ex, 2000, 500)  # 2,500 tokens = 25%; $0.009 = 0.9%
    [state] = r.limiter.budgets()
    assert abs(state.utilization - 0.25) < 1e-9


def test_budget_utilization_is_a_metric_and_shows_in_explain():
    r = rig([{"name": "daily", "scope": "router", "maxTokens": 1000, "windowSeconds": 3600},
             {"name": "team", "scope": "team", "maxTokens": 500, "windowSeconds": 60}])
    registry = CollectorRegistry()
    metrics = RateLimitMetrics(registry)
    metrics.bind(r.limiter)
    text = generate_latest(registry).decode()
    assert 'pointsman_budget_utilization{budget="default/r/daily"} 0.0' in text  # known before any traffic
    ex, _ = ask(r, headers={"x-llmkube-team": "red"})
    settle(ex, 200, 50)
    text = generate_latest(registry).decode()
    assert 'pointsman_budget_utilization{budget="default/r/daily"} 0.25' in text
    assert 'pointsman_budget_utilization{budget="default/r/team"} 0.5' in text
    info = r.explain(headers={"x-llmkube-team": "red"})
    rows = {b.name: b for b in info.route.budgets}
    assert rows["default/r/daily"].tokens_used == 250 and rows["default/r/daily"].max_tokens == 1000
    assert rows["default/r/team"].scope == "red" and abs(rows["default/r/team"].utilization - 0.5) < 1e-9
    states = {(s["name"], s["scope"]): s for s in r.budgets.states()}
    assert states[("default/r/daily", "")]["window_s"] == 3600


def test_refused_requests_are_not_charged():
    r = rig([{"name": "daily", "scope": "router", "maxTokens": 100, "windowSeconds": 60}])
    _, out = ask(r, prompt_chars=2000)  # 500 tokens: more than the whole budget, never admitted
    assert out.reject_status == 429 and "more than the whole budget" in out.reject_body
    assert r.limiter.budgets()[0].tokens_used == 0
    r.ds.set_endpoints("svc-a", [])  # no endpoint: refused before the budget is asked
    _, out = ask(r, prompt_chars=40)
    assert out.reject_status == 503 and "has no endpoints" in out.reject_body
    assert r.limiter.budgets()[0].tokens_used == 0
