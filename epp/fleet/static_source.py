"""Standalone endpoints from a file: pools and their endpoints, with no Kubernetes.

```yaml
pools:
- name: llama                  # the first pool is the default unless --pool-name says otherwise
  namespace: default
  endpoints:
  - address: 10.0.0.5          # or host: "10.0.0.5:8000"
    port: 8000
    name: vllm-0               # optional
    labels: {llm-d.ai/role: decode}
    models: [meta-llama/Llama-3.1-8B, sql-lora]   # optional; empty means "serves whatever it is asked"
    role: decode               # optional shorthand for the llm-d.ai/role label
    kvEvents:                  # optional: where its KV-cache events are published (precise prefix routing)
      endpoint: tcp://10.0.0.5:5557       # or just "tcp://10.0.0.5:5557" in place of the mapping
      replay: tcp://10.0.0.5:5558         # optional replay (ROUTER) socket
      topic: kv@                          # optional topic prefix
adapters:                      # optional LoRA adapter -> base model map (X-Gateway-Base-Model-Name)
  sql-lora: meta-llama/Llama-3.1-8B
objectives:                    # optional InferenceObjective name -> priority (x-gateway-inference-objective);
  critical: 10                 # what the InferenceObjective CRDs give in Kubernetes: priority bands of flow
  batch: -1                    # control, and < 0 is sheddable
```
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import yaml

from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.kvevents import KVEventsConfigError, parse_kv_events_field
from scheduling.types import Endpoint, endpoint_key


class StaticConfigError(ValueError):
    pass


def _fail(src: str, path: str, msg: str) -> StaticConfigError:
    return StaticConfigError(f"{src}: {path}: {msg}")


def _parse_endpoint(src: str, path: str, raw: object) -> Endpoint:
    if not isinstance(raw, Mapping):
        raise _fail(src, path, "expected a mapping with address and port")
    known = {"address", "host", "port", "name", "labels", "models", "role", "namespace", "kvEvents"}
    unknown = set(raw) - known
    if unknown:
        raise _fail(src, path, f"unknown field(s) {sorted(unknown)}; expected some of {sorted(known)}")
    address, port = raw.get("address"), raw.get("port")
    if "host" in raw:
        host = str(raw["host"])
        address, _, p = host.rpartition(":")
        if not address or not p.isdigit():
            raise _fail(src, f"{path}.host", f"expected 'ip:port', got {host!r}")
        port = int(p)
    if not isinstance(address, str) or not address:
        raise _fail(src, f"{path}.address", "expected an IP address string")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise _fail(src, f"{path}.port", f"expected a port number 1-65535, got {port!r}")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise _fail(src, f"{path}.labels", "expected a mapping of label -> value")
    labels = {str(k): str(v) for k, v in labels.items()}
    if raw.get("role"):
        labels.setdefault("llm-d.ai/role", str(raw["role"]))
    models = raw.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise _fail(src, f"{path}.models", "expected a list of model names")
    address = address.strip("[]")
    annotations: dict[str, str] = {}
    if raw.get("kvEvents") is not None:
        try:
            annotations = parse_kv_events_field(raw["kvEvents"], f"{path}.kvEvents")
        except KVEventsConfigError as e:
            raise StaticConfigError(f"{src}: {e}") from None
    return Endpoint(
        key=endpoint_key(address, port),
        address=address,
        port=port,
        name=str(raw.get("name") or endpoint_key(address, port)),
        namespace=str(raw.get("namespace") or ""),
        labels=labels,
        models=frozenset(models),
        annotations=annotations,
    )


class StaticConfig(NamedTuple):
    pools: list[tuple[PoolSpec, list[Endpoint]]]
    adapters: dict[str, str]
    objectives: dict[str, int]


def parse_static_config(doc: object, src: str = "<config>") -> tuple[list[tuple[PoolSpec, list[Endpoint]]], dict[str, str]]:
    """The pools and adapters of an endpoints file (`parse_static_file` gives the objectives too)."""
    cfg = parse_static_file(doc, src)
    return cfg.pools, cfg.adapters


def _objectives(src: str, raw: object) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        raise _fail(src, "objectives", "expected a mapping of objective name -> integer priority")
    out = {}
    for name, priority in raw.items():
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise _fail(src, f"objectives.{name}", f"expected an integer priority, got {priority!r}")
        out[str(name)] = priority
    return out


def parse_static_file(doc: object, src: str = "<config>") -> StaticConfig:
    if not isinstance(doc, Mapping):
        raise _fail(src, "$", "expected a mapping with 'pools'")
    unknown = set(doc) - {"pools", "adapters", "objectives"}
    if unknown:
        raise _fail(src, "$", f"unknown field(s) {sorted(unknown)}; expected pools, adapters, objectives")
    pools_raw = doc.get("pools")
    if not isinstance(pools_raw, list) or not pools_raw:
        raise _fail(src, "pools", "expected a non-empty list of pools")
    pools: list[tuple[PoolSpec, list[Endpoint]]] = []
    seen: set[str] = set()
    for i, p in enumerate(pools_raw):
        path = f"pools[{i}]"
        if not isinstance(p, Mapping) or not isinstance(p.get("name"), str):
            raise _fail(src, path, "expected a mapping with a string 'name'")
        if p["name"] in seen:
            raise _fail(src, f"{path}.name", f"duplicate pool name {p['name']!r}")
        seen.add(p["name"])
        raw_eps = p.get("endpoints") or []
        if not isinstance(raw_eps, list):
            raise _fail(src, f"{path}.endpoints", "expected a list")
        eps = [_parse_endpoint(src, f"{path}.endpoints[{j}]", e) for j, e in enumerate(raw_eps)]
        spec = PoolSpec(name=p["name"], namespace=str(p.get("namespace") or "default"))
        pools.append((spec, eps))
    adapters = doc.get("adapters") or {}
    if not isinstance(adapters, Mapping):
        raise _fail(src, "adapters", "expected a mapping of adapter -> base model")
    return StaticConfig(pools, {str(k): str(v) for k, v in adapters.items()},
                        _objectives(src, doc.get("objectives") or {}))


def parse_static_text(text: str, src: str = "<config>") -> StaticConfig:
    """An endpoints file's text, parsed and checked (StaticConfigError names what is wrong)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise StaticConfigError(f"{src}: not YAML: {e}") from e
    return parse_static_file(doc, src)


def read_static_file(path: str | Path) -> StaticConfig:
    """The one reading of an endpoints file (`epp serve` polls it through `parse_static_text`)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise StaticConfigError(f"{path}: cannot read: {e}") from e
    return parse_static_text(text, str(path))


def apply_static(
    datastore: Datastore, pools: list[tuple[PoolSpec, list[Endpoint]]], adapters: Mapping[str, str],
    objectives: Mapping[str, int] | None = None,
) -> None:
    names = {spec.name for spec, _ in pools}
    for old in datastore.pool_names():
        if old not in names:
            datastore.remove_pool(old)
    for spec, eps in pools:
        datastore.set_pool(spec, eps)
    datastore.adapters = dict(adapters)
    datastore.objectives = dict(objectives or {})
    datastore.synced = True
