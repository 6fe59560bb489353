"""Config loading: EndpointPickerConfig, Heimdall SchedulingProfile, model bindings; good and bad documents."""

from __future__ import annotations

import random
import textwrap

import pytest
from sched_helpers import ctx, ep, req

from scheduling.config import ConfigError, ModelScheduler, load_scheduler
from scheduling.framework.model_scheduler import ModelScheduler as MS

RNG = random.Random


def load(text: str, tmp_path, name="sched.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return load_scheduler(path, rng=RNG(0))


def profile_shape(ps, name="default"):
    prof = ps.profiles[name]
    return (
        [f.type_name for f in prof.filters],
        [(s.type_name, w) for s, w in prof.scorers],
        prof.picker.type_name,
    )


def test_builtin_default():
    s = load_scheduler(None, rng=RNG(0))
    assert isinstance(s, ModelScheduler) and s is not None and isinstance(s, MS)
    assert profile_shape(s.fallback) == ([], [("estimated-latency-scorer", 1.0), ("agent-session-scorer", 1.0)],
                                         "max-score-picker")
    res = s.schedule(ctx(req("hi"), [ep(1)]))
    assert res.profile == "default"


EPP = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: my-prefix
  type: prefix-cache-scorer
  parameters: {blockSizeTokens: 16, maxPrefixBlocksToMatch: 256, lruCapacityPerServer: 31250}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: my-prefix
    weight: 3
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
"""


def test_epp_config_reference_example(tmp_path):
    s = load(EPP, tmp_path)
    ps = s.fallback
    assert type(ps.handler).type_name == "single-profile-handler"
    assert profile_shape(ps) == (
        [],
        [("prefix-cache-scorer", 3.0), ("queue-scorer", 1.0)],
        "max-score-picker",
    )


def test_epp_defaulting_no_profiles_and_no_picker(tmp_path):
    s = load(
        """
        apiVersion: llm-d.ai/v1alpha1
        kind: EndpointPickerConfig
        plugins:
        - type: decode-filter
        - type: kv-cache-utilization-scorer
        - type: queue-scorer
        """,
        tmp_path,
    )
    assert profile_shape(s.fallback) == (
        ["decode-filter"],
        [("kv-cache-utilization-scorer", 1.0), ("queue-scorer", 1.0)],
        "max-score-picker",
    )


def test_epp_pd_config(tmp_path):
    s = load(
        """
        apiVersion: llm-d.ai/v1alpha1
        kind: EndpointPickerConfig
        plugins:
        - type: pd-profile-handler
          parameters: {nonCachedTokens: 100}
        - type: prefill-filter
        - type: decode-filter
        - type: prefix-cache-scorer
        - type: max-score-picker
        schedulingProfiles:
        - name: prefill
          plugins: [{pluginRef: prefill-filter}, {pluginRef: prefix-cache-scorer, weight: 2}]
        - name: decode
          plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: max-score-picker}]
        """,
        tmp_path,
    )
    assert set(s.fallback.profiles) == {"prefill", "decode"}
    assert profile_shape(s.fallback, "prefill")[2] == "max-score-picker"


BAD_EPP = [
    ("apiVersion: v9\nkind: EndpointPickerConfig\n", "apiVersion", "expected one of"),
    (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: nope-scorer\n",
        "plugins[0].type",
        "unknown plugin type 'nope-scorer'",
    ),
    (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: load-aware-scorer\n"
        "  parameters: {queueThreshold: many}\n",
        "plugins[0].parameters.queueThreshold",
        "expected an integer",
    ),
    (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
        "  parameters: {bogus: 1}\n",
        "plugins[0].parameters.bogus",
        "unknown parameter",
    ),
    (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: missing\n",
        "schedulingProfiles[0].plugins[0].pluginRef",
        "no plugin named 'missing'",
    ),
    (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n    weight: heavy\n",
        "schedulingProfiles[0].plugins[0].weight",
        "non-negative number",
    ),
    (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
        "- type: queue-scorer\n",
        "plugins[1].name",
        "duplicate plugin name",
    ),
    (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
        "schedulingProfiles:\n- name: a\n  plugins: [{pluginRef: queue-scorer}]\n"
        "- name: b\n  plugins: [{pluginRef: queue-scorer}]\n",
        "plugins",
        "need a profile handler",
    ),
    (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins: {}\n",
        "plugins",
        "expected a list",
    ),
    ("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nsurprise: 1\n", "surprise", "unknown field"),
    ("kind: Nonsense\n", "kind", "expected one of"),
    ("a: [1\n", "line", "invalid YAML"),
]


@pytest.mark.parametrize(("text", "field", "what"), BAD_EPP)
def test_bad_epp_config_names_file_field_and_expectation(tmp_path, text, field, what):
    with pytest.raises(ConfigError) as err:
        load(text, tmp_path, name="bad.yaml")
    msg = str(err.value)
    assert "bad.yaml" in msg and field in msg and what in msg, msg


SP_CHAT = """
apiVersion: heimdall.moreh.io/v1alpha1
kind: SchedulingProfile
metadata: {name: chat-default}
spec:
  profileHandler: e2e
  plugins:
  - type: prefix-cache-scorer
    config: {transform: logistic}
  - type: inflight-requests-scorer
  - type: max-score-picker
  profiles:
    default:
      pluginRefs:
      - {name: prefix-cache-scorer, weight: 2}
      - {name: inflight-requests-scorer}
      - {name: max-score-picker}
