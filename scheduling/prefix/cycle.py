"""Per-decision caching of prompt hashes and prefix matches, and the scheduler-scoped shared index.

Several plugins (prefix scorer, prefix-affinity filter, no-hit-LRU scorer, the P/D decider) need the same
hashes and matches; the first one computes them into the decision's `state`, the rest reuse them. Hashing is
lazy: matching hashes only as far as some endpoint still matches; pre_request hashes the rest to record it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduling.api import SchedulingContext
from scheduling.prefix.hashing import BlockHasher
from scheduling.prefix.index import DEFAULT_CAPACITY, PrefixIndex
from scheduling.types import Endpoint


def shared_index(shared: dict[Any, Any], block_tokens: int, capacity: int | None = None) -> PrefixIndex:
    """The index every prefix-aware plugin of one scheduler uses for this block size.

    `capacity` (the prefix scorer's lruCapacityPerServer) sets the default per-endpoint capacity, whichever
    plugin happened to create the index first.
    """
    key = ("prefix-index", block_tokens)
    index = shared.get(key)
    if index is None:
        index = shared[key] = PrefixIndex(capacity or DEFAULT_CAPACITY)
    elif capacity:
        index.default_capacity = capacity
    return index


def cycle_blocks(
    ctx: SchedulingContext, state: dict[str, Any], block_tokens: int, max_blocks: int
) -> BlockHasher:
    """This decision's lazily hashed prompt blocks."""
    key = ("prefix.blocks", block_tokens, max_blocks)
    blocks = state.get(key)
    if blocks is None:
        req = ctx.request
        blocks = state[key] = BlockHasher(
            req.prompt, req.target_model or req.model, req.cache_salt, block_tokens, max_blocks
        )
    return blocks


def cycle_hashes(
    ctx: SchedulingContext, state: dict[str, Any], block_tokens: int, max_blocks: int
) -> list[int]:
    """Every block hash of this decision's prompt (the same values as `block_hashes`)."""
    return cycle_blocks(ctx, state, block_tokens, max_blocks).all()


def cycle_matches(
    ctx: SchedulingContext, state: dict[str, Any], index: PrefixIndex, block_tokens: int, max_blocks: int
) -> tuple[dict[str, int], int]:
    """(endpoint key -> matched blocks, total blocks) for this decision's prompt, computed once."""
    key = ("prefix.match", id(index), max_blocks)
    got = state.get(key)
    if got is None:
        blocks = cycle_blocks(ctx, state, block_tokens, max_blocks)
        got = state[key] = (index.match_lazy(blocks), blocks.total)
    return got


def record_choice(
    ctx: SchedulingContext,
    state: dict[str, Any],
    index: PrefixIndex,
    block_tokens: int,
    max_blocks: int,
    endpoints: Iterable[Endpoint | None],
    *,
    auto_tune: bool = True,
) -> None:
    """Record this decision's prompt blocks for the chosen endpoints, once per decision and index, whichever
    prefix-aware plugin gets there first. With `auto_tune`, an endpoint's capacity follows its reported cache
    geometry (num_gpu_blocks × block_size / block_tokens)."""
    key = ("prefix.recorded", id(index))
    if state.get(key):
        return
    state[key] = True
    hashes = cycle_hashes(ctx, state, block_tokens, max_blocks)
    if not hashes:
        return
    for ep in endpoints:
        if ep is None:
            continue
        if auto_tune:
            m = ep.metrics
            if m.num_gpu_blocks and m.block_size:
                cap = max(1, m.num_gpu_blocks * m.block_size // block_tokens)
                if cap != index.capacity(ep.key):
                    index.set_capacity(ep.key, cap)
        index.record(ep.key, hashes, ctx.now)
