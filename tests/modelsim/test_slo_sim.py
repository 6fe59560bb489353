"""The slo regime on a virtual clock (bench/routing/slo_sim.py): Pointsman's scheduler in front of modelsim's engines,
no processes. Deterministic, so a replay repeats itself exactly, and the SLO classes are seen end to end."""

from __future__ import annotations

import pytest

from bench.routing.slo_sim import Policy, Replay, _fleet, _plan, main, summarize
from bench.routing.workload import SloMix

MIX = SloMix.parse("0.3:250/20,0.7:2000")


def _replay(policy: Policy, seed: int = 0, qps: float = 6.0, duration: float = 4.0):
    replay = Replay(policy, _fleet(2, 1024, 0.05), seed, 0.0)
    replay.run(_plan(2, qps, duration, MIX, seed))
    return replay


def test_a_replay_is_deterministic_and_measures_every_stage_request():
    plan = _plan(2, 6.0, 4.0, MIX, 0)
    measured = [p for _, p, m in plan if m]
    one, two = _replay(Policy("pointsman")), _replay(Policy("pointsman"))
    assert len(one.done) == len(measured) and one.done == two.done
    assert not one.live and all(n == 0 for n in one.fleet.inflight.values())  # every request finished
    assert sum(d.tight for d in one.done) == sum(p.tight for p in measured)
    assert all(d.ttft > 0 for d in one.done)
    row = summarize("pointsman", one.done, 4.0, one.held_for)
    assert row.startswith(f"| pointsman | {len(measured)} (")


def test_the_headers_reach_the_scheduler_only_when_sent():
    with_headers, without = _replay(Policy("pointsman")), _replay(Policy("nohdr", "none"))
    assert with_headers.placed["tight"] > 0 and with_headers.placed["loose"] > 0
    assert sum(with_headers.placed.values()) == len(with_headers.done)  # the warm-up requests state none
    assert not without.placed


def test_policies_parse_with_clear_errors(capsys):
    assert Policy.parse("y0:config=/x.yaml:headers=none") == Policy("y0", "none", "/x.yaml")
    assert Policy.parse("h:hold=off") == Policy("h", hold="off")
    for bad in ("p:headers=llm", "p:colour=red", "p:hold=maybe"):
        with pytest.raises(ValueError):
            Policy.parse(bad)
    assert main(["--servers", "2", "--qps", "4", "--duration", "2", "--policy", "p"]) == 0
    assert "| p (0) |" in capsys.readouterr().out


def test_loose_requests_are_held_while_their_pick_is_busy_and_tight_ones_go_first():
    """The class-aware dispatch (scheduling/latency/hold.py) in the replay: loose requests wait in Pointsman while
    their pick has tight work pending or half its batch in flight; tight requests never wait, and they meet their
    objectives at least as often as without holding; every request is served and no held request waits past its
    budget (half of 2 s x 0.8)."""
    held, free = _replay(Policy("pointsman"), qps=12.0, duration=6.0), _replay(Policy("off", hold="off"), qps=12.0,
                                                                                duration=6.0)
    assert len(held.held_for) >= 10 and not free.held_for
    assert len(held.held_for) <= sum(1 for _, p, _ in _plan(2, 12.0, 6.0, MIX, 0) if not p.tight)
    assert max(held.held_for) <= 0.8
    assert len(held.done) == len(free.done) and not held.live and not held.holds.by_key
    assert all(n == 0 for n in held.fleet.inflight.values()) and not held.tight.pending

    def met(r: Replay, tight: bool) -> int:
        return sum(d.met for d in r.done if d.tight == tight)

    assert met(held, True) >= met(free, True)
