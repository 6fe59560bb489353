"""KV-cache events in vLLM's ZMQ wire format.

Frames: ``[topic, seq (8-byte big-endian), msgpack(EventBatch)]`` on a PUB socket, with
``topic = "kv@<ip>:<port>@<model>"`` and ``EventBatch = [ts, events, data_parallel_rank]``.
Events are positional arrays with the tag first:

* ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]``
* ``["BlockRemoved", block_hashes, medium]``
* ``["AllBlocksCleared"]``

Consecutive stores of one chain are merged into one BlockStored (token_ids is the concatenation, as vLLM
does for one request's new blocks); consecutive removals are merged into one BlockRemoved.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgpack

MEDIUM_GPU = "GPU"


def encode_events(
    raw: Sequence[tuple], block_size: int, lora_id: int | None = None, lora_name: str | None = None
) -> list[list[Any]]:
    """Turn KVCache events into vLLM positional event arrays."""
    out: list[list[Any]] = []
    for ev in raw:
        kind = ev[0]
        last = out[-1] if out else None
        if kind == "stored":
            _, h, parent, tokens = ev
            if last is not None and last[0] == "BlockStored" and last[1][-1] == parent:
                last[1].append(h)
                last[3].extend(tokens)
                continue
            out.append(["BlockStored", [h], parent, list(tokens), block_size, lora_id, MEDIUM_GPU, lora_name])
        elif kind == "removed":
            if last is not None and last[0] == "BlockRemoved":
                last[1].append(ev[1])
                continue
            out.append(["BlockRemoved", [ev[1]], MEDIUM_GPU])
        elif kind == "cleared":
            out.append(["AllBlocksCleared"])
    return out


def encode_batch(events: list[list[Any]], ts: float | None = None, dp_rank: int | None = None) -> bytes:
    return msgpack.packb([time.time() if ts is None else ts, events, dp_rank], use_bin_type=True)


def topic_for(host: str, port: int, model: str) -> str:
    return f"kv@{host}:{port}@{model}"


class KVEventPublisher:
    """A ZMQ PUB socket publishing one server's KV events."""

    def __init__(self, endpoint: str, topic: str, block_size: int) -> None:
        import zmq

        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 100000)
        self._sock.bind(endpoint)
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.block_size = block_size
        self.seq = 0

    def publish(self, raw: Sequence[tuple]) -> None:
        if not raw:
            return
        events = encode_events(raw, self.block_size)
        payload = encode_batch(events)
        import zmq

        try:
            self._sock.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # PUB drops on a full high-water mark, like vLLM
        self.seq += 1

    def close(self) -> None:
        self._sock.close(0)
