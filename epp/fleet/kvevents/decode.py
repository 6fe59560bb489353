"""Decode vLLM / SGLang KV-cache event messages: ZMQ frames in, typed events out. Pure: no I/O.

Wire format (vLLM `vllm/distributed/kv_events.py`, SGLang's copy of it):

* A message is three frames: ``[topic, seq, payload]``. ``seq`` is an unsigned 64-bit big-endian counter per
  publisher (and per data-parallel rank), starting at 0. A publisher with a snapshot endpoint appends a 16-byte
  stream id to it (24 bytes in all); the id changes when the publisher restarts.
* ``payload`` is msgpack. The batch is a positional array ``[ts, events, data_parallel_rank]`` (SGLang calls the
  third field ``attn_dp_rank``; older releases omit it). A map ``{"ts", "events", "data_parallel_rank"}`` is
  accepted too.
* Each event is either an *array* (vLLM up to ~0.23, SGLang: a tag first, then every field by position; older
  releases have fewer trailing fields) or a *map* with a ``"type"`` key (newer vLLM and SGLang; fields at their
  default are left out)::

      ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
       extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]
      ["BlockRemoved", block_hashes, medium, group_idx]
      ["AllBlocksCleared"]

* Block hashes are 64-bit integers, or bytes (vLLM without ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``). Bytes are
  normalised the way vLLM converts them (big-endian, low 64 bits); negative integers (SGLang's signed int64)
  are taken modulo 2**64. So one block has one hash here whatever the publisher's setting.
* ``medium`` is normalised to upper case; SGLang's ``CPU_PINNED`` becomes ``CPU``. ``None`` means GPU.

Public API: `decode_message(frames) -> EventBatch`, `decode_seq`, `decode_payload`, the event dataclasses, and
`DecodeError` (raised, with a message naming what is wrong, for anything that is not a valid message). Event
types this module does not know are returned as `UnknownEvent` so a consumer can count and skip them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

MASK64 = (1 << 64) - 1
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
_MEDIUM_ALIASES = {"CPU_PINNED": MEDIUM_CPU}

# Field order of the array form (after the tag), from vLLM's msgspec structs.
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                 "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


END_SEQ = (1 << 64) - 1  # -1 as an unsigned 64-bit seq: the end of a replay


def reply_frames(frames: list[bytes]) -> tuple[bytes, bytes, bytes] | None:
    """One replay reply's (topic, seq frame, payload), the ROUTER's empty delimiter dropped and a missing topic read
    as b""; None for a reply of any other shape."""
    f = frames[1:] if frames and frames[0] == b"" else frames
    if len(f) == 2:
        return b"", f[0], f[1]
    if len(f) == 3:
        return f[0], f[1], f[2]
    return None


class DecodeError(ValueError):
    """A message that is not a valid KV-event message; the text says what is wrong."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str = MEDIUM_GPU
    lora_name: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str = MEDIUM_GPU
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    tag: str


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(frozen=True, slots=True)
class EventBatch:
    seq: int
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None
    topic: bytes = b""
    stream_id: bytes = b""


# ---- scalars ---------------------------------------------------------------------------------------------
def block_hash(value: object) -> int:
    """One block hash as an unsigned 64-bit int (ints modulo 2**64, bytes as vLLM converts them)."""
    if type(value) is int:  # noqa: E721 - bool is not a hash
        return value & MASK64
    if isinstance(value, (bytes, bytearray)):
        if not value:
            raise DecodeError("empty block hash")
        return int.from_bytes(value, "big") & MASK64
    raise DecodeError(f"block hash must be an integer or bytes, got {type(value).__name__}")


def _hashes(value: object, what: str) -> list[int]:
    if not isinstance(value, list):
        raise DecodeError(f"{what}.block_hashes must be a list, got {type(value).__name__}")
    if all(type(h) is int and 0 <= h <= MASK64 for h in value):  # noqa: E721 - the common case, no copy
        return value
    return [block_hash(h) for h in value]


