"""Request header blocks: decoded with `hpack`, and the same block decoded once.

Envoy sends every ext_proc stream the same header block, byte for byte (46 bytes: indexed fields and the :path
as a Huffman-coded literal without indexing); hpack takes 40-60 µs to decode it, a fifth of Pointsman's CPU per
request. A block that does not change the decoder's dynamic table (no literal with incremental indexing, no table
size update) decodes to the same fields for as long as the table does not change, and the table only changes
when a block that changes it is decoded, so:
- a block is decoded by `hpack.Decoder` (which enforces the header-list limit) unless it is in the cache;
- after decoding, a short block that leaves the table alone is cached; any other block empties the cache.
The cache is small (32 blocks of up to 1 KiB): what a client can make it hold is bounded.
"""

from __future__ import annotations

import logging

import hpack

# hpack logs every block it decodes at DEBUG (`epp serve -v 3` turns DEBUG on): client bytes, per request
logging.getLogger("hpack").setLevel(logging.INFO)

_MAX_BLOCK = 1024
_MAX_ENTRIES = 32


class HeaderDecoder:
    __slots__ = ("decoder", "_cache")

    def __init__(self, max_header_list_size: int) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._cache: dict[bytes, list[tuple[bytes, bytes]]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The header list (raw bytes); hpack's errors propagate (the connection cannot go on after them)."""
        cached = self._cache.get(block)
        if cached is not None:
            return list(cached)
        headers: list[tuple[bytes, bytes]] = self.decoder.decode(block, raw=True)  # type: ignore[assignment]
        if not leaves_table_alone(block):
            self._cache.clear()
        elif len(block) <= _MAX_BLOCK:
            if len(self._cache) >= _MAX_ENTRIES:
                self._cache.clear()
            self._cache[bytes(block)] = list(headers)
        return headers


def leaves_table_alone(block: bytes) -> bool:
    """True when the block (already decoded without error) has only indexed fields and literals without indexing
    or never indexed (RFC 7541 §6.1, §6.2.2, §6.2.3); False for anything that may change the dynamic table."""
    pos, end = 0, len(block)
    try:
        while pos < end:
            first = block[pos]
            if first & 0x80:  # indexed field
                pos = _skip_int(block, pos, 7)
            elif first & 0xE0 == 0:  # a literal without indexing (0000xxxx) or never indexed (0001xxxx)
                index_is_zero = first & 0x0F == 0
                pos = _skip_int(block, pos, 4)
                if index_is_zero:
                    pos = _skip_string(block, pos)
                pos = _skip_string(block, pos)
            else:  # literal with incremental indexing, or a table size update
                return False
    except IndexError:
        return False
    return pos == end


def _skip_int(data: bytes, pos: int, prefix_bits: int) -> int:
    mask = (1 << prefix_bits) - 1
    if data[pos] & mask < mask:
        return pos + 1
    pos += 1
    while data[pos] & 0x80:
        pos += 1
    return pos + 1


def _skip_string(data: bytes, pos: int) -> int:
    mask = 0x7F
    length = data[pos] & mask
    if length < mask:
        return pos + 1 + length
    value, shift = length, 0
    pos += 1
    while True:
        b = data[pos]
        pos += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return pos + value
