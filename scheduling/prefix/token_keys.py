"""Pointsman's own prompt block keys, computed from token ids. Pure.

Engines hash blocks with a per-process seed (vLLM) or a hash Pointsman does not reproduce (SGLang), so the
precise index never compares engine hashes with request hashes. Both sides compute these keys from the token
ids instead: the request side from the tokenized prompt, the event side from BlockStored's ``token_ids``.

    root(lora) = xxh3_64(b"pointsman-kv\\0" ‖ utf8(lora or ""))
    key_0      = xxh3_64(le64(root) ‖ le32(tokens[0 : B]))
    key_i      = xxh3_64(le64(key_{i-1}) ‖ le32(tokens[i·B : (i+1)·B]))

`B` is Pointsman's key block size (independent of the engine's block size). Token ids are packed as unsigned
32-bit little-endian (ids outside 0..2**32-1 are taken modulo 2**32). Only full blocks get a key. The LoRA
adapter is part of the root, so the same prompt under two adapters never shares a key (the engines keep them
apart too).

Public API: `root_key`, `pack_tokens`, `chain_keys` (request side), `extend_chain` (event side, carrying a
partial tail across engine blocks smaller than `B`).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import xxhash

_h = xxhash.xxh3_64_intdigest
_MASK32 = 0xFFFFFFFF
_LITTLE = sys.byteorder == "little"
TOKEN_BYTES = 4


def root_key(lora: str | None = None) -> int:
    """The chain root for the base model (None) or a LoRA adapter."""
    return _h(b"pointsman-kv\0" + (lora or "").encode("utf-8"))


ROOT = root_key(None)


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as unsigned 32-bit little-endian bytes."""
    try:
        a = array("I", tokens)
    except (OverflowError, TypeError):
        a = array("I", (int(t) & _MASK32 for t in tokens))
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def chain_from(parent: int, data: bytes, block_size: int, max_blocks: int | None = None) -> list[int]:
    """Keys of the full blocks of packed tokens `data`, chained from `parent`."""
    step = block_size * TOKEN_BYTES
    n = len(data) // step
    if max_blocks is not None and n > max_blocks:
        n = max_blocks
    out: list[int] = []
    append = out.append
    h = _h
    prev = parent
    for i in range(0, n * step, step):
        prev = h(prev.to_bytes(8, "little") + data[i : i + step])
        append(prev)
    return out


def chain_keys(
    tokens: Sequence[int], block_size: int, lora: str | None = None, max_blocks: int | None = None
) -> list[int]:
    """The keys of a prompt's full blocks (request side)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    root = ROOT if lora is None else root_key(lora)
    return chain_from(root, pack_tokens(tokens), block_size, max_blocks)


def extend_chain(parent: int, tail: bytes, data: bytes, block_size: int) -> tuple[list[int], int, bytes]:
    """Continue a chain whose last full key is `parent` and whose partial block so far is `tail` (packed) with
    more packed tokens `data`. Returns (new full keys, last full key, new tail)."""
    buf = tail + data if tail else data
    keys = chain_from(parent, buf, block_size)
    used = len(keys) * block_size * TOKEN_BYTES
    return keys, (keys[-1] if keys else parent), buf[used:]