def _opt_int(value: object, field: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int:  # noqa: E721
        raise DecodeError(f"{field} must be an integer or nil, got {type(value).__name__}")
    return value


def _medium(value: object) -> str:
    if value is None:
        return MEDIUM_GPU
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise DecodeError(f"medium must be a string or nil, got {type(value).__name__}")
    up = value.upper()
    return _MEDIUM_ALIASES.get(up, up)


def _opt_str(value: object, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise DecodeError(f"{field} must be a string or nil, got {type(value).__name__}")
    return value


def decode_seq(frame: bytes) -> tuple[int, bytes]:
    """The sequence frame: 8 bytes big-endian, optionally followed by a publisher stream id."""
    if len(frame) < 8:
        raise DecodeError(f"sequence frame has {len(frame)} bytes; expected 8 (or 8 + a stream id)")
    return int.from_bytes(frame[:8], "big"), bytes(frame[8:])


# ---- events ----------------------------------------------------------------------------------------------
def _fields(raw: object, names: Sequence[str], what: str) -> dict[str, Any]:
    """Array form (positional, short arrays allowed) or map form → field dict."""
    if isinstance(raw, list):
        return dict(zip(names, raw[1:], strict=False))
    if not isinstance(raw, Mapping):
        raise DecodeError(f"{what} must be an array or a map, got {type(raw).__name__}")
    return {k: raw.get(k) for k in names}


def _stored(raw: object) -> BlockStored:
    f = _fields(raw, STORED_FIELDS, "BlockStored")
    if f.get("block_hashes") is None:
        raise DecodeError("BlockStored without block_hashes")
    hashes = _hashes(f["block_hashes"], "BlockStored")
    parent = f.get("parent_block_hash")
    tokens = f.get("token_ids")
    if tokens is None:
        tokens = []
    if not isinstance(tokens, list):
        raise DecodeError(f"BlockStored.token_ids must be a list, got {type(tokens).__name__}")
    size = f.get("block_size")
    if type(size) is not int or size < 1:  # noqa: E721
        raise DecodeError(f"BlockStored.block_size must be a positive integer, got {size!r}")
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None if parent is None else block_hash(parent),
        token_ids=tokens,
        block_size=size,
        lora_id=_opt_int(f.get("lora_id"), "BlockStored.lora_id"),
        medium=_medium(f.get("medium")),
        lora_name=_opt_str(f.get("lora_name"), "BlockStored.lora_name"),
        group_idx=_opt_int(f.get("group_idx"), "BlockStored.group_idx"),
    )


def _removed(raw: object) -> BlockRemoved:
    f = _fields(raw, REMOVED_FIELDS, "BlockRemoved")
    if f.get("block_hashes") is None:
        raise DecodeError("BlockRemoved without block_hashes")
    return BlockRemoved(
        block_hashes=_hashes(f["block_hashes"], "BlockRemoved"),
        medium=_medium(f.get("medium")),
        group_idx=_opt_int(f.get("group_idx"), "BlockRemoved.group_idx"),
    )


def _tag(raw: object) -> str:
    if isinstance(raw, list):
        if not raw:
            raise DecodeError("empty event array")
        tag = raw[0]
    elif isinstance(raw, Mapping):
        tag = raw.get("type")
    else:
        raise DecodeError(f"event must be an array or a map, got {type(raw).__name__}")
    if isinstance(tag, bytes):
        tag = tag.decode("utf-8", "replace")
    if not isinstance(tag, str):
        raise DecodeError(f"event tag must be a string, got {type(tag).__name__}")
    return tag


def decode_event(raw: object) -> KVEvent:
    """One event, array or map form."""
    tag = _tag(raw)
    if tag == "BlockStored":
        return _stored(raw)
    if tag == "BlockRemoved":
        return _removed(raw)
    if tag == "AllBlocksCleared":
        medium = raw.get("medium") if isinstance(raw, Mapping) else None
        return AllBlocksCleared(None if medium is None else _medium(medium))
    return UnknownEvent(tag)


# ---- batches ---------------------------------------------------------------------------------------------
def decode_payload(payload: bytes) -> tuple[float, list[KVEvent], int | None]:
    """The msgpack event batch → (ts, events, data_parallel_rank)."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError) as e:  # ExtraData, FormatError, StackError ...
        raise DecodeError(f"payload is not msgpack: {e}") from None
    except RecursionError:
        raise DecodeError("payload is not msgpack: nested too deeply") from None
    if isinstance(obj, list):
        if len(obj) < 2:
            raise DecodeError(f"event batch array has {len(obj)} element(s); expected [ts, events, dp_rank]")
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    elif isinstance(obj, Mapping):
        ts, events = obj.get("ts"), obj.get("events")
        rank = obj.get("data_parallel_rank", obj.get("attn_dp_rank"))
    else:
        raise DecodeError(f"event batch must be an array or a map, got {type(obj).__name__}")
    if type(ts) not in (int, float):
        raise DecodeError(f"event batch ts must be a number, got {type(ts).__name__}")
    if not isinstance(events, list):
        raise DecodeError(f"event batch events must be a list, got {type(events).__name__}")
    rank = _opt_int(rank, "data_parallel_rank")
    return float(ts), [decode_event(e) for e in events], rank


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """``[topic, seq, payload]`` → EventBatch. Raises DecodeError."""
    if len(frames) != 3:
        raise DecodeError(f"message has {len(frames)} frame(s); expected 3 (topic, seq, payload)")
    topic, seq_frame, payload = frames
    seq, stream = decode_seq(seq_frame)
    ts, events, rank = decode_payload(payload)
    return EventBatch(seq, ts, events, rank, bytes(topic), stream)
