"""EndpointPickerConfig shell sections: applied or refused with a clear error, never dropped in silence."""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduling.api import (
    DEFAULT_BAND_MAX_BYTES,
    FCFS,
    GLOBAL_STRICT,
    ROUND_ROBIN,
    FlowControl,
    PriorityBand,
    Saturation,
    Scrape,
)
from scheduling.config import ConfigError, load_scheduler

BASE = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def load(**sections):
    plugins = sections.pop("plugins", [{"type": "queue-scorer"}])
    return load_scheduler({**BASE, "plugins": plugins, **sections}, rng=random.Random(0), name="cfg.yaml")


def test_defaults_without_sections():
    shell = load().shell
    assert shell.saturation == Saturation() and shell.scrape == Scrape() and shell.feature_gates == frozenset()


def test_feature_gates_are_validated_like_gie():
    assert load(featureGates=["dataLayer", "enableLegacyMetrics"]).shell.feature_gates == {"dataLayer",
                                                                                         "enableLegacyMetrics"}
    with pytest.raises(ConfigError, match=r"featureGates\[1\]: feature gate 'turbo' is unknown; known gates: "):
        load(featureGates=["dataLayer", "turbo"])


def test_flow_control_section_needs_its_feature_gate():
    with pytest.raises(ConfigError, match="flowControl: flowControl is configured but the flowControl feature gate"):
        load(flowControl={"maxRequests": 10})
    assert load().shell.flow_control is None


def test_flow_control_gate_alone_gives_gie_defaults():
    fc = load(featureGates=["flowControl"]).shell.flow_control
    assert fc == FlowControl()
    assert fc.max_bytes == 0 and fc.max_requests == 0 and fc.default_ttl_s == 0 and fc.usage_limit == 1.0
    band = fc.band(7)  # an unlisted priority gets the default band's template
    assert band == PriorityBand(7, DEFAULT_BAND_MAX_BYTES, 0, ROUND_ROBIN, FCFS)


def test_flow_control_section_is_applied():
    fc = load(
        featureGates=["flowControl"],
        plugins=[{"type": "queue-scorer"}, {"type": "global-strict-fairness-policy", "name": "strict"},
                 {"type": "static-usage-limit-policy", "name": "limit", "parameters": {"threshold": 0.8}}],
        schedulingProfiles=[{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}],
        flowControl={
            "maxBytes": "1Gi", "maxRequests": "1k", "defaultRequestTTL": "30s",
            "usageLimitPolicyPluginRef": "limit",
            "defaultPriorityBand": {"maxRequests": 50, "fairnessPolicyRef": "strict"},
            "priorityBands": [
                {"priority": 10, "maxRequests": 100, "maxBytes": "10Mi",
                 "fairnessPolicyRef": "round-robin-fairness-policy", "orderingPolicyRef": "fcfs-ordering-policy"},
                {"priority": -1, "maxRequests": 5},
            ],
        },
    ).shell.flow_control
    assert fc is not None
    assert (fc.max_bytes, fc.max_requests, fc.default_ttl_s, fc.usage_limit) == (2**30, 1000, 30.0, 0.8)
    assert fc.band(10) == PriorityBand(10, 10 * 2**20, 100, ROUND_ROBIN, FCFS)
    assert fc.band(-1) == PriorityBand(-1, DEFAULT_BAND_MAX_BYTES, 5, ROUND_ROBIN, FCFS)
    assert fc.band(3) == PriorityBand(3, DEFAULT_BAND_MAX_BYTES, 50, GLOBAL_STRICT, FCFS)
    assert fc.limit(-1) == fc.limit(0) == 0.8


def test_priority_usage_limit_policy_lowers_the_ceiling_of_sheddable_priorities():
    fc = load(
        featureGates=["flowControl"],
        plugins=[{"type": "queue-scorer"},
                 {"type": "priority-usage-limit-policy", "name": "reserve",
                  "parameters": {"sheddableThreshold": 0.75}}],
        schedulingProfiles=[{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}],
        flowControl={"usageLimitPolicyPluginRef": "reserve"},
    ).shell.flow_control
    assert fc is not None and (fc.limit(-3), fc.limit(0), fc.limit(7)) == (0.75, 1.0, 1.0)


