"""How plugins ask for the precise prefix data (the engines' KV events) and the request's token ids, and how the
precise and the approximate views of one endpoint are blended into one prefix hit.

Two pieces of shared data (scheduling/framework/data.py):

- `DataKey("precise-prefix")`: the precise index (scheduling.prefix.precise). The shell owns the index (its
  KV-event subscriber is the index's writer for events) and lends it to every loaded scheduler as the service
  `precise-index`, so it survives config reloads; without the service (a scheduler loaded on its own) the
  producer keeps a private, empty index. Its one producer, `precise-prefix-cache-producer`, computes the
  request's keys and matches once per decision and records Pointsman's own pick as speculative entries after it.
- `DataKey("token-ids")`: the request's tokens as the engine sees them (`LLMRequest.token_ids`). The shell
  tokenizes a request before scheduling only when the deciding config has a producer for this key
  (`token-producer`, declared or created for the plugins that read tokens), so a config that reads no tokens pays
  nothing.

Blending (`prefix_hits`), per candidate endpoint e:

    source(e) = "events"       when e's slots in the precise index are all live and the request has tokens
              = "approximate"  otherwise (pending, unknown after a failed replay, no KV events, no tokens)
    events:      blocks = consecutive blocks from the start held by e (best data-parallel rank), each counted once
                          from its best medium: GPU > CPU > speculative;  total = the prompt's full blocks
                 weighted = (gpu + speculative) × gpuWeight + cpu × cpuWeight
    approximate: blocks = weighted = consecutive blocks of the approximate index;  total = its prompt blocks
    ratio(e)   = min(1, weighted / total)       (0 when total is 0)
    tokens(e)  = weighted × block_tokens        (the prompt tokens e is expected to hold)

`decision_prefix_hits(state)` returns the last blend a decision computed (for explain and the dashboard).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from scheduling.api import SchedulingContext
from scheduling.framework.data import DataKey, DataRequest
from scheduling.framework.plugin import P, Plugin, Producer, State
from scheduling.prefix.precise import LIVE, EndpointMatch, PreciseIndex
from scheduling.prefix.shared import PrefixData
from scheduling.types import Endpoint

PRECISE_PREFIX = "precise-prefix"
TOKEN_IDS = "token-ids"
PRECISE_INDEX = "precise-index"  # the shell's service: its PreciseIndex
EVENTS, APPROXIMATE = "events", "approximate"

_LAST_HITS = "prefix.last_hits"

_PRECISE_HINT = "Add a precise-prefix-cache-scorer (or a precise-prefix-cache-producer)."
_TOKENS_HINT = "Add a token-producer (or a plugin that produces token ids, such as precise-prefix-cache-scorer)."


@dataclass(frozen=True, slots=True)
class PreciseMatch:
    """One decision's match against the precise index: the prompt's keys and each endpoint's match."""

    keys: Sequence[int]
    by_endpoint: Mapping[str, EndpointMatch]

    @property
    def total(self) -> int:
        return len(self.keys)


class PreciseData(Protocol):
    """What readers see of the precise producer."""

    index: PreciseIndex
    gpu_weight: float
    cpu_weight: float

    @property
    def block_tokens(self) -> int: ...

    def matches(self, ctx: SchedulingContext, state: State) -> PreciseMatch | None:
        """The request's match against the precise index, once per decision; None when it has no token ids."""
        ...


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """One endpoint's prefix hit and where it came from (see the module docstring)."""

    source: str  # "events" | "approximate"
    blocks: int
    total: int
    block_tokens: int
    weighted: float
    gpu: int = 0
    cpu: int = 0
    speculative: int = 0
    state: str | None = None  # the precise index's state of the endpoint (None: no KV events for it)

    @property
    def ratio(self) -> float:
        if not self.total:
            return 0.0
        r = self.weighted / self.total
        return r if r < 1.0 else 1.0

    @property
    def tokens(self) -> float:
        return self.weighted * self.block_tokens


def precise_request(params: Mapping[str, object], *, produces: bool) -> DataRequest:
    return DataRequest(DataKey(PRECISE_PREFIX), params, produces, _PRECISE_HINT)


def token_request(*, produces: bool = True) -> DataRequest:
    return DataRequest(DataKey(TOKEN_IDS), {}, produces, _TOKENS_HINT)


