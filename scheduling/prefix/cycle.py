"""Per-decision caching of prompt hashes and prefix matches.

Several plugins (prefix scorer, prefix-affinity filter, no-hit-LRU scorer, the P/D decider) need the same hashes
and matches; the first one to ask computes them into the decision's `state`, the rest reuse them. Hashing is lazy:
matching hashes only as far as some endpoint still matches; recording after the pick hashes the rest.
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework.plugin import State
from scheduling.prefix.hashing import BlockHasher
from scheduling.prefix.index import PrefixIndex

_LAST_MATCH = "prefix.last_match"


def decision_matches(state: State) -> tuple[dict[str, int], int] | None:
    """The prefix matches this decision computed, if any prefix-aware plugin ran: (endpoint key -> matched blocks,
    total blocks). For observers (the dashboard, explain); reading it never computes anything."""
    got: tuple[dict[str, int], int] | None = state.get(_LAST_MATCH)
    return got


def cycle_blocks(
    ctx: SchedulingContext, state: State, block_tokens: int, max_blocks: int
) -> BlockHasher:
    """This decision's lazily hashed prompt blocks."""
    key = ("prefix.blocks", block_tokens, max_blocks)
    blocks: BlockHasher | None = state.get(key)
    if blocks is None:
        req = ctx.request
        blocks = state[key] = BlockHasher(
            req.prompt, req.target_model or req.model, req.cache_salt, block_tokens, max_blocks
        )
    return blocks


def cycle_hashes(
    ctx: SchedulingContext, state: State, block_tokens: int, max_blocks: int
) -> list[int]:
    """Every block hash of this decision's prompt (the same values as `block_hashes`)."""
    return cycle_blocks(ctx, state, block_tokens, max_blocks).all()


def cycle_matches(
    ctx: SchedulingContext, state: State, index: PrefixIndex, block_tokens: int, max_blocks: int
) -> tuple[dict[str, int], int]:
    """(endpoint key -> matched blocks, total blocks) for this decision's prompt, computed once."""
    key = ("prefix.match", id(index), max_blocks)
    got: tuple[dict[str, int], int] | None = state.get(key)
    if got is None:
        blocks = cycle_blocks(ctx, state, block_tokens, max_blocks)
        got = state[key] = state[_LAST_MATCH] = (index.match_lazy(blocks), blocks.total)
    return got
