"""EndpointPickerConfig shell sections: applied or refused with a clear error, never dropped in silence."""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduling.api import Saturation, Scrape
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


def test_flow_control_is_refused_not_ignored():
    with pytest.raises(ConfigError, match="flowControl: flowControl is configured but the flowControl feature gate"):
        load(flowControl={"maxRequests": 10})
    with pytest.raises(ConfigError, match="flow control is not available"):
        load(featureGates=["flowControl"], flowControl={"maxRequests": 10})


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
                                          r"cannot be used here; expected a utilization-detector"):
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
