"""Prefix-cache state: prompt block hashing and a bounded per-endpoint block index."""

from scheduling.prefix.cycle import cycle_blocks, cycle_hashes, cycle_matches, record_choice, shared_index
from scheduling.prefix.hashing import BlockHasher, block_hashes, chain_seed
from scheduling.prefix.index import PrefixIndex

__all__ = [
    "BlockHasher",
    "cycle_blocks",
    "PrefixIndex",
    "block_hashes",
    "chain_seed",
    "cycle_hashes",
    "cycle_matches",
    "record_choice",
    "shared_index",
]
