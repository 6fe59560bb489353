"""Class-aware dispatch, the core's rule (scheduling/latency/hold.py): which loose request waits, for how long, and
the tight work per endpoint it waits for; the scorer states it in the verdict (sloHold, sloHoldShare,
sloHoldSlack)."""

from __future__ import annotations

from sched_helpers import ctx, ep, plugin, req, state

from scheduling.latency import (
    LOOSE,
    TIGHT,
    Slo,
    SloVerdict,
    TightWork,
    busy,
    decision_slo,
    hold_budget,
    is_tight,
)

PROMPT = "s" * 64 * 20


def _verdict(klass: str, hold: float = 0.8, inflight: int = 8, slack: float = 0.5, ttft: float = 2.0) -> SloVerdict:
    return SloVerdict(Slo(ttft, None), {"a": (0.4, 0.01)}, frozenset({"a"}), frozenset({"a"}), klass,
                      hold=hold, hold_inflight=inflight, hold_slack=slack)


def test_the_budget_is_a_share_of_the_slack_and_only_loose_requests_have_one():
    assert hold_budget(_verdict(LOOSE), "a") == 0.5 * (2.0 * 0.8 - 0.4)
    assert hold_budget(_verdict(LOOSE, slack=1.0), "a") == 2.0 * 0.8 - 0.4
    assert hold_budget(_verdict(TIGHT), "a") == 0.0
    assert hold_budget(_verdict(LOOSE, hold=0.0), "a") == 0.0  # holding off
    assert hold_budget(_verdict(LOOSE, ttft=0.45), "a") == 0.0  # no slack left
    assert hold_budget(_verdict(LOOSE), "b") == 0.0  # not predicted on that endpoint
    assert hold_budget(None, "a") == 0.0
    assert is_tight(_verdict(TIGHT)) and not is_tight(_verdict(LOOSE)) and not is_tight(None)


def test_busy_is_tight_work_pending_or_half_the_batch_in_flight():
    v = _verdict(LOOSE)
    assert busy(v, True, 0) and busy(v, False, 8) and not busy(v, False, 7)
    assert not busy(_verdict(LOOSE, inflight=0), False, 100)  # sloHoldShare 0: tight work only


def test_tight_work_ends_at_its_first_token_its_end_or_its_predicted_start():
    w = TightWork()
    w.sent("a", 1, until=10.0)
    w.sent("a", 2, until=12.0)
    assert w.busy("a", 9.0) and w.until("a") == 12.0 and not w.busy("b", 9.0)
    w.started("a", 2)  # its first token
    assert w.busy("a", 9.0) and w.until("a") == 10.0
    assert not w.busy("a", 10.0) and w.pending == {}  # its predicted start passed: dropped
    w.started("a", 1)  # (its end, later: nothing left to drop)
    assert w.pending == {} and w.until("a") is None


def test_the_scorer_states_the_rule_for_loose_requests_only():
    s = plugin("estimated-latency-scorer", {"maxNumSeqs": 16})
    eps = [ep(1), ep(2)]

    def verdict(headers: dict[str, str], now: float) -> SloVerdict:
        st = state()
        s.score(ctx(req(PROMPT, headers=headers), eps, now=now), eps, st)
        got = decision_slo(st)
        assert got is not None
        return got

    tight = verdict({"x-slo-ttft-ms": "250"}, 0.0)
    assert tight.klass == TIGHT and tight.hold == 0.0
    loose = verdict({"x-slo-ttft-ms": "2000"}, 1.0)
    assert loose.klass == LOOSE and (loose.hold, loose.hold_inflight, loose.hold_slack) == (0.8, 8, 0.5)
    off = plugin("estimated-latency-scorer", {"sloHold": False})
    for headers, now in (({"x-slo-ttft-ms": "250"}, 0.0), ({"x-slo-ttft-ms": "2000"}, 1.0)):
        st = state()
        off.score(ctx(req(PROMPT, headers=headers), eps, now=now), eps, st)
    got = decision_slo(st)
    assert got is not None and got.klass == LOOSE and got.hold == 0.0
