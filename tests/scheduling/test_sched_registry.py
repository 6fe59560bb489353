"""Registry: discovery, aliases, formula docstrings, parameter validation."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from sched_helpers import plugin

from scheduling.framework import ConfigError
from scheduling.framework.registry import PLUGIN_PACKAGES, aliases, canonical, lookup, plugin_types

EXPECTED = {
    "label-selector-filter",
    "by-label-filter",
    "prefill-filter",
    "decode-filter",
    "encode-filter",
    "served-model-filter",
    "lora-affinity-filter",
    "saturation-filter",
    "context-length-aware",
    "prefix-cache-affinity-filter",
    "queue-scorer",
    "running-requests-size-scorer",
    "active-request-scorer",
    "inflight-requests-scorer",
    "kv-cache-utilization-scorer",
    "kv-block-occupancy-scorer",
    "load-aware-scorer",
    "lora-affinity-scorer",
    "token-load-scorer",
    "token-length-scorer",
    "session-affinity-scorer",
    "no-hit-lru-scorer",
    "constant-scorer",
    "prefix-cache-scorer",
    "max-score-picker",
    "random-picker",
    "weighted-random-picker",
    "single-profile-handler",
    "pd-profile-handler",
}


def test_all_plugins_discovered():
    assert EXPECTED <= set(plugin_types())


def test_aliases():
    assert canonical("waiting-requests-scorer") == "queue-scorer"
    assert canonical("running-requests-scorer") == "running-requests-size-scorer"
    assert canonical("kv-utilization-scorer", "heimdall") == "kv-cache-utilization-scorer"
    assert canonical("kv-cache-utilization-scorer", "heimdall") == "kv-block-occupancy-scorer"
    assert canonical("kv-cache-utilization-scorer", "epp") == "kv-cache-utilization-scorer"
    assert canonical("e2e") == "single-profile-handler"
    assert canonical("pd") == canonical("disagg") == "pd-profile-handler"
    assert lookup("no-such-thing") is None
    assert all(a not in plugin_types() or a in ("kv-cache-utilization-scorer",) for a in aliases("heimdall"))


def test_one_plugin_per_module_with_formula_docstring():
    seen = {}
    for pkg_name in PLUGIN_PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name.startswith("_"):
                continue
            mod = importlib.import_module(f"{pkg_name}.{info.name}")
            doc = mod.__doc__ or ""
            registered = [cls for cls in plugin_types().values() if cls.__module__ == mod.__name__]
            assert len(registered) == 1, (mod.__name__, registered)
            name = registered[0].type_name
            assert doc.startswith(name), (mod.__name__, doc[:40])
            assert "=" in doc or "->" in doc, f"{mod.__name__} docstring states no formula"
            seen[name] = mod.__name__
    assert set(seen) == set(plugin_types())


def test_bounds_checked():
    with pytest.raises(
        ConfigError, match=r"plugins\[0\].parameters.maxNumOfEndpoints: expected a value >= 1"
    ):
        plugin("max-score-picker", {"maxNumOfEndpoints": 0})
    with pytest.raises(ConfigError, match="expected a boolean"):
        plugin("prefix-cache-scorer", {"autoTuneCapacity": "yes"})
    with pytest.raises(ConfigError, match="sources"):
        plugin("session-affinity-scorer", {"sources": [{"type": "smoke", "name": "x"}]})


def test_typed_create_names_the_wrong_kind():
    from scheduling.framework import BuildContext, FilterScorer, create_filter, create_picker, create_scorer

    assert create_scorer("queue-scorer").kind == "scorer"
    with pytest.raises(ConfigError, match=r"x.yaml: plugins\[3\].type: 'queue-scorer' \(queue-scorer\) is a scorer, "
                                          r"not a picker"):
        create_picker("queue-scorer", build=BuildContext("x.yaml", "plugins[3]"))
    # a scorer that can filter is a filter too (a profile puts it in both places when filtering is on)
    both = create_filter("least-request")
    assert isinstance(both, FilterScorer) and both.kind == "scorer"
