"""Property tests: scores stay in [0, 1], pickers return only candidates, a fixed seed fixes the decision."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import ctx, ep, plugin, req

from scheduling.api import InflightLoad
from scheduling.config import load_scheduler
from scheduling.framework import Scorer
from scheduling.framework.registry import plugin_types

ROLES = ["decode", "prefill", "both", "e2e", "encode", ""]

endpoint_st = st.builds(
    lambda i, w, r, kv, role, lo, width, omt, act, wt, ml, gb: ep(
        i,
        waiting=w,
        running=r,
        kv=kv,
        labels={
            **({"llm-d.ai/role": role} if role else {}),
            "llm-d.ai/context-length-range": f"{lo}-{lo + width}",
            "mif.moreh.io/aigateway.optimal-min-tokens": str(omt),
        },
        active_loras=frozenset(act),
        waiting_loras=frozenset(wt),
        max_lora=ml,
        num_gpu_blocks=gb,
        block_size=16 if gb else None,
    ),
    st.integers(0, 10_000),
    st.integers(0, 300),
    st.integers(0, 300),
    st.floats(0, 1),
    st.sampled_from(ROLES),
    st.integers(0, 5000),
    st.integers(0, 100_000),
    st.integers(0, 20_000),
    st.sets(st.sampled_from("abc"), max_size=2),
    st.sets(st.sampled_from("abc"), max_size=2),
    st.integers(0, 3),
    st.one_of(st.none(), st.integers(0, 5000)),
)

pool_st = st.lists(endpoint_st, min_size=1, max_size=12, unique_by=lambda e: e.key)
request_st = st.builds(
    lambda p, lora, sid: req(p, lora=lora, headers={"x-session-id": sid} if sid else {}),
    st.text(max_size=600),
    st.one_of(st.none(), st.sampled_from("abc")),
    st.one_of(st.none(), st.sampled_from(["s1", "s2"])),
)

SCORERS = sorted(name for name, cls in plugin_types().items() if issubclass(cls, Scorer))


@settings(max_examples=60, deadline=None)
@given(pool=pool_st, request=request_st, loads=st.lists(st.integers(0, 50), min_size=12, max_size=12))
def test_every_scorer_returns_one_value_in_unit_interval(pool, request, loads):
    inflight = {e.key: InflightLoad(n, n * 100_000) for e, n in zip(pool, loads, strict=False)}
    c = ctx(request, pool, inflight=inflight, now=5.0)
    for name in SCORERS:
        for dialect in ("epp", "heimdall"):
            scorer = plugin(name, dialect=dialect)
            values = list(scorer.score(c, list(pool), {"rng": random.Random(0)}))
            assert len(values) == len(pool), name
            assert all(0.0 <= v <= 1.0 for v in values), (name, values)


@settings(max_examples=60, deadline=None)
@given(
    pool=pool_st,
    totals=st.lists(st.floats(0, 10), min_size=12, max_size=12),
    k=st.integers(1, 5),
    seed=st.integers(0, 99),
)
def test_pickers_return_distinct_candidates(pool, totals, k, seed):
    totals = totals[: len(pool)]
    for name in ("max-score-picker", "random-picker", "weighted-random-picker"):
        p = plugin(name, {"maxNumOfEndpoints": k})
        got = p.pick(ctx(req(), pool), list(pool), totals, random.Random(seed))
        assert 1 <= len(got) <= min(k, len(pool))
        assert len(set(got)) == len(got)
        assert all(0 <= i < len(pool) for i in got)


@settings(max_examples=40, deadline=None)
@given(
    pool=pool_st, prompts=st.lists(st.text(max_size=300), min_size=1, max_size=6), seed=st.integers(0, 1000)
)
def test_fixed_seed_same_decisions(pool, prompts, seed):
    def run():
        s = load_scheduler(None, rng=random.Random(seed))
        out = []
        for i, p in enumerate(prompts):
            c = ctx(req(p, rid=f"r{i}"), pool, now=float(i))
            res = s.schedule(c)
            s.pre_request(c, res)
            out.append(res.primary.key)
        return out

    first = run()
    assert run() == first
    assert set(first) <= {e.key for e in pool}
