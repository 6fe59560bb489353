"""Kthena's scheduler plugin names resolve, each computing Kthena's formula."""

from __future__ import annotations

import random

import pytest
from sched_helpers import ctx, ep, plugin, req, scores

from scheduling.api import InflightLoad
from scheduling.config import load_scheduler
from scheduling.framework import ConfigError
from scheduling.framework.registry import canonical, lookup
from scheduling.types import Endpoint, Metrics

NAMES = ["least-request", "gpu-usage", "least-latency", "prefix-cache", "kvcache-aware", "lora-affinity"]


@pytest.mark.parametrize("name", NAMES)
def test_kthena_names_resolve_and_document_their_formula(name):
    cls = lookup(name)
    assert cls is not None, name
    doc = cls.__doc__ or __import__(cls.__module__, fromlist=["x"]).__doc__ or ""
    assert name in doc and ("score" in doc or "keep" in doc), doc


def test_gpu_usage_is_one_minus_kv_usage():
    assert canonical("gpu-usage") == "kv-cache-utilization-scorer"
    s = plugin("gpu-usage")
    assert scores(s, ctx(req(), [ep(0, kv=0.25), ep(1, kv=0.9)])) == pytest.approx([0.75, 0.1])


def test_least_request_formula_and_filter():
    s = plugin("least-request")
    cands = [ep(0, running=5), ep(1, running=0), ep(2, running=1), ep(3)]
    inflight = {cands[0].key: InflightLoad(5), cands[1].key: InflightLoad(2), cands[2].key: InflightLoad(3)}
    # base = f + 100·max(f − running, 0): 5, 202, 203, 0  -> (203 − base) / 203
    got = scores(s, ctx(req(), cands, inflight=inflight))
    assert got == pytest.approx([198 / 203, 1 / 203, 0.0, 1.0])
    assert scores(s, ctx(req(), cands)) == [1.0] * 4  # nothing in flight
    busy = [ep(0, waiting=10), ep(1, waiting=9)]
    assert [e.key for e in s.filter(ctx(req(), busy), busy, {})] == [busy[1].key]
    assert s.filtering_enabled
    assert not plugin("least-request", {"enableFiltering": False}).filtering_enabled


def lat(i: int, ttft: float | None, tpot: float | None) -> Endpoint:
    e = ep(i)
    m = e.metrics
    return e.with_metrics(Metrics(m.waiting, m.running, stale=False, ttft_s=ttft, tpot_s=tpot))


def test_least_latency_formula():
    s = plugin("least-latency")
    cands = [lat(0, 0.1, 0.01), lat(1, 0.3, 0.02), lat(2, 0.2, 0.03), lat(3, None, None)]
    # s_ttft = 1, 0, .5; s_tpot = 1, .5, 0; w = .5; unmeasured: .5
    assert scores(s, ctx(req(), cands)) == pytest.approx([1.0, 0.25, 0.25, 0.5])
    ttft_only = plugin("least-latency", {"TTFTTPOTWeightFactor": 1.0})
    assert scores(ttft_only, ctx(req(), cands)) == pytest.approx([1.0, 0.0, 0.5, 0.5])
    assert scores(s, ctx(req(), [lat(0, None, None)])) == [0.5]
    with pytest.raises(ConfigError):
        plugin("least-latency", {"TTFTTPOTWeightFactor": 1.5})


@pytest.mark.parametrize("name,params", [("prefix-cache", {}), ("kvcache-aware", {}),
                                         ("prefix-cache", {"blockSizeToHash": 32, "maxBlocksToMatch": 4})])
def test_prefix_scorers_score_matched_over_total_blocks(name, params):
    doc = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
           "plugins": [{"type": name, "parameters": params}, {"type": "max-score-picker"}],
           "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": name}, {"pluginRef": "max-score-picker"}]}]}
    sched = load_scheduler([doc], rng=random.Random(1))
    block = params.get("blockSizeToHash", 16 if name == "kvcache-aware" else 64)
    block_chars = block * (4 if name == "kvcache-aware" else 1)
    cands = [ep(0), ep(1)]
    first = "a" * block_chars * 3  # 3 blocks
    c = ctx(req(first), cands, explain=True)
    res = sched.schedule(c)
    sched.pre_request(c, res)  # the producer records the 3 blocks for the pick
    holder = res.primary.key
    second = first + "b" * block_chars  # 4 blocks, the first 3 held by `holder`
    c2 = ctx(req(second), cands, explain=True)
    res2 = sched.schedule(c2)
    [det] = [d for d in res2.profile_results["default"].details if d.kind == "scorer"]
    total = min(4, params.get("maxBlocksToMatch", 128))
    assert det.scores[holder] == pytest.approx(min(3, total) / total)
    assert sum(det.scores.values()) == pytest.approx(min(3, total) / total)
    assert res2.primary.key == holder


def test_prefix_cache_block_size_must_be_whole_tokens():
    with pytest.raises(ConfigError, match="multiple of 4 characters"):
        plugin("prefix-cache", {"blockSizeToHash": 30})


def test_lora_affinity_keeps_endpoints_serving_the_model():
    f = plugin("lora-affinity")
    cands = [ep(0, models=frozenset({"base", "sql-lora"})), ep(1, models=frozenset({"base"})),
             ep(2, active_loras=frozenset({"sql-lora"})), ep(3)]
    kept = f.filter(ctx(req(model="sql-lora"), cands), cands, {})
    assert [e.key for e in kept] == [cands[0].key, cands[2].key, cands[3].key]