@pytest.mark.parametrize("section, message", [
    ({"maxRequests": "lots"}, r"flowControl.maxRequests: expected a quantity such as 100, 1k or 1Gi, got 'lots'"),
    ({"maxBytes": -5}, r"flowControl.maxBytes: expected a non-negative quantity"),
    ({"defaultRequestTTL": "soon"}, r"flowControl.defaultRequestTTL: expected a duration"),
    ({"priorityBands": [{"maxRequests": 1}]}, r"priorityBands\[0\].priority: expected an integer priority"),
    ({"priorityBands": [{"priority": 1}, {"priority": 1}]}, r"priorityBands\[1\].priority: duplicate priority level 1"),
    ({"priorityBands": [{"priority": 1, "orderingPolicyRef": "edf-ordering-policy"}]},
     r"orderingPolicyRef: edf-ordering-policy \(earliest-deadline-first ordering\) is not implemented"),
    ({"priorityBands": [{"priority": 1, "fairnessPolicyRef": "queue-scorer"}]},
     r"fairnessPolicyRef: plugin 'queue-scorer' \(queue-scorer\) is not a fairness policy"),
    ({"priorityBands": [{"priority": 1, "fairnessPolicyRef": "fair-ish"}]},
     r"no fairness policy named 'fair-ish'; declare one in plugins, or use one of global-strict-fairness-policy, "
     r"round-robin-fairness-policy"),
    ({"usageLimitPolicyPluginRef": "mine"}, r"no usage limit policy named 'mine'"),
    ({"maxQueue": 3}, r"flowControl.maxQueue: unknown field"),
])
def test_flow_control_errors_name_the_field(section, message):
    with pytest.raises(ConfigError, match=message):
        load(featureGates=["flowControl"], flowControl=section)


def test_concurrency_detector_as_the_saturation_detector():
    shell = load(
        plugins=[{"type": "queue-scorer"},
                 {"type": "concurrency-detector", "name": "cd",
                  "parameters": {"maxConcurrency": 16, "headroom": 0.25}}],
        schedulingProfiles=[{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}],
        saturationDetector={"pluginRef": "cd"},
    ).shell
    assert shell.saturation == Saturation(headroom=0.25, detector="concurrency", max_concurrency=16)


def test_saturation_detector_by_plugin_ref_and_inline():
    shell = load(
        plugins=[{"type": "queue-scorer"},
                 {"type": "utilization-detector", "name": "sat",
                  "parameters": {"queueDepthThreshold": 3, "kvCacheUtilThreshold": 0.5,
                                 "metricsStalenessThreshold": "150ms", "headroom": 0.2}}],
        schedulingProfiles=[{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}],
        saturationDetector={"pluginRef": "sat"},
    ).shell
    assert shell.saturation == Saturation(3.0, 0.5, pytest.approx(0.15), 0.2)
    inline = load(saturationDetector={"queueDepthThreshold": 8, "metricsStalenessThreshold": "1s"}).shell
    assert inline.saturation == Saturation(8.0, 0.8, 1.0, 0.0)


def test_saturation_detector_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"saturationDetector.pluginRef: no plugin named 'nope'"):
        load(saturationDetector={"pluginRef": "nope"})
    with pytest.raises(ConfigError, match=r"saturationDetector.pluginRef: plugin 'queue-scorer' \(queue-scorer\) "
                                          r"cannot be used here; expected a utilization-detector or a "
                                          r"concurrency-detector"):
        load(saturationDetector={"pluginRef": "queue-scorer"})
    with pytest.raises(ConfigError, match=r"saturationDetector.metricsStalenessThreshold: expected a duration"):
        load(saturationDetector={"metricsStalenessThreshold": "soon"})
    with pytest.raises(ConfigError, match=r"saturationDetector.queueDepth: unknown parameter"):
        load(saturationDetector={"queueDepth": 3})


def test_data_layer_configures_scraping():
    plugins = [
        {"type": "queue-scorer"},
        {"type": "metrics-data-source", "name": "src",
         "parameters": {"scheme": "https", "path": "/custom/metrics", "insecureSkipVerify": False}},
        {"type": "core-metrics-extractor", "name": "ex",
         "parameters": {"engineLabelKey": "engine", "defaultEngine": "sglang"}},
    ]
    profiles = [{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}]
    sources = {"sources": [{"pluginRef": "src", "extractors": [{"pluginRef": "ex"}]}]}
    for key in ("dataLayer", "data"):  # llm-d's name and GIE's older one
        shell = load(plugins=plugins, schedulingProfiles=profiles, **{key: sources}).shell
        assert shell.scrape == Scrape("https", "/custom/metrics", False, "engine", "sglang")


