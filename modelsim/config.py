"""Simulator configuration: the engine profile of one server and the fleet layout.

All durations are in *model seconds* (the simulated GPU's time). `time_scale` maps them to wall time in the
HTTP layer only: wall = model × time_scale, so 0.1 runs ten times faster than real time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml


@dataclass(frozen=True)
class EngineConfig:
    """One simulated vLLM engine. Defaults are the reference profile (8B on H100)."""

    max_num_seqs: int = 16
    max_waiting: int = 1000  # waiting-queue limit; past it requests fail with 429
    kv_cache_size: int = 1024  # blocks
    block_size: int = 16  # tokens per block
    max_model_len: int = 32768
    itl: float = 0.012  # inter-token latency, s
    prefill_overhead: float = 0.030  # s
    prefill_per_token: float = 0.000250  # s per uncached prompt token
    load_factor: float = 2.0  # F: latency multiplier at max_num_seqs running
    kv_transfer_overhead: float = 0.005  # s, P/D decode side
    kv_transfer_per_token: float = 0.000010  # s per prompt token, P/D decode side
    max_loras: int = 1
    default_max_tokens: int = 16
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "kv_cache_size", "block_size", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine config: {name} must be >= 1, got {getattr(self, name)}")
        if self.load_factor < 1.0:
            raise ValueError(f"engine config: load_factor must be >= 1.0, got {self.load_factor}")


@dataclass(frozen=True)
class FleetConfig:
    """N servers on consecutive ports, all serving `model` (plus `loras`)."""

    servers: int = 1
    host: str = "127.0.0.1"
    base_port: int = 8100
    ports: tuple[int, ...] = ()  # one port per server, overriding base_port + i (any order, not consecutive)
    model: str = "meta-llama/Llama-3.1-8B"
    loras: tuple[str, ...] = ()
    time_scale: float = 1.0
    failure_rate: float = 0.0
    seed: int = 0
    kv_events_port: int | None = None  # base port of the ZMQ PUB sockets (one per server)
    kv_events_replay_port: int | None = None  # base port of the replay ROUTER sockets (needs kv_events_port)
    kv_events_ports: tuple[int, ...] = ()  # one PUB port per server, instead of kv_events_port + i
    kv_events_replay_ports: tuple[int, ...] = ()  # one replay port per server, instead of kv_events_replay_port + i
    kv_events_encoding: str = "array"  # "array" (vLLM <= ~0.23) or "map" (newer vLLM: maps with "type")
    kv_events_style: str = "vllm"  # "vllm" or "sglang" (one event per block, SGLang's field set)
    kv_events_hash_format: str = "int"  # "int" or "bytes" block hashes
    kv_events_buffer_steps: int = 10_000  # batches retained for replay
    tokenizer: str | None = None  # a directory with tokenizer.json (+ tokenizer_config.json): real token ids
    roles: tuple[str, ...] = ()  # per server: "both" (default), "prefill" or "decode" (informational)
    oracle_port: int | None = None  # in-process oracle router over the fleet (benchmark aid)
    stream_interval: float = 0.0  # wall s; > 0 coalesces streamed tokens after the first (cheaper at speed)
    engine_type: str = "vllm"  # whose metrics /metrics exposes: "vllm" or "sglang" (SGLang also gets /flush_cache)
    metrics_time: str = "model"  # latency histograms in "model" seconds or "wall" seconds (model × time_scale)
    latency_factors: tuple[float, ...] = ()  # per server: every engine duration × this (2.0 = twice as slow)
    request_log_size: int = 10_000  # finished requests kept for GET /admin/requests
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise ValueError(f"fleet config: servers must be >= 1, got {self.servers}")
        if self.time_scale <= 0:
            raise ValueError(f"fleet config: time_scale must be > 0, got {self.time_scale}")
        if self.ports and len(self.ports) != self.servers:
            raise ValueError(f"fleet config: ports lists {len(self.ports)} ports for {self.servers} servers")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError(f"fleet config: failure_rate must be in [0, 1], got {self.failure_rate}")
        for name, allowed in (("kv_events_encoding", ("array", "map")), ("kv_events_style", ("vllm", "sglang")),
                              ("kv_events_hash_format", ("int", "bytes")), ("engine_type", ("vllm", "sglang")),
                              ("metrics_time", ("model", "wall"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"fleet config: {name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("kv_events_ports", "kv_events_replay_ports"):
            ports = getattr(self, name)
            if ports and len(ports) != self.servers:
                raise ValueError(f"fleet config: {name} lists {len(ports)} ports for {self.servers} servers")
        if self.kv_events_replay_ports and not (self.kv_events_ports or self.kv_events_port is not None):
            raise ValueError("fleet config: kv_events_replay_ports needs KV events (kv_events_port or _ports)")
        if self.kv_events_buffer_steps < 1:
            raise ValueError(f"fleet config: kv_events_buffer_steps must be >= 1, got {self.kv_events_buffer_steps}")
        if self.latency_factors and len(self.latency_factors) != self.servers:
            raise ValueError(f"fleet config: latency_factors lists {len(self.latency_factors)} factors for "
                             f"{self.servers} servers")
        if any(not f > 0 for f in self.latency_factors):  # also rejects NaN
            raise ValueError(f"fleet config: latency_factors must all be > 0, got {list(self.latency_factors)}")
        if self.request_log_size < 0:
            raise ValueError(f"fleet config: request_log_size must be >= 0, got {self.request_log_size}")

    def latency_factor(self, index: int) -> float:
        return self.latency_factors[index] if self.latency_factors else 1.0

    def engine_for(self, index: int) -> EngineConfig:
        """Server `index`'s engine: the fleet's, with every duration multiplied by its latency factor."""
        f = self.latency_factor(index)
        if f == 1.0:
            return self.engine
        e = self.engine
        return dataclasses.replace(e, itl=e.itl * f, prefill_overhead=e.prefill_overhead * f,
                                   prefill_per_token=e.prefill_per_token * f,
                                   kv_transfer_overhead=e.kv_transfer_overhead * f,
                                   kv_transfer_per_token=e.kv_transfer_per_token * f)

    @property
    def metrics_scale(self) -> float:
        """Seconds reported by the latency histograms per model second."""
        return self.time_scale if self.metrics_time == "wall" else 1.0

    def port(self, index: int) -> int:
        return self.ports[index] if self.ports else self.base_port + index

    def kv_events_port_of(self, index: int) -> int | None:
        """Server `index`'s KV-event PUB port (None: no events)."""
        if self.kv_events_ports:
            return self.kv_events_ports[index]
        return None if self.kv_events_port is None else self.kv_events_port + index

    def kv_events_replay_port_of(self, index: int) -> int | None:
        if self.kv_events_replay_ports:
            return self.kv_events_replay_ports[index]
        return None if self.kv_events_replay_port is None else self.kv_events_replay_port + index

    def role(self, index: int) -> str:
        return self.roles[index] if index < len(self.roles) else "both"


_ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}
_FLEET_FIELDS = {f.name for f in dataclasses.fields(FleetConfig)} - {"engine"}


def fleet_from_mapping(data: dict[str, Any], source: str = "<config>") -> FleetConfig:
    """Build a FleetConfig from a dict with fleet keys at top level and an optional `engine:` section.

    Engine keys may also appear at top level. Unknown keys are an error naming the key and `source`.
    Keys may use dashes or underscores.
    """
    norm = {k.replace("-", "_"): v for k, v in data.items()}
    eng_raw = {k.replace("-", "_"): v for k, v in (norm.pop("engine", None) or {}).items()}
    for k in list(norm):
        if k in _ENGINE_FIELDS:
            eng_raw.setdefault(k, norm.pop(k))
    unknown = (set(norm) - _FLEET_FIELDS) | (set(eng_raw) - _ENGINE_FIELDS)
    if unknown:
        raise ValueError(f"{source}: unknown config key(s) {sorted(unknown)}")
    for key in ("loras", "roles"):
        if key in norm and norm[key] is not None:
            v = norm[key]
            norm[key] = tuple(v.split(",")) if isinstance(v, str) else tuple(v)
    if norm.get("latency_factors") is not None:
        v = norm["latency_factors"]
        try:
            norm["latency_factors"] = tuple(float(f) for f in (v.split(",") if isinstance(v, str) else v))
        except (TypeError, ValueError):
            raise ValueError(f"{source}: latency_factors must be a list of numbers, got {v!r}") from None
    for key in ("ports", "kv_events_ports", "kv_events_replay_ports"):
        if norm.get(key) is not None:
            v = norm[key]
            try:
                norm[key] = tuple(int(p) for p in (v.split(",") if isinstance(v, str) else v))
            except (TypeError, ValueError):
                raise ValueError(f"{source}: {key} must be a list of port numbers, got {v!r}") from None
    return FleetConfig(**norm, engine=EngineConfig(**eng_raw))


def load_fleet_file(path: str) -> dict[str, Any]:
    """Read a YAML (or JSON) config file into a dict."""
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at top level")
    return data
