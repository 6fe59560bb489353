"""core-metrics-extractor (llm-d data layer): reads queue, running, KV usage, LoRA and cache geometry from the
scraped metrics, with the engine chosen per endpoint by a pod label.

    engine(e) = labels(e)[engineLabelKey] or defaultEngine        engineLabelKey "llm-d.ai/engine-type", "vllm"
    built-in engines: vllm, sglang, trtllm-serve (trtllm, tensorrt-llm), triton

Custom per-engine metric specs (llm-d's `engineConfigs`) are not supported: the built-in mappings are the ones
above, and a config that sets them is refused rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.framework import BuildContext, ConfigError, System, register
from scheduling.framework.errors import join_path

ENGINES = ("vllm", "sglang", "trtllm-serve", "trtllm", "tensorrt-llm", "triton")


@dataclass(frozen=True)
class Params:
    engineLabelKey: str = "llm-d.ai/engine-type"
    defaultEngine: str = "vllm"
    engineConfigs: list[dict[str, str]] | None = None


@register("core-metrics-extractor")
class CoreMetricsExtractor(System[Params]):
    Params = Params

    def setup(self, build: BuildContext) -> None:
        p = self.params
        if p.engineConfigs:
            raise ConfigError(build.source, join_path(build.path, "engineConfigs"),
                              "custom engine metric specs are not supported; the built-in engines are "
                              + ", ".join(ENGINES))
        if p.defaultEngine not in ENGINES:
            raise ConfigError(build.source, join_path(build.path, "defaultEngine"),
                              f"expected one of {', '.join(ENGINES)}, got {p.defaultEngine!r}")
