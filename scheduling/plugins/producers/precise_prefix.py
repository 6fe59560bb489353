"""precise-prefix-cache-producer (Pointsman): the one reader-facing owner of the precise prefix data, the index of
what the engines really cache, built from their KV events (docs/kv-events.md).

    keys      = the request's token ids in blocks of the index's block size (16), chained from the LoRA adapter's
                root (scheduling.prefix.token_keys), at most maxPrefixBlocksToMatch (4096)     (once per decision)
    match(e)  = e's best data-parallel rank's consecutive blocks from the start, each from its best medium:
                GPU (events) > CPU (events) > speculative
    weighted  = (gpu + speculative) × gpuWeight (1.0) + cpu × cpuWeight (0.8)      (in scheduling.prefix.precise_data)
    pre_request: with speculativeIndexing (on), the prompt's keys are held for the chosen endpoint (and the P/D
                 prefill endpoint) as speculative entries until the engine's BlockStored confirms them, for as
                 long as the request runs (an engine keeps a running request's blocks; it may wait in the queue
                 long before it is admitted and its blocks published) and speculativeTTL (2 s) after it ends
                 (and at most SPECULATIVE_HOLD, 600 s, for a request whose end is never reported)

The index is the shell's (the service `precise-index`, kept across config reloads; the KV-event subscriber
writes the events and forgets departed endpoints); a scheduler loaded without the shell gets a private empty one
and forgets departed endpoints itself. It is declared in a config's plugin list, or created by the loader for
the plugins that read precise prefix data (precise-prefix-cache-scorer, estimated-latency-scorer with
prefixSource precise, Kthena's kvcache-aware and prefix-cache when the shell has the index).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, ConfigError, Plugin, Producer, register
from scheduling.framework.data import DataKey
from scheduling.framework.errors import join_path
from scheduling.framework.params import bounded, parse_duration
from scheduling.framework.plugin import SERVICES, State
from scheduling.prefix.precise import PreciseIndex
from scheduling.prefix.precise_data import PRECISE_INDEX, PRECISE_PREFIX, PreciseMatch

_MATCH = "precise-prefix.match"
_RECORDED = "precise-prefix.recorded"
SPECULATIVE_HOLD = 600.0  # seconds: the longest a running request's speculative entries are held


@dataclass(frozen=True)
class Params:
    speculativeIndexing: bool = True
    speculativeTTL: Any = "2s"  # a duration ("2s", "500ms") or seconds
    gpuWeight: float = bounded(1.0, min=0.0)
    cpuWeight: float = bounded(0.8, min=0.0)
    maxPrefixBlocksToMatch: int = bounded(4096, min=1)


def speculative_ttl(value: object, source: str, path: str) -> float:
    try:
        ttl = parse_duration(value)
    except ValueError as e:
        raise ConfigError(source, path, str(e)) from None
    if ttl <= 0:
        raise ConfigError(source, path, f"expected a positive duration, got {value!r}")
    return ttl


@register("precise-prefix-cache-producer")
class PrecisePrefixProducer(Producer[Params]):
    Params = Params
    defining_params = ("speculativeIndexing", "speculativeTTL", "gpuWeight", "cpuWeight", "maxPrefixBlocksToMatch")

    def setup(self, build: BuildContext) -> None:
        p: Params = self.params
        self.ttl = speculative_ttl(p.speculativeTTL, build.source, join_path(build.path, "speculativeTTL"))
        self.gpu_weight = p.gpuWeight
        self.cpu_weight = p.cpuWeight
        shared = build.services.get(PRECISE_INDEX)
        self.owned = not isinstance(shared, PreciseIndex)
        self.index: PreciseIndex = shared if isinstance(shared, PreciseIndex) else PreciseIndex(speculative_ttl=self.ttl)

    @property
    def block_tokens(self) -> int:
        return self.index.block_size

    def data_key(self) -> DataKey:
        return DataKey(PRECISE_PREFIX)

    def matches(self, ctx: SchedulingContext, state: State) -> PreciseMatch | None:
        got: PreciseMatch | None = state.get(_MATCH)
        if got is not None or _MATCH in state:
            return got
        req = ctx.request
        if req.token_ids is None:
            state[_MATCH] = None
            return None
        keys = self.index.keys_for(req.token_ids, req.lora_adapter, self.params.maxPrefixBlocksToMatch)
        got = state[_MATCH] = PreciseMatch(keys, self.index.match(keys, ctx.now))
        return got

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        """Hold the prompt's keys for the chosen (and prefill) endpoint until events confirm them."""
        if not self.params.speculativeIndexing or state.get(_RECORDED) is self:
            return
        state[_RECORDED] = self
        m = self.matches(ctx, state)
        if m is None or not m.keys:
            return
        for ep in (result.targets[0] if result.targets else None, result.prefill):
            if ep is not None:
                self.index.add_speculative(ep.key, m.keys, ctx.now, max(self.ttl, SPECULATIVE_HOLD))

    def response_complete(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        """The request ended: what events have not confirmed yet lapses speculativeTTL from now."""
        if state.get(_RECORDED) is not self:
            return
        m: PreciseMatch | None = state.get(_MATCH)
        if m is None or not m.keys:
            return
        for ep in (result.targets[0] if result.targets else None, result.prefill):
            if ep is not None:
                self.index.end_speculative(ep.key, m.keys, ctx.now, self.ttl)

    def endpoint_removed(self, key: str) -> None:
        if self.owned:  # the shell's index is forgotten by the shell (the subscriber is its writer)
            self.index.forget(key)

    def tracked_endpoints(self) -> Collection[str]:
        return self.index.endpoints() if self.owned else ()


def create_precise_prefix(key: DataKey, params: Mapping[str, object], requesters: list[Plugin[Any]]) -> Producer[Any]:
    """The loader's factory: a producer with the parameters the requesting plugins set, on the shell's index."""
    first = requesters[0]
    shared: dict[Any, Any] = {SERVICES: first.services}
    build = BuildContext(source=first.source, path=first.path, shared=shared, given=frozenset(params))
    values: dict[str, Any] = dict(params)  # checked by the requesting plugins' parameter parsing
    return PrecisePrefixProducer("precise-prefix-cache-producer", Params(**values), build)