"""

SP_PD = """
apiVersion: heimdall.moreh.io/v1alpha1
kind: SchedulingProfile
metadata: {name: long-pd}
spec:
  profileHandler: pd
  plugins:
  - type: kv-cache-utilization-scorer
  - type: waiting-requests-scorer
  profiles:
    prefill:
      pluginRefs: [{name: waiting-requests-scorer}]
    decode:
      pluginRefs: [{name: kv-cache-utilization-scorer, weight: 2}]
"""

SP_LEAST = """
apiVersion: heimdall.moreh.io/v1alpha1
kind: SchedulingProfile
metadata: {name: least-queue}
spec:
  profileHandler: e2e
  plugins: [{type: waiting-requests-scorer}]
  profiles:
    default:
      pluginRefs: [{name: waiting-requests-scorer}]
"""


def test_heimdall_e2e_profile(tmp_path):
    s = load(
        SP_CHAT + "---\n" + "apiVersion: pointsman.io/v1alpha1\nkind: ModelBinding\nspec:\n"
        "  schedulingProfiles: [{model: default, profile: chat-default}]\n",
        tmp_path,
    )
    ps = s.schedulers["chat-default"]
    assert profile_shape(ps) == (
        [],
        [("prefix-cache-scorer", 2.0), ("inflight-requests-scorer", 1.0)],
        "max-score-picker",
    )
    prefix = ps.profiles["default"].scorers[0][0]
    assert prefix.params.transform == "logistic" and prefix.normalization == "longestPrefix"
    assert s.schedule(ctx(req("x", model="anything"), [ep(1)])).profile == "chat-default"


def test_heimdall_pd_profile_internal_role_filters(tmp_path):
    s = load(
        SP_PD + "---\napiVersion: pointsman.io/v1alpha1\nkind: ModelBinding\nspec:\n"
        "  schedulingProfiles: [{model: big, profile: long-pd}]\n",
        tmp_path,
    )
    ps = s.schedulers["long-pd"]
    assert profile_shape(ps, "prefill") == (["prefill-filter"], [("queue-scorer", 1.0)], "max-score-picker")
    assert profile_shape(ps, "decode") == (
        ["decode-filter"],
        [("kv-block-occupancy-scorer", 2.0)],
        "max-score-picker",
    )
    assert ps.handler.params.decider == "always"


BAD_SP = [
    (
        SP_CHAT.replace("profileHandler: e2e", "profileHandler: both"),
        "spec.profileHandler",
        "expected one of e2e, pd",
    ),
    (SP_CHAT.replace("name: chat-default", "name: ''"), "metadata.name", "SchedulingProfile name"),
    (
        SP_CHAT.replace("{transform: logistic}", "{transform: cubic}"),
        "spec.plugins[0].config.transform",
        "'linear'",
    ),
    (
        SP_CHAT.replace("{name: inflight-requests-scorer}", "{name: ghost}"),
        "spec.profiles.default.pluginRefs[1].name",
        "no plugin named 'ghost'",
    ),
    (SP_CHAT.replace("    default:", "    decode:"), "spec.profiles.decode", "expects profiles default"),
    (
        SP_PD.replace("    prefill:\n      pluginRefs: [{name: waiting-requests-scorer}]\n", ""),
        "spec.profiles",
        "needs a profile named 'prefill'",
    ),
    (
        SP_CHAT.replace("weight: 2", "weight: -1"),
        "spec.profiles.default.pluginRefs[0].weight",
        "non-negative",
    ),
    (
        SP_CHAT.replace("  - type: max-score-picker\n", "  - type: max-score-picker\n    name: ''\n"),
        "spec.plugins[2].name",
        "non-empty plugin name",
    ),
]


@pytest.mark.parametrize(("text", "field", "what"), BAD_SP)
def test_bad_scheduling_profile(tmp_path, text, field, what):
    with pytest.raises(ConfigError) as err:
        load(text, tmp_path, name="heimdall.yaml")
    msg = str(err.value)
    assert "heimdall.yaml" in msg and field in msg and what in msg, msg


AIGW = """
apiVersion: heimdall.moreh.io/v1alpha1
kind: AIGateway
metadata: {name: gw, namespace: ai}
spec:
  replicas: 2
  schedulingProfiles:
  - {model: default, profile: chat-default}
  - {model: big, profile: long-pd}
  - {model: small, profile: least-queue}
  - {model: big, profile: least-queue}
