"""gRPC-over-HTTP/2 wire details: status codes, the grpc-message encoding, grpc-timeout, message framing."""

from __future__ import annotations

import struct

import grpc

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14

_PREFIX = struct.Struct(">BI")
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def code_of(code: grpc.StatusCode | int) -> int:
    return code if isinstance(code, int) else int(code.value[0])


def frame(message: bytes) -> bytes:
    """One length-prefixed gRPC message (uncompressed)."""
    return _PREFIX.pack(0, len(message)) + message


def encode_grpc_message(text: str) -> bytes:
    """grpc-message is percent-encoded UTF-8: bytes outside 0x20-0x7E, and '%', become %XX."""
    raw = text.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout: up to 8 digits and a unit (H M S m u n), as seconds; None when malformed."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1:])
    return None if unit is None else int(value[:-1]) * unit
