"""The routing benchmark's new regimes, without external routers: the workload generators (deterministic under a
seed, with the promised shapes), SLO headers and attainment, router variants, and a short agent stage end to end
against an in-process fleet through its oracle."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.routing.agent import AgentSpec, AgentWorkload, parse_carriers
from bench.routing.agent_client import Call, SessionResult, fill_pods, run_agent_stage, summarize_agent
from bench.routing.client import Result, request_headers, run_stage
from bench.routing.procs import free_port_block
from bench.routing.regimes import FleetSpec, RegimeOptions, regimes
from bench.routing.report import markdown, summarize
from bench.routing.routers import FleetInfo
from bench.routing.stages import outside_plan
from bench.routing.variants import parse_variant
from bench.routing.workload import SloMix, Workload, WorkloadSpec
from modelsim import tokenizer as tk
from modelsim.config import EngineConfig

pytestmark = pytest.mark.realtime  # wall-clock bounds: run alone on a quiet machine (scripts/test.sh)

MODEL = "meta-llama/Llama-3.1-8B"


def test_agent_sessions_are_seeded_and_shaped_as_promised() -> None:
    spec = AgentSpec()
    wl = AgentWorkload(spec, MODEL, seed=3)
    plans = [wl.session(i) for i in range(400)]
    assert plans[7] == AgentWorkload(spec, MODEL, seed=3).session(7)
    assert plans[7] != AgentWorkload(spec, MODEL, seed=4).session(7)
    assert len({p.session_id for p in plans}) == 400
    turns = [len(p.turns) for p in plans]
    assert min(turns) == 4 and max(turns) == 8 and 5.6 < statistics.mean(turns) < 6.4
    pauses = [t.pause_after for p in plans for t in p.turns[:-1]]
    assert all(p.turns[-1].pause_after == 0 for p in plans)
    assert 4.5 < statistics.mean(pauses) < 5.5 and max(pauses) <= 50.0 and statistics.pstdev(pauses) > 2.0
    later = [t for p in plans for t in p.turns[1:]]
    assert all(p.turns[0].fanout == 1 for p in plans)
    fan = [t.fanout for t in later if t.fanout > 1]
    assert 0.16 < len(fan) / len(later) < 0.24 and set(fan) == {2, 3, 4}
    carriers = [p.carrier for p in plans]
    assert 0.62 < carriers.count(("header", "user")) / 400 < 0.78 and set(carriers) == {("header", "user"), ("user",)}


def test_agent_prompts_grow_by_answer_and_tool_result_and_extend_the_previous_one() -> None:
    spec = AgentSpec(fanout_share=1.0, carriers=parse_carriers("header+prompt_cache_key+metadata"))
    wl = AgentWorkload(spec, MODEL, seed=1)
    plan = wl.session(0)
    msgs = wl.first_messages(plan)
    prev_tokens = tk.request_tokens(tk.API_CHAT, {"messages": msgs})
    assert len(prev_tokens) > spec.system_len + spec.question_len
    for turn in plan.turns[1:]:
        answer = "The quick brown fox " * 16  # 64 tokens
        msgs = wl.next_messages(msgs, answer, turn)
        bodies = wl.bodies(plan, msgs, turn)
        assert len(bodies) == turn.fanout > 1
        tokens = tk.request_tokens(tk.API_CHAT, bodies[0])
        # the new prompt starts with the old one (less its closing bracket): every cached block stays usable
        assert tokens[: len(prev_tokens) - 1] == prev_tokens[:-1]
        assert len(tokens) - len(prev_tokens) >= spec.tool_len + 64
        assert bodies[0]["messages"][:-1] == bodies[1]["messages"][:-1] != bodies[1]["messages"]
        assert bodies[0]["prompt_cache_key"] == plan.session_id == bodies[0]["metadata"]["session_id"]
        assert "user" not in bodies[0] and wl.headers(plan) == {"x-session-id": plan.session_id}
        prev_tokens = tk.request_tokens(tk.API_CHAT, {"messages": msgs})
    with pytest.raises(ValueError, match="carrier"):
        AgentSpec(carriers=parse_carriers("cookie"))


def test_slo_mix_is_seeded_keeps_the_arrivals_and_sends_wall_milliseconds() -> None:
    mix = SloMix.parse("3:250,7:2000/40")
    assert [round(c.share, 6) for c in mix.classes] == [0.3, 0.7] and mix.tight_ms == 250
    assert mix.classes[1].tpot_ms == 40 and mix.classes[0].tpot_ms is None
    wl = Workload(WorkloadSpec(num_groups=4, system_prompt_len=32, question_len=8), MODEL, seed=2)
    plain = wl.plan(50, 60.0, 5000)
    with_slo = wl.plan(50, 60.0, 5000, slo=mix)
    assert [(p.at, p.group, p.body) for p in plain] == [(p.at, p.group, p.body) for p in with_slo]
    assert with_slo == wl.plan(50, 60.0, 5000, slo=mix)
    tight = [p for p in with_slo if p.tight]
    assert 0.27 < len(tight) / len(with_slo) < 0.33 and all(p.slo_ttft == 0.25 for p in tight)
    assert all(p.slo_ttft == 2.0 and p.slo_tpot == 0.04 for p in with_slo if not p.tight)
    h = request_headers(tight[0], 0.25)
    assert h["x-llm-d-slo-ttft-ms"] == "62" and "x-llm-d-slo-tpot-ms" not in h  # 250 model ms = 62.5 wall ms
    assert request_headers(with_slo[0] if not with_slo[0].tight else tight[0], 1.0)["x-request-id"].startswith("bench-")
    with pytest.raises(ValueError):
        SloMix.parse("0.3:0")


def test_slo_attainment_goodput_and_outside_columns() -> None:
    def res(ttft: float | None, slo: float, tight: bool, status: int = 200, direct: bool = False) -> Result:
        return Result(0, status, ttft, None if ttft is None else ttft + 1.0, 100, 11, 0, direct=direct,
                      slo_ttft=slo, tight=tight)

    results = [res(0.2, 0.25, True), res(0.3, 0.25, True), res(None, 0.25, True, status=503),
               res(1.5, 2.0, False), res(2.5, 2.0, False), res(0.1, 2.0, False), res(9.0, 2.0, False, direct=True)]
    row = summarize("slo", "r", 10, results, elapsed=10.0, sample=2)
    assert row.slo_requests == 6 and row.slo_tight == 3 and row.requests == 6 and row.direct == 1
    assert row.slo_attain_tight == pytest.approx(1 / 3) and row.slo_attain_all == pytest.approx(3 / 6)
    assert row.goodput == pytest.approx(0.3) and row.ttft_p90_all is not None and row.ttft_p90_all > row.ttft_p90
    tpot = Result(0, 200, 0.1, 1.1, 10, 11, 0, slo_ttft=1.0, slo_tpot=0.05)
    assert tpot.tpot == pytest.approx(0.1) and not tpot.met_slo
    assert (row.tight_missed_ttft, row.tight_missed_tpot) == (2, 0)  # 0.3 s late, and the 503
    table = markdown([row])
    assert "| slo | r | 2 | 10 | 6 (3) | 33.3% | 50.0% |" in table and "bypassed the router" in table
    assert table.rstrip().endswith("| 2 / 0 |")
    # a tight request in time that decodes too slowly misses on its TPOT only
    slow = Result(0, 200, 0.1, 1.1, 10, 11, 0, slo_ttft=0.25, slo_tpot=0.05, tight=True, at=7.5)
    late = Result(0, 200, 0.4, 1.1, 10, 11, 0, slo_ttft=0.25, tight=True, at=1.25)
    row = summarize("slo", "r", 10, [slow, res(0.2, 0.25, True), late], elapsed=10.0)
    assert (row.tight_missed_ttft, row.tight_missed_tpot) == (1, 1)
    assert row.tight_missed_at == [1.25, 7.5]  # when the missed ones arrived, in order


def test_outside_plan_fraction_and_regime_options() -> None:
    wl = Workload(WorkloadSpec(), MODEL)
    plan = wl.plan(100, 30.0, 5000)
    direct = outside_plan(plan, ["http://a", "http://b"], 0.2, "s")
    assert direct == outside_plan(plan, ["http://a", "http://b"], 0.2, "s")
    assert 0.17 < len(direct) / len(plan) < 0.23 and set(direct.values()) <= {"http://a/v1/chat/completions",
                                                                             "http://b/v1/chat/completions"}
    rs = regimes(FleetSpec(), RegimeOptions(outside=0.45, reset_every=4.0, saturation_samples=3), seed=5)
    assert rs["outside-traffic"].outside == 0.45 and rs["cache-resets"].reset_every == 4.0
    assert rs["saturation"].samples == (5, 6, 7) and rs["saturation"].qps == (30.0,)
    assert "pointsman-best" in rs["saturation"].routers and rs["slo"].slo is not None
    for name in ("saturation", "slo", "agent"):
        assert {"envoy-rr", "vllm-router", "sglang-router", "pointsman", "oracle"} <= set(rs[name].routers)


def test_router_variants_parse_and_render(tmp_path: Path) -> None:
    v = parse_variant("pointsman-x@pointsman-precise: --config-file {fleet_profile} --seed 1", {"pointsman"})
    assert (v.name, v.base) == ("pointsman-x", "pointsman-precise")
    fleet = FleetInfo(["http://127.0.0.1:1"], MODEL, time_scale=0.5)
    flags = v.render(fleet, tmp_path)
    profile = tmp_path / "pointsman-x-fleet-profile.yaml"
    assert flags == f"--config-file {profile} --seed 1" and "0.000125" in profile.read_text()
    assert parse_variant("plain:--seed 2").base == "pointsman"
    for bad in ("no-colon", "pointsman:--x", "bad name:--x", "n@nope:--x"):
        with pytest.raises(ValueError):
            parse_variant(bad, {"pointsman"})


def test_agent_summary_counts_stays_per_turn_and_unfinished_sessions() -> None:
    spec = AgentSpec(turns=3, turns_spread=0, fanout_share=0.0)
    wl = AgentWorkload(spec, MODEL)
    a, b = SessionResult(wl.session(0)), SessionResult(wl.session(1))
    for turn, pod in enumerate(("p0", "p0", "p1")):
        a.calls.append(Call("a", turn, 0, f"a{turn}", 200, 0.1 * (turn + 1), 1.0, 100, 10, 50, pod))
    a.duration = 12.0
    b.calls += [Call("b", 0, 0, "b0", 200, 0.5, 1.0, 100, 10, 0, "p2"), Call("b", 1, 0, "b1", 503, error="x")]
    row = summarize_agent("agent", "r", 2, [a, b], elapsed=10.0, workload=wl)
    assert (row.sessions, row.finished, row.requests, row.errors) == (2, 1, 5, 1)
    pauses = sum(t.pause_after for t in a.plan.turns)
    decode, least = pauses + 3 * 63 * 0.012, 3 * 0.030 + (2200 + 2 * 564) * 0.00025
    assert wl.floor(a.plan) == pytest.approx((decode, decode + least))
    assert row.floor_p90 is not None and row.floor_prefill_p90 == pytest.approx(row.floor_p90 + least)
    assert row.stayed == pytest.approx(0.5) and row.session_p90 == 12.0
    assert row.ttft_first_p50 == pytest.approx(0.3) and row.ttft_later_p50 == pytest.approx(0.25)


async def test_agent_and_slo_stages_end_to_end_through_the_oracle(make_fleet) -> None:
    scale = 0.05
    fleet = await make_fleet(2, time_scale=scale, engine=EngineConfig(kv_cache_size=512),
                             oracle_port=free_port_block(1))
    spec = AgentSpec(agent_types=2, system_len=200, question_len=40, tool_len=60, output_len=8, turns=3,
                     turns_spread=0, pause_mean=0.5, fanout_share=0.3)
    wl = AgentWorkload(spec, MODEL, seed=0)
    results, elapsed = await run_agent_stage(fleet.oracle_url + "/v1/chat/completions", wl, concurrency=3,
                                             sessions=4, time_scale=scale, request_timeout=10.0, stage_timeout=30.0)
    await fill_pods(results, fleet.urls)
    row = summarize_agent("agent", "oracle", 3, results, elapsed)
    assert row.finished == 4 and row.errors == 0 and row.stayed is not None
    for res in results:
        lead = [c for c in res.calls if c.branch == 0]
        assert [c.turn for c in lead] == [0, 1, 2]
        assert lead[0].prompt_tokens < lead[1].prompt_tokens < lead[2].prompt_tokens
        assert all(c.cached_tokens >= 200 for c in lead[1:])  # the previous turn's context was reused
        assert all(c.output_tokens == 8 and c.pod for c in res.calls)
    assert json.dumps(row.__dict__)

    plan = Workload(WorkloadSpec(num_groups=2, system_prompt_len=64, question_len=8, output_len=4), MODEL).plan(
        20, 2.0, 40, slo=SloMix.parse("0.5:5000,0.5:20000"))
    res, elapsed = await run_stage(fleet.oracle_url + "/v1/chat/completions", plan, scale, 10.0, 15.0)
    slo_row = summarize("slo", "oracle", 20, res, elapsed)
    assert slo_row.slo_requests == len(plan) and slo_row.slo_attain_all == 1.0 and slo_row.goodput


def test_multimodal_regime_shares_a_few_images_across_users() -> None:
    reg = regimes(FleetSpec())["multimodal"]
    assert {"envoy-rr", "vllm-router", "sglang-router", "pointsman", "pointsman-precise", "oracle"} <= set(
        reg.routers)
    wl = Workload(reg.spec, MODEL, seed=2)
    plan = wl.plan(20, 60.0, 5000)
    assert plan == Workload(reg.spec, MODEL, seed=2).plan(20, 60.0, 5000)

    def image(p) -> str:
        return p.body["messages"][1]["content"][0]["image_url"]["url"]

    urls = [image(p) for p in plan]
    assert all(u.startswith("data:image/png;base64,") and len(u) > reg.spec.image_bytes for u in urls)
    counts = sorted((urls.count(u) for u in set(urls)), reverse=True)
    assert len(counts) <= reg.spec.images and counts[0] > 5 * counts[-1]  # a few popular images, a long tail
    assert len({(p.group, image(p)) for p in plan}) > 4 * 10  # the images go across the groups' users
    tokens, mm = tk.request_inputs(tk.API_CHAT, plan[0].body)
    assert len(mm) == 1 and mm[0][1] == tk.MM_TOKENS and len(tokens) < 1000  # the image is placeholders, not bytes
    text = Workload(WorkloadSpec(), MODEL).plan(20, 5.0, 50)
    assert all(isinstance(p.body["messages"][-1]["content"], str) for p in text)  # text regimes unchanged
