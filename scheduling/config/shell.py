"""The EndpointPickerConfig sections the shell applies: featureGates, saturationDetector, dataLayer (or the older
`data`), parser and flowControl. None of them is dropped in silence: each is applied or refused with a clear error.

- `featureGates`: a list of names, validated as GIE/llm-d do (an unknown gate is an error). `dataLayer`,
  `enableLegacyMetrics` and `prepareDataPlugins` are accepted and change nothing (Pointsman's data layer is always
  on and its metric names are GIE's). `flowControl` turns on the `flowControl` section.
- `saturationDetector`: `{pluginRef}` naming a declared `utilization-detector` or `concurrency-detector` (llm-d),
  or the older inline form `{queueDepthThreshold, kvCacheUtilThreshold, metricsStalenessThreshold, headroom}`. It
  configures admission and flow control's dispatch.
- `dataLayer` / `data`: `{sources: [{pluginRef, extractors: [{pluginRef}]}], injectDefaults}`. A source must be a
  declared `metrics-data-source` (scheme, path, TLS verification of the scrape) with `core-metrics-extractor`
  extractors (engine label and default engine). `discovery` is refused: Pointsman discovers endpoints itself.
- `parser`: `{pluginRef}` naming a declared `openai-parser`; llm-d-router's `requestHandler: {parsers:
  [{pluginRef}, ...]}` likewise, each naming a declared `openai-parser` (the only parser Pointsman has: it reads the
  OpenAI and Anthropic APIs; another parser type is an unknown plugin type when declared).
- `flowControl`: needs the `flowControl` feature gate (as in GIE, where the section is otherwise ignored; here it
  is refused so nobody believes it is on). The gate alone turns flow control on with GIE's defaults; the section
  is read by `scheduling.config.flowcontrol` and applied by `epp/flowcontrol`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from scheduling.api import Saturation, Scrape, ShellConfig
from scheduling.config.common import check_keys, expect_list, expect_mapping, expect_str
from scheduling.config.flowcontrol import build_flow_control
from scheduling.framework import BuildContext, ConfigError, Plugin
from scheduling.framework.errors import join_path
from scheduling.framework.params import parse_params
from scheduling.plugins.system.concurrency_detector import ConcurrencyDetector
from scheduling.plugins.system.core_metrics_extractor import CoreMetricsExtractor
from scheduling.plugins.system.metrics_data_source import MetricsDataSource
from scheduling.plugins.system.openai_parser import OpenAIParser
from scheduling.plugins.system.utilization_detector import Params as DetectorParams
from scheduling.plugins.system.utilization_detector import UtilizationDetector

FEATURE_GATES = ("flowControl", "dataLayer", "enableLegacyMetrics", "prepareDataPlugins")
SECTIONS = ("featureGates", "saturationDetector", "flowControl", "dataLayer", "data", "parser", "requestHandler")


def _ref(
    section: Mapping[str, Any], plugins: Mapping[str, Plugin[Any]], kind: type[Plugin[Any]], src: str, path: str
) -> Any:
    name = expect_str(section.get("pluginRef"), src, join_path(path, "pluginRef"), "a plugin name")
    plugin = plugins.get(name)
    if plugin is None:
        raise ConfigError(src, join_path(path, "pluginRef"),
                          f"no plugin named {name!r}; declared: {', '.join(plugins) or '(none)'}")
    if not isinstance(plugin, kind):
        raise ConfigError(src, join_path(path, "pluginRef"),
                          f"plugin {plugin.describe()} cannot be used here; expected a {kind.type_name}")
    return plugin


def _saturation(raw: Any, plugins: Mapping[str, Plugin[Any]], src: str) -> Saturation:
    sec = expect_mapping(raw, src, "saturationDetector", "a mapping {pluginRef} (or the inline thresholds)")
    if "pluginRef" in sec:
        check_keys(sec, ("pluginRef",), src, "saturationDetector")
        name = sec.get("pluginRef")
        found = plugins.get(name) if isinstance(name, str) else None
        if isinstance(found, ConcurrencyDetector):
            cp = found.params
            return Saturation(headroom=cp.headroom, detector="concurrency", concurrency_mode=cp.concurrencyMode,
                              max_concurrency=cp.maxConcurrency, max_token_concurrency=cp.maxTokenConcurrency)
        if found is not None and not isinstance(found, UtilizationDetector):
            raise ConfigError(src, "saturationDetector.pluginRef", f"plugin {found.describe()} cannot be used here; "
                                                                   "expected a utilization-detector or a "
                                                                   "concurrency-detector")
        det = _ref(sec, plugins, UtilizationDetector, src, "saturationDetector")
    else:  # GIE's older inline form: the detector's own parameters
        params = parse_params(DetectorParams, sec, source=src, path="saturationDetector")
        det = UtilizationDetector("saturationDetector", params, BuildContext(src, "saturationDetector"))
    p = det.params
    return Saturation(p.queueDepthThreshold, p.kvCacheUtilThreshold, det.staleness_s, p.headroom)


def _scrape(raw: Any, plugins: Mapping[str, Plugin[Any]], src: str, path: str) -> Scrape:
    sec = expect_mapping(raw, src, path, "a mapping {sources, injectDefaults}")
    check_keys(sec, ("sources", "injectDefaults", "discovery"), src, path)
    if sec.get("discovery") is not None:
        raise ConfigError(src, join_path(path, "discovery"),
                          "endpoint discovery plugins are not supported; Pointsman discovers endpoints itself "
                          "(--endpoints-file, --pool-name or --endpoint-selector)")
    inject = sec.get("injectDefaults", True)
    if not isinstance(inject, bool):
        raise ConfigError(src, join_path(path, "injectDefaults"), f"expected a boolean, got {inject!r}")
    sources = expect_list(sec.get("sources") or [], src, join_path(path, "sources"))
    if len(sources) > 1:
        raise ConfigError(src, join_path(path, "sources"),
                          f"expected at most one metrics source, got {len(sources)}")
    if not sources:
        if not inject:
            raise ConfigError(src, path, "no metrics source and injectDefaults false would route blind; "
                                         "Pointsman always scrapes its endpoints' metrics")
        return Scrape()
    spath = join_path(join_path(path, "sources"), 0)
    entry = expect_mapping(sources[0], src, spath, "a source {pluginRef, extractors}")
    check_keys(entry, ("pluginRef", "extractors"), src, spath)
    source: MetricsDataSource = _ref(entry, plugins, MetricsDataSource, src, spath)
    extractor: CoreMetricsExtractor | None = None
    for i, ex in enumerate(expect_list(entry.get("extractors") or [], src, join_path(spath, "extractors"))):
        epath = join_path(join_path(spath, "extractors"), i)
        ex = expect_mapping(ex, src, epath, "an extractor {pluginRef}")
        check_keys(ex, ("pluginRef",), src, epath)
        if extractor is not None:
            raise ConfigError(src, epath, "expected one core-metrics-extractor per source")
        extractor = _ref(ex, plugins, CoreMetricsExtractor, src, epath)
    sp = source.params
    if extractor is None:
        return Scrape(sp.scheme, sp.path, sp.insecureSkipVerify)
    ep = extractor.params
    return Scrape(sp.scheme, sp.path, sp.insecureSkipVerify, ep.engineLabelKey, ep.defaultEngine)


def build_shell_config(d: Mapping[str, Any], plugins: Mapping[str, Plugin[Any]], src: str) -> ShellConfig:
    gates_raw = d.get("featureGates") or []
    gates = expect_list(gates_raw, src, "featureGates", "a list of feature gate names")
    for i, gate in enumerate(gates):
        if gate not in FEATURE_GATES:
            raise ConfigError(src, join_path("featureGates", i),
                              f"feature gate {gate!r} is unknown; known gates: {', '.join(FEATURE_GATES)}")
    if d.get("flowControl") is not None and "flowControl" not in gates:
        raise ConfigError(src, "flowControl", "flowControl is configured but the flowControl feature gate is "
                                              "off; add featureGates: [flowControl]")
    if d.get("data") is not None and d.get("dataLayer") is not None:
        raise ConfigError(src, "data", "give either dataLayer or its older name data, not both")
    cfg = ShellConfig(feature_gates=frozenset(gates))
    if d.get("saturationDetector") is not None:
        cfg = replace(cfg, saturation=_saturation(d["saturationDetector"], plugins, src))
    for key in ("dataLayer", "data"):
        if d.get(key) is not None:
            cfg = replace(cfg, scrape=_scrape(d[key], plugins, src, key))
    if "flowControl" in gates:
        cfg = replace(cfg, flow_control=build_flow_control(d.get("flowControl"), plugins, src))
    if d.get("parser") is not None:
        sec = expect_mapping(d["parser"], src, "parser", "a mapping {pluginRef}")
        check_keys(sec, ("pluginRef",), src, "parser")
        _ref(sec, plugins, OpenAIParser, src, "parser")
    if d.get("requestHandler") is not None:
        sec = expect_mapping(d["requestHandler"], src, "requestHandler", "a mapping {parsers: [{pluginRef}]}")
        check_keys(sec, ("parsers",), src, "requestHandler")
        for i, ref in enumerate(expect_list(sec.get("parsers") or [], src, "requestHandler.parsers")):
            path = join_path("requestHandler.parsers", i)
            entry = expect_mapping(ref, src, path, "a mapping {pluginRef}")
            check_keys(entry, ("pluginRef",), src, path)
            _ref(entry, plugins, OpenAIParser, src, path)
    return cfg