"""


def test_model_binding_in_order_with_default_anywhere(tmp_path):
    s = load("---\n".join([SP_CHAT, SP_PD, SP_LEAST, AIGW]), tmp_path)
    assert s.scheduler_for("big").name == "long-pd"  # first entry for a model wins
    assert s.scheduler_for("small").name == "least-queue"
    assert s.scheduler_for("other").name == "chat-default"  # `default` listed first, but lowest priority
    assert s.scheduler_for("alias", target_model="small").name == "least-queue"
    # different models in one pool get different scheduling
    eps = [ep(1, waiting=0, labels={"mif.moreh.io/role": "decode"}), ep(2, waiting=9)]
    assert s.schedule(ctx(req("x", model="small"), eps)).profile == "least-queue"
    assert s.schedule(ctx(req("x", model="big"), eps)).profile == "long-pd"
    assert s.schedule(ctx(req("x", model="zzz"), eps)).profile == "chat-default"


def test_no_binding_match_uses_builtin_default(tmp_path):
    s = load(
        SP_LEAST + "---\napiVersion: pointsman.io/v1alpha1\nkind: ModelBinding\nspec:\n"
        "  schedulingProfiles: [{model: small, profile: least-queue}]\n",
        tmp_path,
    )
    assert s.schedule(ctx(req("x", model="other"), [ep(1)])).profile == "default"
    assert s.default is s.fallback
    assert profile_shape(s.fallback)[1] == [("estimated-latency-scorer", 1.0), ("agent-session-scorer", 1.0)]


def test_epp_config_is_fallback_with_bindings(tmp_path):
    s = load(
        EPP.replace("kind: EndpointPickerConfig", "kind: EndpointPickerConfig\nmetadata: {name: pool-cfg}")
        + "---\n"
        + SP_LEAST
        + "---\napiVersion: pointsman.io/v1alpha1\nkind: ModelBinding\nspec:\n"
        "  schedulingProfiles: [{model: small, profile: least-queue}]\n",
        tmp_path,
    )
    assert s.schedule(ctx(req("x", model="other"), [ep(1)])).profile == "pool-cfg"
    assert s.schedule(ctx(req("x", model="small"), [ep(1)])).profile == "least-queue"


def test_binding_to_unknown_profile(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(SP_LEAST + "---\n" + AIGW, tmp_path, name="gw.yaml")
    msg = str(err.value)
    assert (
        "gw.yaml (document 2)" in msg
        and "spec.schedulingProfiles[0].profile" in msg
        and "chat-default" in msg
    )


def test_binding_entry_missing_model(tmp_path):
    bad = (
        "apiVersion: pointsman.io/v1alpha1\nkind: ModelBinding\nspec:\n  schedulingProfiles: [{profile: x}]\n"
    )
    with pytest.raises(
        ConfigError, match=r"b.yaml: spec.schedulingProfiles\[0\].model: expected a model name"
    ):
        load(bad, tmp_path, name="b.yaml")


def test_load_from_dicts_and_missing_file(tmp_path):
    import yaml

    s = load_scheduler(list(yaml.safe_load_all(SP_LEAST)), rng=RNG(0))
    assert "least-queue" in s.schedulers
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_scheduler(tmp_path / "nope.yaml", rng=RNG(0))


def test_served_model_candidates_only():
    s = load_scheduler(None, rng=RNG(0))
    a = ep(1, models=frozenset({"llama"}), waiting=50)
    b = ep(2, models=frozenset({"qwen"}))
    assert s.schedule(ctx(req("x", model="llama"), [a, b])).primary == a
    from scheduling.types import SchedulingError

    with pytest.raises(SchedulingError) as err:
        s.schedule(ctx(req("x", model="mistral"), [a, b]))
    assert err.value.code.http_status == 404  # an unknown model is NotFound, not overload


def test_a_lone_scheduling_profile_is_the_default():
    doc = {"apiVersion": "heimdall.moreh.io/v1alpha1", "kind": "SchedulingProfile", "metadata": {"name": "mine"},
           "spec": {"profileHandler": "e2e", "plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker"}],
                    "profiles": {"default": {"pluginRefs": [{"name": "queue-scorer"}, {"name": "max-score-picker"}]}}}}
    s = load_scheduler(doc, rng=RNG(0))
    assert s.schedule(ctx(req("x"), [ep(1), ep(2)])).profile == "mine"
