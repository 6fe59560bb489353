"""Request header blocks: assembled from HEADERS and CONTINUATION, decoded with `hpack`, the same block once.

`HeaderAssembly` collects a block spread over CONTINUATION frames (RFC 9113 §6.10), bounded in frames and bytes
before anything is decoded, and turns decoding errors into connection errors. `HeaderDecoder` decodes:

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
from typing import TYPE_CHECKING

import hpack

from epp.h2grpc.frames import COMPRESSION_ERROR, END_HEADERS, ENHANCE_YOUR_CALM, PROTOCOL_ERROR, H2Error

if TYPE_CHECKING:
    from epp.h2grpc.budget import Budget
    from epp.h2grpc.limits import ServerLimits

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


class HeaderAssembly:
    """One connection's request header blocks: at most one open (HEADERS without END_HEADERS) at a time."""

    __slots__ = ("decoder", "budget", "max_bytes", "max_frames", "_block", "_sid", "_flags", "_frames",
                 "_self_dependent")

    def __init__(self, limits: ServerLimits, budget: Budget) -> None:
        self.decoder = HeaderDecoder(limits.max_header_list_bytes)
        self.budget = budget  # CONTINUATION frames with nothing in them spend its empty-frame budget
        self.max_bytes = limits.max_header_list_bytes
        self.max_frames = limits.max_continuation_frames
        self._block: bytearray | None = None  # a header block waiting for its CONTINUATION frames
        self._sid = 0
        self._flags = 0
        self._frames = 0
        self._self_dependent = False

    def check_size(self, block: bytes | bytearray) -> None:
        if len(block) > self.max_bytes:
            raise H2Error(ENHANCE_YOUR_CALM, "a header block over the limit")

    def begin(self, sid: int, flags: int, block: bytes, self_dependent: bool) -> None:
        """HEADERS without END_HEADERS: the block goes on in CONTINUATION frames."""
        self._block = bytearray(block)
        self._sid, self._flags, self._frames = sid, flags, 0
        self._self_dependent = self_dependent

    def continuation(self, flags: int, sid: int, payload: bytes) -> tuple[int, bytes, bool] | None:
        """A CONTINUATION frame: (the HEADERS frame's flags, the whole block, self-dependent) once it ends the
        block, else None; H2Error on a connection error."""
        block = self._block
        if block is None or sid != self._sid:
            raise H2Error(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        self._frames += 1
        if self._frames > self.max_frames:
            raise H2Error(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        if payload or flags & END_HEADERS:
            self.budget.empty_run = 0
        elif why := self.budget.empty_frame():
            raise H2Error(ENHANCE_YOUR_CALM, why)
        block += payload
        self.check_size(block)
        if not flags & END_HEADERS:
            return None
        self._block = None
        return self._flags, bytes(block), self._self_dependent

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The header list; every block is decoded, even a stream's we ignore: the decoder's table must follow the
        client's."""
        try:
            return self.decoder.decode(block)
        except hpack.OversizedHeaderListError as e:
            raise H2Error(ENHANCE_YOUR_CALM, "a header list over the limit") from e
        except Exception as e:  # any HPACK error
            raise H2Error(COMPRESSION_ERROR, "the header block cannot be decoded") from e


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
