"""GIE-style scheduling cases with the built-in default config and LoRA-aware configs."""

from __future__ import annotations

import random

from sched_helpers import GIE_DEFAULT, ctx, ep, req

from scheduling.config import load_scheduler


def test_lower_queue_and_lower_kv_wins():
    s = load_scheduler(GIE_DEFAULT, rng=random.Random(0))
    eps = [ep(1, waiting=10, kv=0.9), ep(2, waiting=2, kv=0.2), ep(3, waiting=5, kv=0.5)]
    for seed in range(5):
        s = load_scheduler(GIE_DEFAULT, rng=random.Random(seed))
        assert s.schedule(ctx(req("q"), eps)).primary == eps[1]


def test_active_lora_wins_despite_higher_kv():
    cfg = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "lora-affinity-scorer"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "queue-scorer"},
                    {"pluginRef": "kv-cache-utilization-scorer"},
                    {"pluginRef": "lora-affinity-scorer", "weight": 2},
                ],
            }
        ],
    }
    s = load_scheduler(cfg, rng=random.Random(0))
    with_lora = ep(1, waiting=1, kv=0.6, active_loras=frozenset({"sql"}), max_lora=1)
    without = ep(2, waiting=1, kv=0.1, active_loras=frozenset({"other"}), max_lora=1)
    assert s.schedule(ctx(req("q", model="sql", lora="sql"), [without, with_lora])).primary == with_lora


def test_nothing_shed_by_default():
    """The default config never drops a saturated endpoint: every candidate remains pickable."""
    s = load_scheduler(GIE_DEFAULT, rng=random.Random(0))
    eps = [ep(i, waiting=500, kv=0.99) for i in range(3)]
    picked = {s.schedule(ctx(req(f"q{i}"), eps)).primary.key for i in range(60)}
    assert picked == {e.key for e in eps}
    res = s.schedule(ctx(req("q"), eps, explain=True))
    assert res.profile_results["default"].totals.keys() == {e.key for e in eps}


def test_explain_on_default_profile():
    s = load_scheduler(GIE_DEFAULT, rng=random.Random(0))
    eps = [ep(1, waiting=4), ep(2, waiting=0)]
    res = s.schedule(ctx(req("hello"), eps, explain=True))
    pr = res.profile_results["default"]
    names = [d.name for d in pr.details]
    assert names == ["queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "max-score-picker"]
    assert pr.details[0].scores == {eps[0].key: 0.0, eps[1].key: 1.0}
    assert pr.totals[eps[1].key] == 2.0 + 2.0
