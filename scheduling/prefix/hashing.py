"""Approximate prompt block hashes.

Characters stand in for tokens: one block is `block_tokens × 4` characters. Hashes are chained xxhash64:
    seed    = xxh64(model ‖ cache_salt)
    block_i = xxh64(chunk_i ‖ little-endian-uint64(block_{i-1}))      (block_{-1} = seed)
A trailing partial block is included; at most `max_blocks` blocks are hashed. ASCII prompts are hashed as
bytes directly; other prompts are sliced by characters and each chunk UTF-8 encoded.
"""

from __future__ import annotations

import struct

import xxhash

from scheduling.types import CHARS_PER_TOKEN

_h64 = xxhash.xxh64_intdigest
_pack = struct.Struct("<Q").pack


def chain_seed(model: str, cache_salt: str = "") -> int:
    return _h64((model + cache_salt).encode("utf-8"))


def block_hashes(
    prompt: str, model: str, cache_salt: str = "", block_tokens: int = 16, max_blocks: int = 256
) -> list[int]:
    """The chained block hashes of `prompt` (see module docstring)."""
    if not prompt or max_blocks <= 0:
        return []
    step = block_tokens * CHARS_PER_TOKEN
    prev = chain_seed(model, cache_salt)
    h64 = _h64
    pack = _pack
    text = prompt[: step * max_blocks]
    if text.isascii():
        data = text.encode("ascii")
        return [prev := h64(data[i : i + step] + pack(prev)) for i in range(0, len(data), step)]
    return [prev := h64(text[i : i + step].encode("utf-8") + pack(prev)) for i in range(0, len(text), step)]


class BlockHasher:
    """The same chain as `block_hashes`, computed lazily: `upto(k)` hashes only the first k blocks.

    Matching stops at the first block no endpoint holds, so a decision usually needs only a prefix of the
    chain; the rest is hashed when the blocks are recorded after the pick (pre_request).
    """

    __slots__ = ("_data", "_step", "total", "hashes", "_prev")

    def __init__(
        self, prompt: str, model: str, cache_salt: str = "", block_tokens: int = 16, max_blocks: int = 256
    ) -> None:
        step = block_tokens * CHARS_PER_TOKEN
        text = prompt[: step * max(0, max_blocks)]
        self._step = step
        self._data: bytes | str = text.encode("ascii") if text.isascii() else text
        self.total = -(-len(text) // step)
        self.hashes: list[int] = []
        self._prev = chain_seed(model, cache_salt)

    def upto(self, k: int) -> list[int]:
        """The hash list, extended to at least min(k, total) blocks."""
        hashes = self.hashes
        have = len(hashes)
        if k > self.total:
            k = self.total
        if have >= k:
            return hashes
        step = self._step
        data = self._data
        prev = self._prev
        h64 = _h64
        pack = _pack
        if isinstance(data, bytes):
            hashes += [
                prev := h64(data[i : i + step] + pack(prev)) for i in range(have * step, k * step, step)
            ]
        else:
            hashes += [
                prev := h64(data[i : i + step].encode("utf-8") + pack(prev))
                for i in range(have * step, k * step, step)
            ]
        self._prev = prev
        return hashes

    def all(self) -> list[int]:
        return self.upto(self.total)
