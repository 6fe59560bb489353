"""The multimodal regime on a virtual clock (bench/routing/mm_sim.py): Pointsman's scheduler in front of modelsim's
engines with media (placeholders and mm hashes), no processes. Deterministic, so a replay repeats itself exactly."""

from __future__ import annotations

import pytest

from bench.routing.mm_sim import MediaReplay, main, media_fleet, media_plan, rows


def _replay(policy: str, config: str | None = None) -> MediaReplay:
    replay = MediaReplay(policy, config, media_fleet(4, 1024, 0.05), 0)
    replay.run(media_plan([10.0, 25.0], 8.0, 0))
    return replay


def test_a_replay_is_deterministic_and_serves_every_request():
    plan = media_plan([10.0, 25.0], 8.0, 0)
    one, two = _replay("pointsman"), _replay("pointsman")
    assert len(one.done) == len(plan) and one.done == two.done
    assert not one.live and all(n == 0 for n in one.fleet.inflight.values())
    assert all(d.ttft > 0 and d.cached <= d.tokens for d in one.done)
    assert [r.split(" | ")[1] for r in rows("p", one.done, [10.0, 25.0])] == ["10", "25"]


def test_pointsman_gathers_an_image_where_it_is_cached():
    """Not vacuous: Pointsman keeps more of the prefix (the same image where it was computed) than round robin,
    and gives up a cached prefix for fewer requests."""
    points, rr = _replay("pointsman"), _replay("round-robin")
    hit = {name: sum(d.cached for d in r.done) / sum(d.tokens for d in r.done) for name, r in
           (("p", points), ("rr", rr))}
    assert hit["p"] > hit["rr"] + 0.05
    assert sum(d.lost for d in points.done) < sum(d.lost for d in rr.done) / 4


def test_the_command_line_prints_a_row_per_stage(capsys):
    assert main(["--qps", "5", "--duration", "2", "--policy", "round-robin"]) == 0
    assert "| round-robin (0) | 5 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--policy", "p:colour=red"])
