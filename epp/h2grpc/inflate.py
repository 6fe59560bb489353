"""Compressed request messages (gRPC message flag 1, in the call's `grpc-encoding`): gzip and deflate, as grpc
clients send them (`compression=grpc.Compression.Gzip`).

Inflating runs on the server's one inflater thread (zlib lets go of the GIL while it works), so a compressed
message never holds up the event loop; one message is inflated at a time per server, and per connection one waits
for that thread (`Queue`), the others wait on their streams, held against the windows. A client sending gzip bombs
costs at most one core and one message limit of memory. Inflation goes in steps and stops as soon as the output
passes the limit.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor

_STEP = 1 << 20
WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


class TooLarge(Exception):
    pass


class Broken(Exception):
    pass


def inflate(message: bytes, wbits: int, limit: int) -> bytes:
    """The inflated message; TooLarge past `limit` bytes, Broken for a stream that is not valid or is cut short."""
    inflater = zlib.decompressobj(wbits)
    parts: list[bytes] = []
    total = 0
    data: bytes = message
    try:
        while True:
            chunk = inflater.decompress(data, min(_STEP, limit - total + 1))
            total += len(chunk)
            if total > limit:
                break
            parts.append(chunk)
            data = inflater.unconsumed_tail
            if inflater.eof or (not data and not chunk):
                break
    except zlib.error:
        parts.clear()  # an exception keeps this frame (and what it holds) alive as long as it is kept
        raise Broken("not a valid stream") from None
    if total > limit:
        parts.clear()
        raise TooLarge
    if not inflater.eof:
        raise Broken("truncated")
    return parts[0] if len(parts) == 1 else b"".join(parts)


class Queue:
    """One connection's compressed messages, inflated one at a time, in arrival order, on the server's inflater
    thread: what a connection can make that thread do is one message at a time, and what waits is held by its
    stream (against the windows and budgets). `done(result)` is called on the loop with the message or the error."""

    def __init__(self, loop: asyncio.AbstractEventLoop, executor: Callable[[], Executor], limit: int) -> None:
        self.loop = loop
        self.executor = executor
        self.limit = limit
        self.waiting: deque[tuple[Callable[[bytes | Exception], None], bytes, int]] = deque()

    def add(self, done: Callable[[bytes | Exception], None], message: bytes, wbits: int) -> None:
        self.waiting.append((done, message, wbits))
        if len(self.waiting) == 1:
            self._start()

    def clear(self) -> None:
        self.waiting.clear()

    def _start(self) -> None:
        if self.waiting:
            _, message, wbits = self.waiting[0]
            future = self.loop.run_in_executor(self.executor(), inflate, message, wbits, self.limit)
            future.add_done_callback(self._finished)

    def _finished(self, future: asyncio.Future[bytes]) -> None:
        if not self.waiting:
            return  # cleared: the connection is gone
        done, _, _ = self.waiting.popleft()
        result: bytes | Exception
        try:
            result = future.result()
        except Exception as e:
            result = e
        self._start()
        done(result)
