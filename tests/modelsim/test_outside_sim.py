"""The outside-traffic regime on a virtual clock (bench/routing/outside_sim.py): Pointsman's scheduler on the engines'
KV events, or a greedy oracle, in front of modelsim's engines while a share of the requests bypasses it. No processes;
deterministic, so two policies compare on exactly the same requests."""

from __future__ import annotations

import pytest

from bench.routing.outside_sim import Replay, Router, main, make_sim, parse_policy, plan, report
from modelsim.config import EngineConfig
from modelsim.engine import Engine, SimRequest


def _replay(policy: str, outside: float = 0.3, seed: int = 0, params: dict[str, object] | None = None):
    the_plan, system, blocks = plan(2, 8.0, 6.0, outside, seed)
    sim = make_sim(2, 512, 0.05, blocks)
    reqs = Replay(Router(policy, None, sim, seed, params), sim, system).run(the_plan)
    return the_plan, system, sim, reqs


def test_a_replay_is_deterministic_and_every_request_ends():
    the_plan, system, sim, reqs = _replay("pointsman-kv")
    _, _, _, again = _replay("pointsman-kv")
    assert len(reqs) == len(the_plan)
    assert [(r.server, r.ttft) for r in reqs] == [(r.server, r.ttft) for r in again]
    assert all(r.ttft is not None and r.ttft > 0 for r in reqs)
    assert all(n == 0 for n in sim.inflight.values())  # every routed request finished and was released
    bypassed = [r for r in reqs if not r.routed]
    assert bypassed and all(r.measured for r in bypassed)  # only stage requests bypass, never the warm-up
    assert {r.server for r in bypassed} == {0, 1}  # outside requests land on every engine


def test_the_precise_index_follows_the_engines_events():
    _, system, sim, reqs = _replay("pointsman-kv")
    for ep, g in zip(sim.endpoints, sim.engines, strict=True):
        assert sim.index.size(ep.key) == g.kv.cached_blocks  # every stored and removed block applied
    # a request whose group an engine held when it arrived is classed a hit there, never a miss cached nowhere
    for r in reqs:
        if r.measured and r.routed and r.server in r.cached_where:
            assert r.cause(system) in ("hit", "queued")


def test_the_oracles_and_the_report():
    _, system, sim, reqs = _replay("oracle")
    _, _, sim_v, reqs_v = _replay("oracle-victims")
    assert [r.group for r in reqs] == [r.group for r in reqs_v]  # the same requests for every policy
    row = report("oracle", reqs, system, sim.last_copies)
    routed = sum(1 for r in reqs if r.measured and r.routed)
    assert row.startswith(f"| oracle | {routed} |") and row.count("|") == 12
    # without bypassing traffic nothing is stored by an outside request, so no last copy is evicted by one
    _, system0, sim0, _ = _replay("oracle", outside=0.0)
    assert sim0.last_copies["outside"] == 0


def test_policies_parse_with_clear_errors(capsys):
    assert parse_policy("h:homeFactor=1.5:decodeWeight=0") == ("h", None, {"homeFactor": 1.5, "decodeWeight": 0})
    for bad in ("p:nonsense", "p:config=/no/such/profile.yaml"):
        with pytest.raises(SystemExit):
            parse_policy(bad)
    assert main(["--servers", "2", "--qps", "4", "--duration", "2", "--kv-cache-size", "512",
                 "--policy", "oracle", "--policy", "kv:evictionWeight=2"]) == 0
    out = capsys.readouterr().out
    assert "| oracle (4, 0) |" in out and "| kv (4, 0) |" in out


def _finish(engine: Engine, tokens: list[int], rid: str) -> None:
    engine.submit(SimRequest(rid, tokens, 2), 0.0)
    while (t := engine.next_event_time()) is not None:
        engine.advance(t)


def test_the_engine_shows_its_block_chain_and_eviction_order():
    engine = Engine(EngineConfig(kv_cache_size=64))
    a, b = list(range(1, 50)), list(range(100, 149))
    _finish(engine, a, "a")
    _finish(engine, b, "b")
    chain_a, chain_b = engine.kv_chain(a), engine.kv_chain(b)
    assert len(chain_a) == 3 and engine.probe(a) == 48  # the full blocks the engine caches and a request would hit
    assert all(engine.kv.contains(h) for h in chain_a + chain_b)
    # a request's blocks are released tail first, so the oldest request's tail is the next to go
    assert list(engine.kv.lru_order()) == chain_a[::-1] + chain_b[::-1]
