"""The replica bus wire format: one msgpack array per ZMQ message, validated strictly on receipt.

    [MAGIC, sender, incarnation, seq, kind, body]            optionally followed by a 32-byte HMAC-SHA256 frame

- MAGIC "pm-bus/1" versions the format; anything else is dropped as malformed.
- sender: the sender's bus address as its peers know it ("10.0.0.5:9004", "ipc:///run/pointsman/bus-1"); a message
  whose sender is not a current peer is dropped as unknown.
- incarnation: a random 63-bit number drawn when the sender starts; a new one means the sender restarted, and
  everything held from its previous life is dropped.
- seq: increases by one per message within an incarnation; a load older than (or repeating) the last one heard is
  dropped: an older snapshot must never replace a newer one (a peer address may be reused by a restarted process
  before its old socket drains; over NATS a replay to one replica's inbox and the loads on the pool's subject
  arrive on two subscriptions, in either order). Records are idempotent and applied in any order.
- kind and body:
    "load"    {"ttl": seconds, "inflight": {endpoint: [requests, tokens]}, "state": {name: {endpoint: value}}}
              ABSOLUTE values of what the sender itself has in flight now. The receiver replaces the sender's
              previous snapshot and drops it when `ttl` passes without a new one: a lost message or a vanished
              peer never leaves phantom load behind.
    "records" {"name": str, "items": [...]}  idempotent records of a replicated plugin (prefix blocks of a pick,
              session bindings); applying one twice is harmless, losing one costs a little accuracy.

Everything here is pure: encode/decode raise `BusMessageError` with a reason that becomes a metric label.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import msgpack

MAGIC = "pm-bus/1"
KINDS = ("load", "records")
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_TTL_S = 60.0


class BusMessageError(ValueError):
    """A message that cannot be used. `reason` is a short label (malformed, unknown-peer, auth, stale...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BusMessage:
    sender: str
    incarnation: int
    seq: int
    kind: str
    body: Mapping[str, Any] = field(default_factory=dict)


def encode(msg: BusMessage, secret: bytes | None = None) -> list[bytes]:
    """The ZMQ frames of `msg`: the payload, plus its HMAC when a shared secret is configured."""
    payload = msgpack.packb([MAGIC, msg.sender, msg.incarnation, msg.seq, msg.kind, dict(msg.body)],
                            use_bin_type=True)
    if secret is None:
        return [payload]
    return [payload, hmac.new(secret, payload, hashlib.sha256).digest()]


def decode(frames: list[bytes], secret: bytes | None = None) -> BusMessage:
    """Validate and decode one message; raise BusMessageError otherwise."""
    if not frames or len(frames) > 2:
        raise BusMessageError("malformed", f"expected 1 or 2 frames, got {len(frames)}")
    payload = frames[0]
    if len(payload) > MAX_MESSAGE_BYTES:
        raise BusMessageError("malformed", f"message of {len(payload)} bytes exceeds {MAX_MESSAGE_BYTES}")
    if secret is not None:
        if len(frames) != 2 or not hmac.compare_digest(
            frames[1], hmac.new(secret, payload, hashlib.sha256).digest()
        ):
            raise BusMessageError("auth", "missing or wrong HMAC")
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False, max_bin_len=MAX_MESSAGE_BYTES)
    except Exception as exc:  # msgpack raises several unrelated exception types on garbage
        raise BusMessageError("malformed", f"not msgpack: {type(exc).__name__}") from None
    if not isinstance(raw, list) or len(raw) != 6 or raw[0] != MAGIC:
        raise BusMessageError("malformed", "not a pm-bus/1 message")
    _, sender, incarnation, seq, kind, body = raw
    if not isinstance(sender, str) or not sender or len(sender) > 512:
        raise BusMessageError("malformed", "bad sender")
    if not _is_int(incarnation) or not _is_int(seq) or seq < 0:
        raise BusMessageError("malformed", "bad incarnation or sequence")
    if kind not in KINDS or not isinstance(body, dict):
        raise BusMessageError("malformed", f"unknown kind {kind!r}")
    if kind == "load":
        _check_load(body)
    else:
        if not isinstance(body.get("name"), str) or not isinstance(body.get("items"), list):
            raise BusMessageError("malformed", "records need a name and a list of items")
    return BusMessage(sender, incarnation, seq, kind, body)


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_count(v: object) -> bool:
    return _is_int(v) and 0 <= v < 2**53


def _check_load(body: Mapping[str, Any]) -> None:
    ttl = body.get("ttl")
    if not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or not 0 < ttl <= MAX_TTL_S:
        raise BusMessageError("malformed", f"load ttl must be in (0, {MAX_TTL_S}] seconds")
    inflight = body.get("inflight")
    if not isinstance(inflight, dict):
        raise BusMessageError("malformed", "load without an inflight map")
    for key, value in inflight.items():
        if (not isinstance(key, str) or not isinstance(value, list) or len(value) != 2
                or not _is_count(value[0]) or not _is_count(value[1])):
            raise BusMessageError("malformed", "inflight entries are endpoint -> [requests, tokens]")
    state = body.get("state", {})
    if not isinstance(state, dict):
        raise BusMessageError("malformed", "load state must be a map")
    for name, values in state.items():
        if not isinstance(name, str) or not isinstance(values, dict):
            raise BusMessageError("malformed", "load state is name -> {endpoint: number}")
        for key, v in values.items():
            if not isinstance(key, str) or not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
                raise BusMessageError("malformed", "load state values are numbers")
