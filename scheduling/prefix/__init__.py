"""Prefix-cache state: prompt block hashing, a bounded per-endpoint block index and its one producer."""

from scheduling.prefix.cycle import cycle_blocks, cycle_hashes, cycle_matches, decision_matches
from scheduling.prefix.hashing import BlockHasher, StreamingBlockHasher, block_hashes, chain_seed
from scheduling.prefix.index import PrefixIndex
from scheduling.prefix.shared import (
    APPROX_PREFIX,
    PREFIX_FIELDS,
    PrefixData,
    PrefixReader,
    approx_prefix_request,
)

__all__ = [
    "APPROX_PREFIX",
    "BlockHasher",
    "PREFIX_FIELDS",
    "PrefixData",
    "PrefixIndex",
    "PrefixReader",
    "StreamingBlockHasher",
    "approx_prefix_request",
    "block_hashes",
    "chain_seed",
    "cycle_blocks",
    "cycle_hashes",
    "cycle_matches",
    "decision_matches",
]
