"""precise-prefix-cache-scorer (llm-d): how much of the prompt's prefix an endpoint's engine really caches, from
the engines' KV-cache events (docs/kv-events.md), with Pointsman's own recent picks held as speculative entries.

    keys(r)    = the request's token ids in 16-token blocks (the shell tokenizes it: local tokenizer, the engine's
                 /tokenize, else the approximation; see token-producer)
    events(e)  = consecutive blocks from the start that e holds: gpu + cpu + speculative blocks, each once
    weighted   = (gpu + speculative) × w_gpu + cpu × w_cpu          w_gpu = 1.0, w_cpu = 0.8 (kvCacheBackendConfigs)
    score(e)   = min(1, weighted(e) / blocks(r))                    e's index state live (every rank)
               = approximate matched(e) / approximate blocks(r)     otherwise: pending, unknown (a failed replay),
                                                                    no KV events for e, or no token ids
    (0 for every endpoint when the prompt has no full block)

So it also produces the approximate prefix data (blockSizeTokens 16), its fallback, and the token ids. After the
pick, the chosen endpoint's keys enter the precise index as speculative entries (speculativeIndexing, on by
default in Pointsman; llm-d's default is off) that a BlockStored confirms or speculativeTTL (2s) retires.

llm-d's parameters: `speculativeIndexing`, `speculativeTTL`; `tokenProcessorConfig` (`blockSizeTokens` or
`blockSize`, `hashSeed`: accepted; Pointsman keys blocks from token ids at the shell's --kv-events-block-size, so
neither the engine's block size nor a seed has to match); `indexerConfig.kvCacheBackendConfigs` (`gpu` / `cpu`
weights), `indexerConfig.kvBlockIndexConfig` (`inMemoryConfig`, `enableMetrics`, `metricsLoggingInterval`:
accepted; the index is bounded per endpoint and always exports metrics); `kvEventsConfig` (`topicFilter`,
`discoverPods` + `podDiscoveryConfig.socketPort`: the subscription template for endpoints with no source of their
own when the command line sets none; `concurrency`, `engineType`, `podLabelSelector`, `podNamespace`: accepted).
Refused, with the reason: `indexerConfig.tokenizersPoolConfig` (tokenizers come from --tokenizers-dir; nothing is
downloaded), `kvBlockIndexConfig.redisConfig` / `costAwareMemoryConfig` (the index lives in the process),
`kvEventsConfig.zmqEndpoint` (Pointsman subscribes to each engine's own publisher).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduling.api import SchedulingContext
from scheduling.framework import BuildContext, Scorer, register
from scheduling.framework.errors import join_path
from scheduling.framework.plugin import State
from scheduling.plugins.producers.precise_prefix import speculative_ttl
from scheduling.plugins.scorers._precise_params import LlmdPreciseConfig, parse_llmd_config
from scheduling.prefix import PrefixReader
from scheduling.prefix.precise_data import PreciseReader, prefix_hits
from scheduling.types import Endpoint


@dataclass(frozen=True)
class Params:
    tokenProcessorConfig: Any = None
    indexerConfig: Any = None
    kvEventsConfig: Any = None
    speculativeIndexing: bool = True
    speculativeTTL: Any = "2s"


@register("precise-prefix-cache-scorer")
class PrecisePrefixCacheScorer(PreciseReader[Params], PrefixReader[Params], Scorer[Params]):
    Params = Params
    clamped = True
    produces_prefix = True

    def setup(self, build: BuildContext) -> None:
        p = self.params
        self.config: LlmdPreciseConfig = parse_llmd_config(p.tokenProcessorConfig, p.indexerConfig,
                                                           p.kvEventsConfig, build)
        self.ttl = speculative_ttl(p.speculativeTTL, build.source, join_path(build.path, "speculativeTTL"))

    def precise_params(self) -> Mapping[str, object]:
        p, given = self.params, self.given_params
        out: dict[str, object] = {}
        if "speculativeIndexing" in given:
            out["speculativeIndexing"] = p.speculativeIndexing
        if "speculativeTTL" in given:
            out["speculativeTTL"] = self.ttl
        out.update(self.config.weights)
        return out

    def kv_events_template(self) -> tuple[int | None, str | None]:
        """(port, topic) from kvEventsConfig, for the shell's subscriptions when its command line sets none."""
        return self.config.socket_port, self.config.topic_filter

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        hits = prefix_hits(ctx, state, candidates, self.precise, self.prefix)
        return [hits[e.key].ratio for e in candidates]
