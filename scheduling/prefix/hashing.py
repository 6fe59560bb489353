"""Approximate prompt block hashes.

Characters stand in for tokens: one block is `block_tokens × 4` characters. Hashes are chained xxh3-64, each block
hashed with the previous block's hash as its seed:
    seed    = xxh3_64(utf8(model) ‖ 0x00 ‖ utf8(cache_salt))
    block_i = xxh3_64(utf8(chunk_i), seed=block_{i-1})      (block_{-1} = seed)
A trailing partial block is included; at most `max_blocks` blocks are hashed.

Speed (CPython spends its time per block, not per byte): an ASCII prompt is encoded once and cut into its blocks by
one precompiled `struct` unpack per run of up to SPLIT blocks, so each block costs one C call (the hash); other
prompts are sliced by characters and each chunk UTF-8 encoded (a lone surrogate, which no JSON parser of ours
produces, is encoded as is rather than failing). (The previous chain, xxh64 over the chunk followed
by the packed previous hash, cost a slice, a pack, a concatenation and a call per block: about 3x slower.)

Three ways to compute the same chain: `block_hashes` (all at once), `BlockHasher` (lazily, as far as matching
needs) and `StreamingBlockHasher` (as the text arrives, for a body parsed while it streams in).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import lru_cache

import xxhash

from scheduling.types import CHARS_PER_TOKEN

_h3 = xxhash.xxh3_64_intdigest
SPLIT = 256  # blocks cut by one unpack (bounds the cached struct formats)


def chain_seed(model: str, cache_salt: str = "") -> int:
    return _h3(model.encode("utf-8") + b"\0" + cache_salt.encode("utf-8"))


@lru_cache(maxsize=512)
def _splitter(count: int, step: int) -> Callable[[bytes, int], tuple[bytes, ...]]:
    """unpack_from(buffer, offset) -> `count` consecutive `step`-byte chunks."""
    return struct.Struct(f"{step}s" * count).unpack_from


def _chain_ascii(data: bytes, step: int, start: int, stop: int, prev: int, out: list[int]) -> int:
    """Append the hashes of blocks [start, stop) of ASCII `data` to `out`; returns the last one."""
    h = _h3
    full = min(stop, len(data) // step)
    i = start
    while i < full:
        n = min(full - i, SPLIT)
        out += [prev := h(chunk, prev) for chunk in _splitter(n, step)(data, i * step)]
        i += n
    if i < stop:  # the trailing partial block
        prev = h(data[i * step :], prev)
        out.append(prev)
    return prev


def _chain_text(text: str, step: int, start: int, stop: int, prev: int, out: list[int]) -> int:
    """Append the hashes of blocks [start, stop) of `text` (by characters, each UTF-8 encoded) to `out`."""
    h = _h3
    out += [
        prev := h(text[i : i + step].encode("utf-8", "surrogatepass"), prev)
        for i in range(start * step, stop * step, step)
    ]
    return prev


def block_hashes(
    prompt: str, model: str, cache_salt: str = "", block_tokens: int = 16, max_blocks: int = 256
) -> list[int]:
    """The chained block hashes of `prompt` (see module docstring)."""
    if not prompt or max_blocks <= 0:
        return []
    step = block_tokens * CHARS_PER_TOKEN
    text = prompt[: step * max_blocks]
    out: list[int] = []
    total = -(-len(text) // step)
    if text.isascii():
        _chain_ascii(text.encode("ascii"), step, 0, total, chain_seed(model, cache_salt), out)
    else:
        _chain_text(text, step, 0, total, chain_seed(model, cache_salt), out)
    return out


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
        data = self._data
        if isinstance(data, bytes):
            self._prev = _chain_ascii(data, self._step, have, k, self._prev, hashes)
        else:
            self._prev = _chain_text(data, self._step, have, k, self._prev, hashes)
        return hashes

    def all(self) -> list[int]:
        return self.upto(self.total)


class StreamingBlockHasher:
    """The same chain as `block_hashes`, computed as the prompt's text arrives: `feed(text)` hashes every block the
    text completes at once and keeps the partial tail; `finish()` hashes the tail (the trailing partial block) and
    returns the whole chain, equal to `block_hashes` of everything fed. Text past `max_blocks` blocks is ignored.
    Each character is encoded and hashed once; a feed adds about a microsecond of its own (pieces of 1 KB cost
    about twice what hashing the whole prompt at once does; bench/bench_hashing.py).
    """

    __slots__ = ("_step", "_max", "_tail", "hashes", "_prev", "finished")

    def __init__(self, model: str, cache_salt: str = "", block_tokens: int = 16, max_blocks: int = 256) -> None:
        self._step = block_tokens * CHARS_PER_TOKEN
        self._max = max(0, max_blocks)
        self._tail = ""  # characters of the block being filled (always fewer than one block)
        self.hashes: list[int] = []  # the complete blocks hashed so far
        self._prev = chain_seed(model, cache_salt)
        self.finished = False

    @property
    def pending(self) -> int:
        """Characters received but not hashed yet (the partial block)."""
        return len(self._tail)

    def feed(self, text: str) -> int:
        """Hash the blocks `text` completes; returns how many were added."""
        if self.finished:
            raise ValueError("StreamingBlockHasher.feed() after finish()")
        room = self._max - len(self.hashes)
        if room <= 0 or not text:
            return 0
        step = self._step
        buf = self._tail + text if self._tail else text
        n = min(len(buf) // step, room)
        if n:
            if buf.isascii():  # unpack reads only the n whole blocks: no slice of the text
                self._prev = _chain_ascii(buf.encode("ascii"), step, 0, n, self._prev, self.hashes)
            else:
                self._prev = _chain_text(buf, step, 0, n, self._prev, self.hashes)
        self._tail = buf[n * step :] if n < room else ""
        return n

    def finish(self) -> list[int]:
        """Hash the trailing partial block (if any, within max_blocks) and return the chain. Idempotent."""
        if not self.finished:
            self.finished = True
            tail = self._tail
            if tail and len(self.hashes) < self._max:
                self._prev = _h3(tail.encode("utf-8", "surrogatepass"), self._prev)
                self.hashes.append(self._prev)
            self._tail = ""
        return self.hashes
