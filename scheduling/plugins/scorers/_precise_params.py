"""llm-d's nested parameters of precise-prefix-cache-scorer (`tokenProcessorConfig`, `indexerConfig`,
`kvEventsConfig`, as documented for llm-d-kv-cache), read strictly: what makes sense for Pointsman is accepted,
what does not is refused with the reason, and unknown keys are errors naming their path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduling.framework import BuildContext, ConfigError
from scheduling.framework.errors import join_path

_REFUSED = {
    "indexerConfig.tokenizersPoolConfig": "Pointsman tokenizes in the shell: local tokenizers from --tokenizers-dir "
                                          "(tokenizer.json + tokenizer_config.json per model), else the engine's "
                                          "/tokenize; nothing is downloaded from a model hub",
    "indexerConfig.kvBlockIndexConfig.redisConfig": "the precise index lives in the Pointsman process (every "
                                                    "replica subscribes to the engines' events itself)",
    "indexerConfig.kvBlockIndexConfig.costAwareMemoryConfig": "the precise index is bounded per endpoint (its "
                                                              "engine's cache size), not by a memory budget",
    "kvEventsConfig.zmqEndpoint": "Pointsman connects to each engine's own publisher (the endpoints file's "
                                  "kvEvents, the pointsman.ai/kv-events-endpoint annotation, or --kv-events-port); "
                                  "it does not bind a socket for engines to connect to",
}


@dataclass(frozen=True)
class LlmdPreciseConfig:
    weights: dict[str, float] = field(default_factory=dict)  # producer params: gpuWeight / cpuWeight when set
    block_size: int | None = None  # tokenProcessorConfig.blockSizeTokens (accepted; see the scorer's docstring)
    socket_port: int | None = None  # kvEventsConfig.podDiscoveryConfig.socketPort (with discoverPods)
    topic_filter: str | None = None


class _Reader:
    def __init__(self, build: BuildContext) -> None:
        self.source = build.source
        self.base = build.path

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(self.source, join_path(self.base, path) if self.base else path, message)

    def mapping(self, value: Any, path: str, known: tuple[str, ...]) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(path, f"expected a mapping, got {value!r}")
        for k in value:
            where = f"{path}.{k}"
            if where in _REFUSED:
                raise self.error(where, f"not supported: {_REFUSED[where]}")
            if k not in known:
                raise self.error(where, f"unknown parameter; expected one of {', '.join(known)}")
        return value

    def typed(self, value: Any, path: str, kind: type, what: str) -> Any:
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            raise self.error(path, f"expected {what}, got {value!r}")
        return value

    def positive_int(self, value: Any, path: str) -> int:
        n: int = self.typed(value, path, int, "a positive integer")
        if n < 1:
            raise self.error(path, f"expected a positive integer, got {value!r}")
        return n


def parse_llmd_config(token_processor: Any, indexer: Any, kv_events: Any, build: BuildContext) -> LlmdPreciseConfig:
    r = _Reader(build)
    tp = r.mapping(token_processor, "tokenProcessorConfig", ("blockSizeTokens", "blockSize", "hashSeed"))
    block = None
    for name in ("blockSizeTokens", "blockSize"):
        if name in tp:
            block = r.positive_int(tp[name], f"tokenProcessorConfig.{name}")
    if "hashSeed" in tp:
        r.typed(tp["hashSeed"], "tokenProcessorConfig.hashSeed", str, "a string")
    ix = r.mapping(indexer, "indexerConfig", ("kvBlockIndexConfig", "kvCacheBackendConfigs"))
    kb = r.mapping(ix.get("kvBlockIndexConfig"), "indexerConfig.kvBlockIndexConfig",
                   ("inMemoryConfig", "enableMetrics", "metricsLoggingInterval"))
    mem = r.mapping(kb.get("inMemoryConfig"), "indexerConfig.kvBlockIndexConfig.inMemoryConfig",
                    ("size", "podCacheSize"))
    for name in ("size", "podCacheSize"):
        if name in mem:
            r.positive_int(mem[name], f"indexerConfig.kvBlockIndexConfig.inMemoryConfig.{name}")
    if "enableMetrics" in kb:
        r.typed(kb["enableMetrics"], "indexerConfig.kvBlockIndexConfig.enableMetrics", bool, "a boolean")
    weights = _weights(r, ix.get("kvCacheBackendConfigs"))
    ke = r.mapping(kv_events, "kvEventsConfig",
                   ("topicFilter", "concurrency", "engineType", "discoverPods", "podDiscoveryConfig"))
    topic = None
    if "topicFilter" in ke:
        topic = r.typed(ke["topicFilter"], "kvEventsConfig.topicFilter", str, "a string")
    if "concurrency" in ke:
        r.positive_int(ke["concurrency"], "kvEventsConfig.concurrency")
    if "engineType" in ke and ke["engineType"] not in ("vllm", "sglang"):
        raise r.error("kvEventsConfig.engineType", f"expected vllm or sglang, got {ke['engineType']!r}")
    discover = r.typed(ke.get("discoverPods", True), "kvEventsConfig.discoverPods", bool, "a boolean")
    pd = r.mapping(ke.get("podDiscoveryConfig"), "kvEventsConfig.podDiscoveryConfig",
                   ("socketPort", "podLabelSelector", "podNamespace"))
    port = None
    if "socketPort" in pd:
        port = r.positive_int(pd["socketPort"], "kvEventsConfig.podDiscoveryConfig.socketPort")
        if port > 65535:
            raise r.error("kvEventsConfig.podDiscoveryConfig.socketPort", f"expected a port 1-65535, got {port}")
    for name in ("podLabelSelector", "podNamespace"):
        if name in pd:
            r.typed(pd[name], f"kvEventsConfig.podDiscoveryConfig.{name}", str, "a string")
    return LlmdPreciseConfig(weights, block, port if discover else None, topic)


def _weights(r: _Reader, raw: Any) -> dict[str, float]:
    if raw is None:
        return {}
    path = "indexerConfig.kvCacheBackendConfigs"
    if not isinstance(raw, list):
        raise r.error(path, f"expected a list of {{name, weight}}, got {raw!r}")
    out: dict[str, float] = {}
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        m = r.mapping(item, where, ("name", "weight"))
        name = str(m.get("name", "")).lower()
        if name not in ("gpu", "cpu"):
            raise r.error(f"{where}.name", f"expected gpu or cpu (the tiers Pointsman indexes), got {m.get('name')!r}")
        weight = r.typed(m.get("weight", 1.0), f"{where}.weight", float, "a number")
        if weight < 0:
            raise r.error(f"{where}.weight", f"expected a weight >= 0, got {weight!r}")
        out["gpuWeight" if name == "gpu" else "cpuWeight"] = weight
    return out
