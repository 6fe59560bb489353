"""One formula test (or more) per filter plugin."""

from __future__ import annotations

import random

import pytest
from sched_helpers import ctx, ep, plugin, req, state

from scheduling.framework import ConfigError


def keys(eps):
    return [e.key for e in eps]


def run(f, c, st=None):
    return f.filter(c, list(c.candidates), st if st is not None else state())


def test_label_selector_match_labels_and_expressions():
    a = ep(1, labels={"tier": "gold", "zone": "a"})
    b = ep(2, labels={"tier": "silver", "zone": "b"})
    c_ = ep(3, labels={"tier": "gold"})
    d = ep(4, labels={})
    f = plugin("label-selector-filter", {"matchLabels": {"tier": "gold"}})
    assert keys(run(f, ctx(req(), [a, b, c_, d]))) == keys([a, c_])
    exprs = [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, [a, b]),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, [b, c_, d]),
        ({"key": "zone", "operator": "Exists"}, [a, b]),
        ({"key": "zone", "operator": "DoesNotExist"}, [c_, d]),
    ]
    for expr, want in exprs:
        f = plugin("label-selector-filter", {"matchExpressions": [expr]})
        assert keys(run(f, ctx(req(), [a, b, c_, d]))) == keys(want), expr


def test_label_selector_bad_operator_names_field():
    with pytest.raises(ConfigError) as err:
        plugin("label-selector-filter", {"matchExpressions": [{"key": "x", "operator": "Maybe"}]})
    assert "test.yaml" in str(err.value)
    assert "plugins[0].parameters.matchExpressions[0].operator" in str(err.value)


def test_by_label_legacy():
    a = ep(1, labels={"pool": "x"})
    b = ep(2, labels={"pool": "y"})
    c_ = ep(3)
    f = plugin("by-label", {"label": "pool", "validValues": ["x"]})
    assert keys(run(f, ctx(req(), [a, b, c_]))) == keys([a])
    f = plugin("by-label", {"label": "pool", "validValues": ["x"], "allowsNoLabel": True})
    assert keys(run(f, ctx(req(), [a, b, c_]))) == keys([a, c_])
    with pytest.raises(ConfigError, match="parameters.label"):
        plugin("by-label", {"validValues": ["x"]})


ROLES = [
    "decode",
    "prefill",
    "prefill-decode",
    "both",
    "encode",
    "encode-prefill",
    "encode-prefill-decode",
    "e2e",
]


@pytest.mark.parametrize("label", ["llm-d.ai/role", "mif.moreh.io/role"])
def test_role_filters(label):
    eps = [ep(i, labels={label: r}) for i, r in enumerate(ROLES)] + [ep(99)]
    by_role = dict(zip([*ROLES, None], eps, strict=True))
    c = ctx(req(), eps)
    decode = keys(run(plugin("decode-filter"), c))
    assert decode == keys(
        [by_role[r] for r in ["decode", "prefill-decode", "both", "encode-prefill-decode", "e2e", None]]
    )
    prefill = keys(run(plugin("prefill-filter"), c))
    assert prefill == keys(
        [
            by_role[r]
            for r in ["prefill", "prefill-decode", "both", "encode-prefill", "encode-prefill-decode", "e2e"]
        ]
    )
    encode = keys(run(plugin("encode-filter"), c))
    assert encode == keys([by_role[r] for r in ["encode", "encode-prefill", "encode-prefill-decode"]])


def test_served_model_filter():
    a = ep(1, models=frozenset({"llama"}))
    b = ep(2, models=frozenset({"qwen", "sql-lora"}))
    c_ = ep(3)  # serves anything
    f = plugin("served-model-filter")
    assert keys(run(f, ctx(req(model="llama"), [a, b, c_]))) == keys([a, c_])
    assert keys(run(f, ctx(req(model="x", target="qwen"), [a, b, c_]))) == keys([b, c_])
    assert keys(run(f, ctx(req(model="llama", lora="sql-lora"), [a, b, c_]))) == keys([a, b, c_])


def test_saturation_filter():
    ok = ep(1, waiting=4, kv=0.79)
    queued = ep(2, waiting=5, kv=0.1)
    full = ep(3, waiting=0, kv=0.8)
    f = plugin("saturation-filter")
    assert keys(run(f, ctx(req(), [ok, queued, full]))) == keys([ok])
    assert keys(run(f, ctx(req(), [queued, full]))) == keys([queued, full])  # none pass -> keep all
    f = plugin("low-queue-filter", {"queueThreshold": 10, "kvCacheThreshold": 0.9})
    assert keys(run(f, ctx(req(), [ok, queued, full]))) == keys([ok, queued, full])


def test_lora_affinity_filter():
    active = ep(1, active_loras=frozenset({"a"}), max_lora=2)
    waiting = ep(2, waiting_loras=frozenset({"a"}), max_lora=2)
    room = ep(3, active_loras=frozenset({"b"}), max_lora=2)
    full = ep(4, active_loras=frozenset({"b", "c"}), max_lora=2)
    f = plugin("lora-affinity-filter")
    assert keys(run(f, ctx(req(lora="a"), [active, waiting, room, full]))) == keys([active, waiting])
    assert keys(run(f, ctx(req(lora="z"), [room, full]))) == keys([room])
    assert keys(run(f, ctx(req(lora="z"), [full]))) == keys([full])
    assert keys(run(f, ctx(req(), [active, full]))) == keys([active, full])


def test_context_length_filter():
    short = ep(1, labels={"llm-d.ai/context-length-range": "0-1000"})
    long = ep(2, labels={"llm-d.ai/context-length-range": "1000-100000"})
    plain = ep(3)
    f = plugin("context-length-aware", {"enableFiltering": True})
    assert f.filtering_enabled
    prompt = "x" * 4 * 5000  # 5000 tokens
    assert keys(run(f, ctx(req(prompt), [short, long, plain]))) == keys([long, plain])


def test_prefix_affinity_filter_threshold_and_exploration():
    shared: dict = {}
    scorer = plugin("prefix-cache-scorer", shared=shared)
    f = plugin("prefix-cache-affinity-filter", shared=shared)
    a, b, c_ = ep(1), ep(2), ep(3)
    prompt = "S" * 64 * 10
    scorer.prefix.index.record(a.key, _hashes(prompt))  # all 10 blocks
    scorer.prefix.index.record(b.key, _hashes(prompt)[:7])  # 0.7 < 0.8
    st = {"rng": _NeverExplore()}
    assert keys(f.filter(ctx(req(prompt), [a, b, c_]), [a, b, c_], st)) == keys([a])
    assert keys(f.filter(ctx(req("other" * 50), [a, b, c_]), [a, b, c_], {"rng": _NeverExplore()})) == keys(
        [a, b, c_]
    )
    st = {"rng": _AlwaysExplore()}
    assert keys(f.filter(ctx(req(prompt), [a, b, c_]), [a, b, c_], st)) == keys([a, b, c_])
    hits = sum(
        len(f.filter(ctx(req(prompt), [a, b, c_]), [a, b, c_], {"rng": random.Random(s)})) == 3
        for s in range(3000)
    )
    assert 10 <= hits <= 60  # ~1% exploration


def _hashes(prompt):
    from scheduling.prefix import block_hashes

    return block_hashes(prompt, "llama")


class _NeverExplore(random.Random):
    def random(self):
        return 0.99


class _AlwaysExplore(random.Random):
    def random(self):
        return 0.0