def test_data_layer_errors():
    with pytest.raises(ConfigError, match=r"dataLayer.discovery: endpoint discovery plugins are not supported"):
        load(dataLayer={"discovery": {"pluginRef": "x"}})
    with pytest.raises(ConfigError, match=r"dataLayer.sources\[0\].pluginRef: plugin 'queue-scorer'.*expected a "
                                          r"metrics-data-source"):
        load(dataLayer={"sources": [{"pluginRef": "queue-scorer"}]})
    with pytest.raises(ConfigError, match=r"engineConfigs: custom engine metric specs are not supported"):
        load(plugins=[{"type": "core-metrics-extractor", "parameters": {"engineConfigs": [{"name": "x"}]}}])
    with pytest.raises(ConfigError, match="give either dataLayer or its older name data"):
        load(dataLayer={}, data={})
    with pytest.raises(ConfigError, match="injectDefaults false would route blind"):
        load(dataLayer={"injectDefaults": False})


def test_parser_section():
    load(plugins=[{"type": "queue-scorer"}, {"type": "openai-parser"}],
         schedulingProfiles=[{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}],
         parser={"pluginRef": "openai-parser"})
    with pytest.raises(ConfigError, match=r"parser.pluginRef: no plugin named 'vertexai-parser'"):
        load(parser={"pluginRef": "vertexai-parser"})
    with pytest.raises(ConfigError, match=r"plugins\[1\].type: unknown plugin type 'vllmgrpc-parser'"):
        load(plugins=[{"type": "queue-scorer"}, {"type": "vllmgrpc-parser"}])


def test_llm_d_request_handler_section():
    """llm-d-router's ConfigMap names its parsers under requestHandler (its chart's `router.epp.parsers`)."""
    parser = [{"type": "queue-scorer"}, {"type": "openai-parser"}]
    profiles = [{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}]
    load(plugins=parser, schedulingProfiles=profiles, requestHandler={"parsers": [{"pluginRef": "openai-parser"}]})
    with pytest.raises(ConfigError, match=r"requestHandler.parsers\[0\].pluginRef: no plugin named 'x-parser'"):
        load(plugins=parser, schedulingProfiles=profiles, requestHandler={"parsers": [{"pluginRef": "x-parser"}]})
    with pytest.raises(ConfigError, match=r"requestHandler.parsers\[0\].pluginRef: plugin .* expected a openai-parser"):
        load(plugins=parser, schedulingProfiles=profiles, requestHandler={"parsers": [{"pluginRef": "queue-scorer"}]})
    with pytest.raises(ConfigError, match=r"requestHandler.payloadProcessors: unknown field; expected one of parsers"):
        load(plugins=parser, schedulingProfiles=profiles, requestHandler={"payloadProcessors": []})


def test_system_plugins_cannot_join_a_profile():
    with pytest.raises(ConfigError, match="of kind 'system' cannot be used in a profile"):
        load(plugins=[{"type": "queue-scorer"}, {"type": "metrics-data-source"}],
             schedulingProfiles=[{"name": "default", "plugins": [{"pluginRef": "metrics-data-source"}]}])


def test_utilization_detector_is_also_a_filter():
    from sched_helpers import ctx, ep, req, state

    from scheduling.framework import create

    det = create("utilization-detector", params={"queueDepthThreshold": 4})
    fresh = [e.with_metrics(dataclasses.replace(e.metrics, updated_at=0.0)) for e in (ep(1, waiting=1), ep(2, waiting=9))]
    kept = det.filter(ctx(req("x"), fresh, now=0.1), list(fresh), state())
    assert [e.key for e in kept] == [fresh[0].key]
    # Metrics older than metricsStalenessThreshold count as saturated: with nothing fresh, nothing is filtered.
    assert det.filter(ctx(req("x"), fresh, now=5.0), list(fresh), state()) == fresh
