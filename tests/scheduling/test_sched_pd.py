"""P/D disaggregation: decode first, prefix-based decider, one-role fallback, decision counts."""

from __future__ import annotations

import random
import textwrap

import pytest
from sched_helpers import ctx, ep, match, req

from scheduling.config import load_scheduler
from scheduling.types import ErrorCode, SchedulingError

ROLE = "llm-d.ai/role"


def pd_config(non_cached: int, extra: str = "") -> list[dict]:
    import yaml

    text = textwrap.dedent(
        f"""
        apiVersion: llm-d.ai/v1alpha1
        kind: EndpointPickerConfig
        plugins:
        - type: pd-profile-handler
          parameters: {{nonCachedTokens: {non_cached}{extra}}}
        - type: prefill-filter
        - type: decode-filter
        - type: prefix-cache-scorer
        - type: queue-scorer
        schedulingProfiles:
        - name: prefill
          plugins: [{{pluginRef: prefill-filter}}, {{pluginRef: queue-scorer}}]
        - name: decode
          plugins: [{{pluginRef: decode-filter}}, {{pluginRef: prefix-cache-scorer, weight: 3}}, {{pluginRef: queue-scorer}}]
        """
    )
    return list(yaml.safe_load_all(text))


def pool():
    return [
        ep(1, labels={ROLE: "decode"}, waiting=1),
        ep(2, labels={ROLE: "decode"}, waiting=0),
        ep(3, labels={ROLE: "prefill"}, waiting=2),
        ep(4, labels={ROLE: "prefill"}, waiting=0),
    ]


def test_long_uncached_prompt_is_disaggregated():
    s = load_scheduler(pd_config(100), rng=random.Random(1))
    eps = pool()
    c = ctx(req("x" * 4 * 500), eps)  # 500 tokens, nothing cached
    res = s.schedule(c)
    assert res.decision == "prefill-decode"
    assert res.primary == eps[1] and res.prefill == eps[3]
    assert set(res.profile_results) == {"decode", "prefill"}
    assert s.decision_counts == {}  # counted when committed, not when computed (a dry run counts nothing)
    s.pre_request(c, res)
    assert s.decision_counts == {("llama", "prefill-decode"): 1}


def test_short_prompt_stays_decode_only():
    s = load_scheduler(pd_config(100), rng=random.Random(1))
    c = ctx(req("x" * 4 * 50), pool())
    res = s.schedule(c)
    assert res.decision == "decode-only" and res.prefill is None
    s.pre_request(c, res)
    assert s.decision_counts == {("llama", "decode-only"): 1}


def test_cached_prefix_on_decode_endpoint_avoids_prefill():
    s = load_scheduler(pd_config(100), rng=random.Random(1))
    eps = pool()
    prompt = "y" * 4 * 1000  # 1000 tokens
    c = ctx(req(prompt), eps)
    first = s.schedule(c)
    assert first.decision == "prefill-decode"
    s.pre_request(c, first)
    # same prompt + 60 tokens: the decode endpoint holds 62 of 63 blocks; uncached = 1060 − 992 < 100
    second = s.schedule(ctx(req(prompt + "z" * 240, rid="r2"), eps))
    assert second.primary == first.primary
    assert second.decision == "decode-only"


def test_threshold_zero_means_never():
    s = load_scheduler(pd_config(0), rng=random.Random(1))
    assert s.schedule(ctx(req("x" * 40000), pool())).decision == "decode-only"


def test_no_decode_pick_fails():
    s = load_scheduler(pd_config(100), rng=random.Random(1))
    eps = [ep(1, labels={ROLE: "decode"})]
    with pytest.raises(SchedulingError) as err:
        s.schedule(ctx(req("x"), [ep(1, labels={ROLE: "decode"}, models=frozenset({"other"}))]))
    assert err.value.code is ErrorCode.NOT_FOUND  # nothing serves the model: 404, not overload
    assert s.schedule(ctx(req("x"), eps)).primary == eps[0]


def test_only_prefill_role_serves_end_to_end():
    s = load_scheduler(pd_config(1), rng=random.Random(1))
    eps = [ep(3, labels={ROLE: "prefill"}, waiting=2), ep(4, labels={ROLE: "prefill"})]
    res = s.schedule(ctx(req("x" * 4000), eps))
    assert res.primary == eps[1] and res.prefill is None and res.decision == "decode-only"


def test_only_decode_role_serves_end_to_end():
    s = load_scheduler(pd_config(1), rng=random.Random(1))
    eps = [ep(1, labels={ROLE: "decode"})]
    res = s.schedule(ctx(req("x" * 4000), eps))
    assert res.primary == eps[0] and res.prefill is None and res.decision == "decode-only"


def test_pd_group_pairing():
    s = load_scheduler(pd_config(1, ", pdGroupLabel: group"), rng=random.Random(1))
    eps = [
        ep(1, labels={ROLE: "decode", "group": "a"}, waiting=0),
        ep(2, labels={ROLE: "decode", "group": "b"}, waiting=5),
        ep(3, labels={ROLE: "prefill", "group": "b"}, waiting=0),
        ep(4, labels={ROLE: "prefill", "group": "a"}, waiting=3),
    ]
    res = s.schedule(ctx(req("x" * 4000), eps))
    assert res.primary == eps[0] and res.prefill == eps[3]


def test_heimdall_pd_always_disaggregates_and_records_prefill():
    import yaml

    doc = yaml.safe_load(
        """
        apiVersion: heimdall.moreh.io/v1alpha1
        kind: SchedulingProfile
        metadata: {name: pd}
        spec:
          profileHandler: pd
          plugins: [{type: prefix-cache-scorer}, {type: waiting-requests-scorer}]
          profiles:
            prefill: {pluginRefs: [{name: waiting-requests-scorer}]}
            decode: {pluginRefs: [{name: prefix-cache-scorer}, {name: waiting-requests-scorer}]}
        """
    )
    binding = {
        "apiVersion": "pointsman.io/v1alpha1",
        "kind": "ModelBinding",
        "spec": {"schedulingProfiles": [{"model": "llama", "profile": "pd"}]},
    }
    s = load_scheduler([doc, binding], rng=random.Random(0))
    eps = [ep(1, labels={"mif.moreh.io/role": "decode"}), ep(2, labels={"mif.moreh.io/role": "prefill"})]
    c = ctx(req("hello" * 100), eps)
    res = s.schedule(c)
    assert res.decision == "prefill-decode" and res.prefill == eps[1] and res.profile == "pd"
    s.pre_request(c, res)
    prefix = s.schedulers["pd"].profiles["decode"].scorers[0][0]
    from scheduling.prefix import block_hashes

    assert match(prefix.prefix.index, block_hashes("hello" * 100, "llama")) == {eps[0].key: 8, eps[1].key: 8}
