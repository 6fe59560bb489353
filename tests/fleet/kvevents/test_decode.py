"""The KV-event decoder: both encodings, old short arrays, SGLang's shape, hash normalisation, clear errors."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.fleet.kvevents.decode import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EventBatch,
    UnknownEvent,
    block_hash,
    decode_event,
    decode_message,
    decode_payload,
    decode_seq,
)
from modelsim.kvevents import EventEncoder, hash_bytes


def _msg(events: list, seq: int = 7, rank: int | None = 0, topic: bytes = b"kv@t") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), msgpack.packb([1700000000.5, events, rank], use_bin_type=True)]


RAW = [("stored", 11, None, list(range(16)), None), ("stored", 12, 11, list(range(16, 32)), None),
       ("removed", 11), ("cleared",)]


@pytest.mark.parametrize("encoding", ["array", "map"])
@pytest.mark.parametrize("hash_format", ["int", "bytes"])
def test_modelsim_events_round_trip(encoding: str, hash_format: str) -> None:
    events = EventEncoder(16, encoding=encoding, hash_format=hash_format).encode(RAW)
    batch = decode_message(_msg(events, seq=3, rank=0))
    assert isinstance(batch, EventBatch) and batch.seq == 3 and batch.data_parallel_rank == 0
    assert batch.ts == 1700000000.5 and batch.topic == b"kv@t" and batch.stream_id == b""
    stored, removed, cleared = batch.events
    assert stored == BlockStored([11, 12], None, list(range(32)), 16, None, "GPU", None, 0)
    assert removed == BlockRemoved([11], "GPU", 0)
    assert cleared == AllBlocksCleared()


def test_lora_fields_decoded() -> None:
    events = EventEncoder(16, lora_id=lambda name: 3).encode([("stored", 5, None, [1] * 16, "sql-lora")])
    (ev,) = decode_message(_msg(events)).events
    assert ev.lora_id == 3 and ev.lora_name == "sql-lora"


def test_short_arrays_of_older_releases() -> None:
    # vLLM 0.9: no medium/lora_name; vLLM 0.8: not even lora_id; BlockRemoved without medium
    a = decode_event(["BlockStored", [1, 2], None, list(range(32)), 16, None])
    b = decode_event(["BlockStored", [3], 2, list(range(16)), 16])
    c = decode_event(["BlockRemoved", [1]])
    assert a == BlockStored([1, 2], None, list(range(32)), 16, None, "GPU", None, None)
    assert b.parent_block_hash == 2 and b.medium == "GPU"
    assert c == BlockRemoved([1], "GPU", None)


def test_sglang_shapes_and_media() -> None:
    # SGLang: [tag, hashes, parent, tokens, block_size, lora_id, medium]; signed int64 hashes; CPU_PINNED tier
    ev = decode_event(["BlockStored", [-5], -1, [9], 1, None, "CPU_PINNED"])
    assert ev.block_hashes == [(1 << 64) - 5] and ev.parent_block_hash == (1 << 64) - 1
    assert ev.medium == "CPU" and ev.block_size == 1
    # older SGLang batch: [ts, events] without a rank; map events
    ts, events, rank = decode_payload(msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [4]}]]))
    assert rank is None and events == [BlockRemoved([4], "GPU", None)]
    ts, events, rank = decode_payload(msgpack.packb({"ts": 2, "events": [], "attn_dp_rank": 3}))
    assert (ts, events, rank) == (2.0, [], 3)


def test_bytes_hashes_normalise_like_vllm() -> None:
    h = 0xDEADBEEF12345678
    assert block_hash(hash_bytes(h)) == h == block_hash(h)
    assert block_hash(b"\x01" * 32) == int.from_bytes(b"\x01" * 8, "big")
    ev = decode_event({"type": "BlockStored", "block_hashes": [hash_bytes(h)], "parent_block_hash": hash_bytes(7),
                       "token_ids": [1, 2], "block_size": 2, "lora_id": None, "medium": "gpu", "lora_name": None})
    assert ev.block_hashes == [h] and ev.parent_block_hash == 7 and ev.medium == "GPU"


def test_unknown_event_types_are_returned_not_fatal() -> None:
    (ev,) = decode_message(_msg([["BlockPinned", [1]], ])).events
    assert ev == UnknownEvent("BlockPinned")
    assert decode_event({"type": "Snapshot"}) == UnknownEvent("Snapshot")


def test_sequence_frame_with_stream_id() -> None:
    assert decode_seq((5).to_bytes(8, "big") + b"S" * 16) == (5, b"S" * 16)
    frames = _msg([])
    frames[1] = (9).to_bytes(8, "big") + b"\x07" * 16
    assert decode_message(frames).stream_id == b"\x07" * 16


@pytest.mark.parametrize(
    ("frames", "needle"),
    [
        ([b"t", b"\0" * 8], "2 frame(s)"),
        ([b"t", b"\0" * 4, msgpack.packb([1.0, [], 0])], "sequence frame has 4 bytes"),
        ([b"t", b"\0" * 8, b"\xc1"], "not msgpack"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [], 0]) + b"x"], "not msgpack"),
        ([b"t", b"\0" * 8, msgpack.packb("hello")], "array or a map"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0])], "1 element"),
        ([b"t", b"\0" * 8, msgpack.packb(["x", [], 0])], "ts must be a number"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, {}, 0])], "events must be a list"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [], "r"])], "data_parallel_rank"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [[]], 0])], "empty event array"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [[7]], 0])], "tag must be a string"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [["BlockStored"]], 0])], "without block_hashes"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0]], 0])], "block_size"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [["BlockStored", 5, None, [1], 1]], 0])], "must be a list"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [["BlockRemoved", [1.5]]], 0])], "integer or bytes"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [["BlockStored", [1], None, "abc", 1]], 0])], "token_ids"),
        ([b"t", b"\0" * 8, msgpack.packb([1.0, [["BlockRemoved", [1], 5]], 0])], "medium"),
    ],
)
def test_bad_messages_raise_clear_errors(frames: list[bytes], needle: str) -> None:
    with pytest.raises(DecodeError, match=None) as exc:
        decode_message(frames)
    assert needle in str(exc.value)


_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8) \
    | st.binary(max_size=8)
_objects = st.recursive(_scalars, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=6), c,
                                                                                      max_size=4), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_fuzzed_frames_decode_or_raise_decode_error(frames: list[bytes]) -> None:
    try:
        decode_message(frames)
    except DecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(_objects, _objects)
def test_fuzzed_msgpack_structures_decode_or_raise_decode_error(events: object, rank: object) -> None:
    payload = msgpack.packb([1.0, events if isinstance(events, list) else [events], rank], use_bin_type=True)
    try:
        decode_payload(payload)
    except DecodeError:
        pass
