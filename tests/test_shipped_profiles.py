"""Every scheduling profile shipped in deploy/profiles loads strictly and makes a decision."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from scheduling.api import SchedulingContext
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, LLMRequest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", sorted((ROOT / "deploy" / "profiles").glob("*.yaml")), ids=lambda p: p.name)
def test_profile_loads_and_schedules(path):
    sched = load_scheduler(path, rng=random.Random(0))
    eps = [Endpoint(f"10.0.0.{i}:8000", f"10.0.0.{i}", 8000) for i in range(1, 4)]
    ctx = SchedulingContext(LLMRequest("r", "m", "m", prompt="hello " * 100), eps, {}, 1.0)
    result = sched.schedule(ctx)
    assert result.primary in eps
    sched.pre_request(ctx, result)
    sched.response_complete(ctx, result)
