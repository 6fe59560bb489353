"""KV-cache events in vLLM's ZMQ wire format (and SGLang's variant of it).

Frames on a PUB socket: ``[topic, seq (8-byte big-endian, from 0), msgpack(batch)]`` with
``batch = [ts, events, data_parallel_rank]`` (the rank is 0 without data parallelism, as vLLM sends it).

Event encodings (``encoding``):

* ``array`` (vLLM up to ~0.23; msgspec ``array_like``: the tag first, then every field, trailing nils included)::

      ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
       extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]
      ["BlockRemoved", block_hashes, medium, group_idx]
      ["AllBlocksCleared"]

* ``map`` (newer vLLM): the same events as maps with a ``"type"`` key; fields at their default (``None``) are
  left out, fields without a default (``parent_block_hash``, ``lora_id``, ``medium``, ``lora_name``) are always
  written.

Event styles (``style``):

* ``vllm``: one BlockStored per chain of newly cached blocks (``token_ids`` = the blocks' tokens concatenated,
  ``parent_block_hash`` = the block before the first), one BlockRemoved per evicted block, ``group_idx`` 0,
  ``medium`` "GPU", ``lora_id`` / ``lora_name`` set for LoRA requests (ids from 1, in adapter load order).
* ``sglang``: SGLang's radix-cache publisher: one BlockStored and one BlockRemoved per block, the shorter
  field set (``[tag, block_hashes, parent, token_ids, block_size, lora_id, medium]``; ``lora_id`` always nil).

Block hashes (``hash_format``) are unsigned 64-bit ints, or 32 bytes whose low 8 bytes (big-endian) are that
int (vLLM's bytes hashes without ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``; a consumer converting them the way
vLLM does gets the same int).

Replay (``replay_endpoint``, a ROUTER socket): a client sends ``[b"", start_seq as 8 bytes big-endian]`` (a
DEALER; the ROUTER sees ``[identity, b"", start]``) and gets every retained batch with seq >= start_seq, then an
end marker with seq -1 (signed). With ``array`` encoding the replies are ``[b"", seq, payload]`` and the end
``[b"", -1, b""]`` (vLLM up to ~0.23); with ``map`` encoding they carry the topic as newer vLLM does:
``[b"", topic, seq, payload]`` and ``[b"", b"", -1, b""]``. The last `buffer_steps` batches are retained.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

MEDIUM_GPU = "GPU"
ENCODINGS = ("array", "map")
STYLES = ("vllm", "sglang")
HASH_FORMATS = ("int", "bytes")
END_SEQ = (-1).to_bytes(8, "big", signed=True)
_MASK = (1 << 64) - 1


def hash_bytes(h: int) -> bytes:
    """A 32-byte digest whose low 8 bytes (big-endian) are `h`."""
    filler = ((h * 0x9E3779B97F4A7C15) & _MASK).to_bytes(8, "big")
    return filler * 3 + h.to_bytes(8, "big")


def offset_endpoint_port(endpoint: str | None, rank: int) -> str | None:
    """vLLM's rule for data-parallel ranks: rank r publishes on the endpoint's port + r."""
    if not endpoint or rank == 0:
        return endpoint
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + rank}"


class EventEncoder:
    """Turns KVCache events (("stored", h, parent, tokens, lora[, extra keys]), ("removed", h), ("cleared",)) into
    wire events. A chain's ``extra_keys`` is one entry per block (its mm hashes, or nil), or nil for a chain
    without media, as vLLM publishes them."""

    def __init__(self, block_size: int, encoding: str = "array", style: str = "vllm", hash_format: str = "int",
                 lora_id: Callable[[str], int] | None = None) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"kv events encoding must be one of {ENCODINGS}, got {encoding!r}")
        if style not in STYLES:
            raise ValueError(f"kv events style must be one of {STYLES}, got {style!r}")
        if hash_format not in HASH_FORMATS:
            raise ValueError(f"kv events hash format must be one of {HASH_FORMATS}, got {hash_format!r}")
        self.block_size = block_size
        self.encoding = encoding
        self.style = style
        self.hash_format = hash_format
        self.lora_id = lora_id or (lambda name: 1)

    def _h(self, h: int | None) -> Any:
        if h is None or self.hash_format == "int":
            return h
        return hash_bytes(h)

    def _stored(self, hashes: list[int], parent: int | None, tokens: list[int], lora: str | None,
                extras: list[Any] | None = None) -> Any:
        hs = hashes if self.hash_format == "int" else [self._h(h) for h in hashes]
        if self.style == "sglang":
            fields = [hs, self._h(parent), tokens, len(tokens), None, MEDIUM_GPU]
            names = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
            return self._pack("BlockStored", names, fields, required=5)
        lora_id = self.lora_id(lora) if lora else None
        extra = [list(x) if x else None for x in extras] if extras and any(extras) else None
        fields = [hs, self._h(parent), tokens, self.block_size, lora_id, MEDIUM_GPU, lora, extra, 0, None, None]
        names = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                 "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
        return self._pack("BlockStored", names, fields, required=7)

    def _removed(self, h: int) -> Any:
        if self.style == "sglang":
            return self._pack("BlockRemoved", ("block_hashes", "medium"), [[self._h(h)], MEDIUM_GPU], required=1)
        return self._pack("BlockRemoved", ("block_hashes", "medium", "group_idx"), [[self._h(h)], MEDIUM_GPU, 0],
                          required=2)

    def _pack(self, tag: str, names: Sequence[str], fields: list[Any], required: int) -> Any:
        if self.encoding == "array":
            return [tag, *fields]
        out: dict[str, Any] = {"type": tag}
        for i, (name, value) in enumerate(zip(names, fields, strict=True)):
            if i < required or value is not None:  # msgspec omit_defaults: only defaulted fields are left out
                out[name] = value
        return out

    def encode(self, raw: Sequence[tuple]) -> list[Any]:
        # pending: ("chain", hashes, parent, tokens, lora) still open for extension, or an encoded event
        items: list[Any] = []
        chain: list[Any] | None = None
        for ev in raw:
            kind = ev[0]
            if kind == "stored":
                _, h, parent, tokens, *rest = ev
                lora = rest[0] if rest else None
                extra = rest[1] if len(rest) > 1 else None
                if self.style == "sglang":
                    items.append(self._stored([h], parent, list(tokens), lora))
                elif chain is not None and chain[0][-1] == parent and chain[3] == lora:
                    chain[0].append(h)
                    chain[2].extend(tokens)
                    chain[4].append(extra)
                else:
                    chain = [[h], parent, list(tokens), lora, [extra]]
                    items.append(_Open(chain))
                continue
            chain = None
            if kind == "removed":
                items.append(self._removed(ev[1]))
            elif kind == "cleared":
                items.append(self._pack("AllBlocksCleared", (), [], 0))
        return [self._stored(*it.chain) if isinstance(it, _Open) else it for it in items]


class _Open:
    """A BlockStored chain still being extended while encoding."""

    __slots__ = ("chain",)

    def __init__(self, chain: list[Any]) -> None:
        self.chain = chain


def encode_batch(events: list[Any], ts: float | None = None, dp_rank: int | None = 0) -> bytes:
    return msgpack.packb([time.time() if ts is None else ts, events, dp_rank], use_bin_type=True)


def topic_for(host: str, port: int, model: str) -> str:
    return f"kv@{host}:{port}@{model}"


class KVEventPublisher:
    """A ZMQ PUB socket publishing one engine's KV events, with an optional replay ROUTER socket.

    Binds `endpoint` (and `replay_endpoint`) as given; for data-parallel rank r pass the rank-0 endpoints and
    `dp_rank=r` (ports are offset by r, as vLLM does). Must be created inside a running asyncio loop when replay
    is on.

    The socket is an XPUB: to a SUB it is vLLM's PUB (same messages, same drops), and it lets a caller see that a
    subscription has arrived (`subscriptions()`), which a PUB hides: what is published before then is lost to that
    subscriber (ZMQ's slow joiner).
    """

    def __init__(self, endpoint: str, topic: str, block_size: int, replay_endpoint: str | None = None,
                 buffer_steps: int = 10_000, *, encoding: str = "array", style: str = "vllm",
                 hash_format: str = "int", dp_rank: int = 0, lora_id: Callable[[str], int] | None = None) -> None:
        import zmq
        import zmq.asyncio

        self.encoder = EventEncoder(block_size, encoding, style, hash_format, lora_id)
        self.endpoint = offset_endpoint_port(endpoint, dp_rank) or endpoint
        self.replay_endpoint = offset_endpoint_port(replay_endpoint, dp_rank)
        self.dp_rank = dp_rank
        self._sock = zmq.Context.instance().socket(zmq.XPUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription is passed up, duplicates included
        self._subscriptions = 0
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        self._sock.bind(self.endpoint)
        self.topic = topic.encode()
        self.block_size = block_size
        self.seq = 0
        self._retained: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._replay: Any = None
        self._task: asyncio.Task[None] | None = None
        self.replays_served = 0
        if self.replay_endpoint is not None:
            self._replay = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(self.replay_endpoint)
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    def subscriptions(self) -> int:
        """How many subscribe messages have reached this socket so far (each SUB sends one per topic prefix)."""
        import zmq

        while True:
            try:
                msg = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return self._subscriptions
            if msg[:1] == b"\x01":
                self._subscriptions += 1

    def publish(self, raw: Sequence[tuple]) -> None:
        """Encode KVCache events as one batch and send it (nothing is sent for no events)."""
        if raw:
            self.publish_events(self.encoder.encode(raw))

    def publish_events(self, events: list[Any], ts: float | None = None) -> int:
        """Send already encoded wire events as one batch; returns its seq."""
        import zmq

        payload = encode_batch(events, ts, self.dp_rank)
        seq = self.seq
        try:
            self._sock.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # PUB drops on a full high-water mark, like vLLM
        self._retained.append((seq, payload))
        self.seq += 1
        return seq

    async def _serve_replay(self) -> None:
        with_topic = self.encoder.encoding == "map"
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:  # vLLM ignores anything but [identity, "", start]
                continue
            ident, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self._retained):
                if seq >= start_seq:
                    head = [ident, b"", self.topic] if with_topic else [ident, b""]
                    await self._replay.send_multipart([*head, seq.to_bytes(8, "big"), payload])
            end = [ident, b"", b"", END_SEQ, b""] if with_topic else [ident, b"", END_SEQ, b""]
            await self._replay.send_multipart(end)
            self.replays_served += 1

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._replay is not None:
            with contextlib.suppress(Exception):
                self._replay.close(0)
        self._sock.close(0)