class PreciseReader(Plugin[P]):
    """Mixin for plugins that read the precise prefix data (and so the request's token ids): put it first in the
    bases (`class X(PreciseReader, PrefixReader, Scorer)`; the approximate data is the fallback). A plugin that
    reads it only in some configurations overrides `reads_precise`."""

    produces_precise: ClassVar[bool] = True
    precise: PreciseData | None = None

    @property
    def reads_precise(self) -> bool:
        return True

    def precise_params(self) -> Mapping[str, object]:
        """Producer parameters this plugin's config set (they must agree across the plugins sharing the data)."""
        return {}

    def data_requests(self) -> Sequence[DataRequest]:
        base: Sequence[DataRequest] = super().data_requests()
        if not self.reads_precise:
            return base
        return (*base, precise_request(self.precise_params(), produces=self.produces_precise), token_request())

    def bind_data(self, key: DataKey, producer: Producer[Any]) -> None:
        super().bind_data(key, producer)
        if key.name == PRECISE_PREFIX:
            self.precise = cast(PreciseData, producer)  # the loader binds this key to the precise producer


class _Hits:
    """Builds one decision's hits; endpoints matching nothing share one hit per (source, state)."""

    __slots__ = ("zeros", "amatches", "atotal", "ablock", "total", "block")

    def __init__(self, amatches: Mapping[str, int], atotal: int, ablock: int, total: int, block: int) -> None:
        self.zeros: dict[tuple[str, str | None], PrefixHit] = {}
        self.amatches, self.atotal, self.ablock = amatches, atotal, ablock
        self.total, self.block = total, block

    def zero(self, source: str, state: str | None) -> PrefixHit:
        hit = self.zeros.get((source, state))
        if hit is None:
            if source == EVENTS:
                hit = PrefixHit(EVENTS, 0, self.total, self.block, 0.0, state=state)
            else:
                hit = PrefixHit(APPROXIMATE, 0, self.atotal, self.ablock, 0.0, state=state)
            self.zeros[(source, state)] = hit
        return hit

    def approximate(self, key: str, state: str | None) -> PrefixHit:
        m = self.amatches.get(key, 0)
        if not m:
            return self.zero(APPROXIMATE, state)
        return PrefixHit(APPROXIMATE, m, self.atotal, self.ablock, float(m), state=state)


def prefix_hits(
    ctx: SchedulingContext, state: State, candidates: Sequence[Endpoint], precise: PreciseData | None,
    approx: PrefixData,
) -> dict[str, PrefixHit]:
    """Each candidate's prefix hit: from the KV events where its index state is live, else approximate. Computed
    once per decision (and per pair of indexes)."""
    cache_key = ("prefix.hits", id(precise), id(approx))
    cached: dict[str, PrefixHit] | None = state.get(cache_key)
    if cached is not None and all(e.key in cached for e in candidates):
        return cached
    amatches, atotal = approx.matches(ctx, state)
    pm = precise.matches(ctx, state) if precise is not None else None
    out: dict[str, PrefixHit] = dict(cached) if cached else {}
    if pm is None or precise is None:
        hits = _Hits(amatches, atotal, approx.block_tokens, 0, 0)
        for e in candidates:
            out[e.key] = hits.approximate(e.key, None)
    else:
        hits = _Hits(amatches, atotal, approx.block_tokens, pm.total, precise.block_tokens)
        index_state = precise.index.state
        gw, cw = precise.gpu_weight, precise.cpu_weight
        by = pm.by_endpoint
        for e in candidates:
            key = e.key
            st = index_state(key)
            if st != LIVE:
                out[key] = hits.approximate(key, st)
                continue
            m = by.get(key)
            if m is None:
                out[key] = hits.zero(EVENTS, st)
            else:
                w = (m.gpu + m.speculative) * gw + m.cpu * cw
                out[key] = PrefixHit(EVENTS, m.blocks, pm.total, hits.block, w, m.gpu, m.cpu, m.speculative, st)
    state[cache_key] = state[_LAST_HITS] = out
    return out


def decision_prefix_hits(state: State) -> dict[str, PrefixHit] | None:
    """The blended prefix hits this decision computed, if a precise-aware plugin ran (reading never computes)."""
    got: dict[str, PrefixHit] | None = state.get(_LAST_HITS)
    return got
