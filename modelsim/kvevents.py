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

import asyncio
import time
from collections import deque
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
    """A ZMQ PUB socket publishing one server's KV events, with an optional replay ROUTER socket.

    Replay: a DEALER/REQ client sends ``[id, "", start_seq (8-byte big-endian)]`` to the ROUTER socket and
    gets every retained batch with seq >= start_seq as ``[id, "", seq, payload]``, then the sentinel
    ``[id, "", seq = -1 (signed 8-byte), ""]``. The last `retain` batches are kept.
    """

    def __init__(self, endpoint: str, topic: str, block_size: int, replay_endpoint: str | None = None,
                 retain: int = 10000) -> None:
        import zmq
        import zmq.asyncio

        self._sock = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 100000)
        self._sock.bind(endpoint)
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.block_size = block_size
        self.seq = 0
        self._retained: deque[tuple[int, bytes]] = deque(maxlen=retain)
        self.replay_endpoint = replay_endpoint
        self._replay: Any = None
        self._task: asyncio.Task[None] | None = None
        if replay_endpoint is not None:
            self._replay = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    def publish(self, raw: Sequence[tuple]) -> None:
        if not raw:
            return
        import zmq

        payload = encode_batch(encode_events(raw, self.block_size))
        seq = self.seq.to_bytes(8, "big")
        try:
            self._sock.send_multipart([self.topic, seq, payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # PUB drops on a full high-water mark, like vLLM
        if self._replay is not None:
            self._retained.append((self.seq, payload))
        self.seq += 1

    async def _serve_replay(self) -> None:
        while True:
            frames = await self._replay.recv_multipart()
            ident, start = frames[0], frames[-1]
            start_seq = int.from_bytes(start, "big", signed=True) if start else 0
            for seq, payload in list(self._retained):
                if seq >= start_seq:
                    await self._replay.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            await self._replay.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._replay is not None:
            self._replay.close(0)
        self._sock.close(0)
