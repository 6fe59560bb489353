"""The `flowControl` section of an EndpointPickerConfig (GIE FlowControlConfig), read into `scheduling.api.FlowControl`.

    flowControl:
      maxBytes: 1Gi              # every queued request of the pool together (Kubernetes quantity); 0/absent: no limit
      maxRequests: 1k
      defaultRequestTTL: 30s     # how long a request may wait; 0/absent: until its client goes away
      usageLimitPolicyPluginRef: static-usage-limit-policy   # or a declared priority-usage-limit-policy
      defaultPriorityBand: {maxBytes, maxRequests, fairnessPolicyRef, orderingPolicyRef}   # for unlisted priorities
      priorityBands:
      - priority: 10             # higher is served first (InferenceObjective spec.priority)
        maxRequests: 100
        fairnessPolicyRef: round-robin-fairness-policy

Band limits count that band's queued requests (bytes default to GIE's 1 GB, requests to no limit). Policies not
implemented (edf-ordering-policy, slo-deadline-ordering-policy) are refused with a clear error, never ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from scheduling.api import DEFAULT_BAND_MAX_BYTES, FCFS, ROUND_ROBIN, FlowControl, PriorityBand
from scheduling.config.common import check_keys, expect_list, expect_mapping, expect_str
from scheduling.framework import ConfigError, Plugin
from scheduling.framework.errors import join_path
from scheduling.framework.params import parse_duration
from scheduling.plugins.system._flow_policies import FairnessPolicy, OrderingPolicy
from scheduling.plugins.system.priority_usage_limit_policy import PriorityUsageLimit
from scheduling.plugins.system.static_usage_limit_policy import StaticUsageLimit

SECTION_KEYS = ("maxBytes", "maxRequests", "defaultRequestTTL", "defaultPriorityBand", "priorityBands",
                "usageLimitPolicyPluginRef")
BAND_KEYS = ("priority", "maxBytes", "maxRequests", "fairnessPolicyRef", "orderingPolicyRef")
NOT_IMPLEMENTED = {
    "edf-ordering-policy": "earliest-deadline-first ordering",
    "slo-deadline-ordering-policy": "SLO-deadline ordering",
}

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SCALE = {None: 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(value: Any) -> int:
    """A Kubernetes resource quantity ("1Gi", "500M", "1k", "100", 100) as an integer, rounded up like
    `Quantity.Value()`. Raises ValueError for anything else or a negative value."""
    if isinstance(value, bool):
        raise ValueError(f"expected a quantity such as 100, 1k or 1Gi, got {value!r}")
    if isinstance(value, int):
        number = float(value)
    elif isinstance(value, float):
        number = value
    elif isinstance(value, str) and (m := _QUANTITY.match(value.strip())):
        number = float(m.group(1)) * _SCALE[m.group(2)]
    else:
        raise ValueError(f"expected a quantity such as 100, 1k or 1Gi, got {value!r}")
    if number < 0 or not math.isfinite(number):
        raise ValueError(f"expected a non-negative quantity, got {value!r}")
    return math.ceil(number)


def _quantity(sec: Mapping[str, Any], key: str, default: int, src: str, path: str) -> int:
    if sec.get(key) is None:
        return default
    try:
        value = parse_quantity(sec[key])
    except ValueError as err:
        raise ConfigError(src, join_path(path, key), str(err)) from None
    return value or default  # GIE: 0 means "not set"


def _policy(ref: Any, kind: type[Plugin[Any]], plugins: Mapping[str, Plugin[Any]], src: str, path: str) -> str:
    """The policy type a ref names: a declared plugin of that kind, or the type name of a built-in default."""
    name = expect_str(ref, src, path, "a policy name")
    declared = plugins.get(name)
    if declared is not None:
        if not isinstance(declared, kind):
            raise ConfigError(src, path, f"plugin {declared.describe()} is not a {_what(kind)}")
        return declared.type_name
    if name in NOT_IMPLEMENTED:
        raise ConfigError(src, path, f"{name} ({NOT_IMPLEMENTED[name]}) is not implemented by Pointsman; "
                                     f"use {FCFS}")
    from scheduling.framework.registry import lookup

    cls = lookup(name)
    if cls is not None and issubclass(cls, kind):
        return cls.type_name
    known = sorted(p.type_name for p in (_known(kind)))
    raise ConfigError(src, path, f"no {_what(kind)} named {name!r}; declare one in plugins, or use one of "
                                 f"{', '.join(known)}")


def _what(kind: type[Plugin[Any]]) -> str:
    return "fairness policy" if kind is FairnessPolicy else "ordering policy"


def _known(kind: type[Plugin[Any]]) -> list[type[Plugin[Any]]]:
    from scheduling.framework.registry import plugin_types

    return [cls for cls in plugin_types().values() if issubclass(cls, kind)]


def _band(raw: Any, plugins: Mapping[str, Plugin[Any]], src: str, path: str, *, template: bool) -> PriorityBand:
    sec = expect_mapping(raw, src, path, "a priority band {priority, maxBytes, maxRequests, fairnessPolicyRef, "
                                         "orderingPolicyRef}")
    check_keys(sec, BAND_KEYS, src, path)
    priority = 0
    if not template:
        value = sec.get("priority")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(src, join_path(path, "priority"), f"expected an integer priority, got {value!r}")
        priority = value
    fairness = ROUND_ROBIN
    if sec.get("fairnessPolicyRef"):
        fairness = _policy(sec["fairnessPolicyRef"], FairnessPolicy, plugins, src, join_path(path, "fairnessPolicyRef"))
    ordering = FCFS
    if sec.get("orderingPolicyRef"):
        ordering = _policy(sec["orderingPolicyRef"], OrderingPolicy, plugins, src, join_path(path, "orderingPolicyRef"))
    return PriorityBand(
        priority=priority,
        max_bytes=_quantity(sec, "maxBytes", DEFAULT_BAND_MAX_BYTES, src, path),
        max_requests=_quantity(sec, "maxRequests", 0, src, path),
        fairness=fairness,
        ordering=ordering,
    )


def build_flow_control(raw: Any, plugins: Mapping[str, Plugin[Any]], src: str) -> FlowControl:
    """The section as `FlowControl` (None or {} gives GIE's defaults)."""
    path = "flowControl"
    sec = expect_mapping(raw if raw is not None else {}, src, path, "a mapping (GIE FlowControlConfig)")
    check_keys(sec, SECTION_KEYS, src, path)
    ttl = 0.0
    if sec.get("defaultRequestTTL") is not None:
        try:
            ttl = parse_duration(sec["defaultRequestTTL"])
        except ValueError as err:
            raise ConfigError(src, join_path(path, "defaultRequestTTL"), str(err)) from None
        if ttl < 0:
            raise ConfigError(src, join_path(path, "defaultRequestTTL"), f"expected a duration >= 0, got {ttl}")
    limit, sheddable = 1.0, None
    if sec.get("usageLimitPolicyPluginRef"):
        rpath = join_path(path, "usageLimitPolicyPluginRef")
        ref = expect_str(sec["usageLimitPolicyPluginRef"], src, rpath, "a plugin name")
        declared = plugins.get(ref)
        if isinstance(declared, StaticUsageLimit):
            limit = declared.params.threshold
        elif isinstance(declared, PriorityUsageLimit):
            limit, sheddable = declared.params.threshold, declared.params.sheddableThreshold
        elif declared is not None:
            raise ConfigError(src, rpath, f"plugin {declared.describe()} is not a usage limit policy "
                                          "(static-usage-limit-policy or priority-usage-limit-policy)")
        elif ref != "static-usage-limit-policy":
            raise ConfigError(src, rpath, f"no usage limit policy named {ref!r}; declare a static-usage-limit-policy "
                                          "or a priority-usage-limit-policy")
    default_band = PriorityBand()
    if sec.get("defaultPriorityBand") is not None:
        default_band = _band(sec["defaultPriorityBand"], plugins, src, join_path(path, "defaultPriorityBand"),
                             template=True)
    bands: list[PriorityBand] = []
    seen: set[int] = set()
    for i, raw_band in enumerate(expect_list(sec.get("priorityBands") or [], src, join_path(path, "priorityBands"))):
        bpath = join_path(join_path(path, "priorityBands"), i)
        band = _band(raw_band, plugins, src, bpath, template=False)
        if band.priority in seen:
            raise ConfigError(src, join_path(bpath, "priority"), f"duplicate priority level {band.priority}")
        seen.add(band.priority)
        bands.append(band)
    return FlowControl(
        max_bytes=_quantity(sec, "maxBytes", 0, src, path),
        max_requests=_quantity(sec, "maxRequests", 0, src, path),
        default_ttl_s=ttl,
        default_band=default_band,
        bands=tuple(bands),
        usage_limit=limit,
        sheddable_usage_limit=sheddable,
    )
