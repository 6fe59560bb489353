"""Pure conversions from Kubernetes JSON objects (plain dicts, as the API server sends them) to datastore values.

- InferencePool v1 (`inference.networking.k8s.io/v1`): `spec.selector.matchLabels`, `spec.targetPorts[].number`
  (1 to 8 ports), optional `spec.appProtocol` → `PoolSpec`.
- InferencePool v1alpha2 (`inference.networking.x-k8s.io/v1alpha2`, GIE up to v0.5): `spec.selector` (the labels
  themselves), `spec.targetPortNumber` (one port) → `PoolSpec`.
- Pod → endpoints: one per target port, only while the pod is Ready, has an IP and is not terminating. The
  annotation `inference.networking.k8s.io/active-ports` (comma list) narrows the ports to those listed. The pod's
  `pointsman.ai/*` annotations (e.g. where it publishes KV events) ride along on each endpoint.
- InferenceObjective (`inference.networking.x-k8s.io/v1alpha2`): `spec.priority` (default 0), for our pool only.
- InferenceModelRewrite (same group): `spec.rules[]` → `epp.fleet.rewrites.RewriteRule`, for our pool only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from epp.fleet.datastore import PoolSpec
from epp.fleet.rewrites import RewriteRule, RewriteTarget
from scheduling.types import Endpoint, endpoint_key

log = logging.getLogger(__name__)

POOL_GROUP = "inference.networking.k8s.io"
V1ALPHA2_POOL_GROUP = "inference.networking.x-k8s.io"
ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
# Served models: label values cannot hold "/", so the annotation carries full names; the label is a short form.
MODELS_ANNOTATION = "llm-d.ai/models"
MODEL_LABELS = ("llm-d.ai/model", "mif.moreh.io/model")
MAX_TARGET_PORTS = 8
POINTSMAN_ANNOTATION_PREFIX = "pointsman.ai/"


class InvalidObject(ValueError):
    pass


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def obj_name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name") or "")


def resource_version(obj: Mapping[str, Any]) -> str | None:
    rv = _meta(obj).get("resourceVersion")
    return str(rv) if rv is not None else None


def parse_selector(text: str) -> dict[str, str]:
    """`k=v,k2=v2` (also `k==v`) → dict. Raises ValueError naming the bad term."""
    out: dict[str, str] = {}
    for term in (t.strip() for t in text.split(",")):
        if not term:
            continue
        key, sep, value = term.partition("==") if "==" in term else term.partition("=")
        if not sep or not key.strip() or "!" in key:
            raise ValueError(f"endpoint selector term {term!r}: expected key=value")
        out[key.strip()] = value.strip()
    if not out:
        raise ValueError(f"endpoint selector {text!r} selects nothing; expected key=value[,key=value]")
    return out


def selector_string(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def parse_ports(text: str) -> tuple[int, ...]:
    ports = []
    for p in (x.strip() for x in text.split(",")):
        if not p:
            continue
        if not p.isdigit() or not 0 < int(p) < 65536:
            raise ValueError(f"target port {p!r}: expected a number 1-65535")
        ports.append(int(p))
    if not ports or len(ports) > MAX_TARGET_PORTS:
        raise ValueError(f"expected 1 to {MAX_TARGET_PORTS} target ports, got {text!r}")
    return tuple(dict.fromkeys(ports))


def _v1alpha2_pool_spec(obj: Mapping[str, Any]) -> PoolSpec:
    name = obj_name(obj)
    spec = obj.get("spec") or {}
    sel = spec.get("selector")
    if not isinstance(sel, Mapping) or not sel or not all(isinstance(v, str) for v in sel.values()):
        raise InvalidObject(f"InferencePool {name}: spec.selector must be a non-empty map of labels")
    port = spec.get("targetPortNumber")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise InvalidObject(f"InferencePool {name}: spec.targetPortNumber must be 1-65535, got {port!r}")
    return PoolSpec(
        name=name,
        namespace=str(_meta(obj).get("namespace") or "default"),
        selector={str(k): str(v) for k, v in sel.items()},
        target_ports=(port,),
    )


def pool_spec(obj: Mapping[str, Any]) -> PoolSpec:
    """InferencePool (v1, or v1alpha2 by its apiVersion) → PoolSpec. Raises InvalidObject naming the bad field."""
    if str(obj.get("apiVersion") or "").startswith(V1ALPHA2_POOL_GROUP + "/"):
        return _v1alpha2_pool_spec(obj)
    name = obj_name(obj)
    spec = obj.get("spec") or {}
    sel = (spec.get("selector") or {}).get("matchLabels")
    if not isinstance(sel, Mapping) or not sel:
        raise InvalidObject(f"InferencePool {name}: spec.selector.matchLabels must be a non-empty map")
    ports_raw = spec.get("targetPorts") or []
    ports: list[int] = []
    for i, p in enumerate(ports_raw):
        num = p.get("number") if isinstance(p, Mapping) else None
        if not isinstance(num, int) or not 0 < num < 65536:
            raise InvalidObject(f"InferencePool {name}: spec.targetPorts[{i}].number must be 1-65535, got {num!r}")
        ports.append(num)
    if not 1 <= len(ports) <= MAX_TARGET_PORTS:
        raise InvalidObject(f"InferencePool {name}: spec.targetPorts must list 1 to {MAX_TARGET_PORTS} ports")
    return PoolSpec(
        name=name,
        namespace=str(_meta(obj).get("namespace") or "default"),
        selector={str(k): str(v) for k, v in sel.items()},
        target_ports=tuple(dict.fromkeys(ports)),
        app_protocol=str(spec.get("appProtocol") or "http"),
    )


def matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_ready(pod: Mapping[str, Any]) -> bool:
    if _meta(pod).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if not status.get("podIP"):
        return False
    if status.get("phase") not in (None, "Running"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )


def pod_models(pod: Mapping[str, Any]) -> frozenset[str]:
    meta = _meta(pod)
    ann = (meta.get("annotations") or {}).get(MODELS_ANNOTATION)
    if ann:
        return frozenset(m.strip() for m in str(ann).split(",") if m.strip())
    labels = meta.get("labels") or {}
    return frozenset(str(labels[k]) for k in MODEL_LABELS if labels.get(k))


def pod_ports(pod: Mapping[str, Any], target_ports: Iterable[int]) -> list[int]:
    ports = list(target_ports)
    ann = (_meta(pod).get("annotations") or {}).get(ACTIVE_PORTS_ANNOTATION)
    if ann is None:
        return ports
    active = set()
    for p in str(ann).split(","):
        p = p.strip()
        if p.isdigit():
            active.add(int(p))
        elif p:
            log.warning("pod %s: ignoring bad port %r in %s", obj_name(pod), p, ACTIVE_PORTS_ANNOTATION)
    return [p for p in ports if p in active]


def pod_endpoints(pod: Mapping[str, Any], target_ports: Iterable[int]) -> list[Endpoint]:
    """The endpoints one pod contributes now (none unless Ready, addressed and not terminating)."""
    if not pod_ready(pod):
        return []
    meta = _meta(pod)
    ip = str((pod.get("status") or {}).get("podIP")).strip("[]")
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()
                   if str(k).startswith(POINTSMAN_ANNOTATION_PREFIX)}
    models = pod_models(pod)
    return [
        Endpoint(
            key=endpoint_key(ip, port),
            address=ip,
            port=port,
            name=obj_name(pod),
            namespace=str(meta.get("namespace") or ""),
            labels=labels,
            models=models,
            annotations=annotations,
        )
        for port in pod_ports(pod, target_ports)
    ]


def refers_to_pool(obj: Mapping[str, Any], pool: str, pool_group: str = POOL_GROUP) -> bool:
    """True if `spec.poolRef` names our pool (the poolRef group defaults to the v1 group, as in GIE)."""
    ref = (obj.get("spec") or {}).get("poolRef") or {}
    group = ref.get("group") or POOL_GROUP
    kind = ref.get("kind") or "InferencePool"
    return ref.get("name") == pool and group == pool_group and kind == "InferencePool"


def objective_priority(obj: Mapping[str, Any]) -> int:
    p = (obj.get("spec") or {}).get("priority")
    if p is None:
        return 0
    if not isinstance(p, int) or isinstance(p, bool):
        raise InvalidObject(f"InferenceObjective {obj_name(obj)}: spec.priority must be an integer, got {p!r}")
    return p


def _created(obj: Mapping[str, Any]) -> float:
    ts = _meta(obj).get("creationTimestamp")
    if not ts:
        return float("inf")  # unknown age sorts last
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("inf")


def rewrite_rules(obj: Mapping[str, Any]) -> list[RewriteRule]:
    """InferenceModelRewrite → its rules. Raises InvalidObject naming the bad field."""
    meta = _meta(obj)
    name = f"{meta.get('namespace') or ''}/{obj_name(obj)}"
    created = _created(obj)
    out: list[RewriteRule] = []
    for i, rule in enumerate((obj.get("spec") or {}).get("rules") or []):
        path = f"InferenceModelRewrite {name}: spec.rules[{i}]"
        exact: set[str] = set()
        for j, m in enumerate(rule.get("matches") or []):
            model = (m or {}).get("model") or {}
            mtype = model.get("type") or "Exact"
            if mtype != "Exact":
                raise InvalidObject(f"{path}.matches[{j}].model.type {mtype!r} is not supported; expected Exact")
            value = model.get("value")
            if not isinstance(value, str) or not value:
                raise InvalidObject(f"{path}.matches[{j}].model.value must be a non-empty string")
            exact.add(value)
        targets = []
        for j, t in enumerate(rule.get("targets") or []):
            model = (t or {}).get("modelRewrite")
            weight = (t or {}).get("weight", 1)
            if not isinstance(model, str) or not model:
                raise InvalidObject(f"{path}.targets[{j}].modelRewrite must be a non-empty string")
            if not isinstance(weight, int) or weight < 0:
                raise InvalidObject(f"{path}.targets[{j}].weight must be a non-negative integer, got {weight!r}")
            targets.append(RewriteTarget(model, weight))
        if not targets:
            raise InvalidObject(f"{path}.targets must not be empty")
        out.append(RewriteRule(tuple(targets), frozenset(exact), created, name, i))
    return out
