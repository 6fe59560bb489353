"""Every scheduling profile shipped in deploy/profiles loads strictly and makes a decision."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from scheduling.api import SchedulingContext
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, LLMRequest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "deploy" / "profiles").glob("*.yaml")), ids=lambda p: p.name)
def test_profile_loads_and_schedules(path):
    sched = load_scheduler(path, rng=random.Random(0))
    eps = [Endpoint(f"10.0.0.{i}:8000", f"10.0.0.{i}", 8000) for i in range(1, 4)]
    ctx = SchedulingContext(LLMRequest("r", "m", "m", prompt="hello " * 100), eps, {}, 1.0)
    result = sched.schedule(ctx)
    assert result.primary in eps
    sched.pre_request(ctx, result)
    sched.response_complete(ctx, result)


def test_builtin_default_is_the_shipped_estimated_latency_profile():
    """No config runs deploy/profiles/estimated-latency.yaml exactly: same plugins, weights and parameters."""
    builtin = load_scheduler(None, rng=random.Random(0)).fallback
    shipped = load_scheduler(ROOT / "deploy" / "profiles" / "estimated-latency.yaml", rng=random.Random(0)).fallback

    def shape(s):
        prof = s.profiles["default"]
        return ([(f.type_name, f.params) for f in prof.filters],
                [(sc.type_name, w, sc.params) for sc, w in prof.scorers], prof.picker.type_name)

    assert shape(builtin) == shape(shipped)


def test_gie_default_profile_is_gies():
    prof = load_scheduler(ROOT / "deploy" / "profiles" / "gie-default.yaml", rng=random.Random(0)).fallback
    scorers = [(s.type_name, w) for s, w in prof.profiles["default"].scorers]
    assert scorers == [("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0), ("prefix-cache-scorer", 3.0)]
