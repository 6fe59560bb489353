"""grpc.aio servicers on the h2 transport: each call runs as a task with a grpc.aio-style ServicerContext.

The generated `add_*Servicer_to_server` functions hand the server `grpc.RpcMethodHandler`s; a call to one of
them gets a `_AioCall`, which feeds request messages to the servicer (`request_iterator`, `context.read()`, or
the single request of a unary method) and sends what it returns, yields or writes. Status follows grpc.aio: OK
at the end, the code and details of `context.abort(...)` or `set_code`/`set_details`, UNKNOWN for an exception.
Writes wait while more than 1 MiB is queued behind the peer's flow-control window; request messages not yet read
by the servicer count against the stream's window (`ServerStream.hold`). Off the hot path: health, EDS, the
Pointsman API.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from epp.h2grpc import status
from epp.h2grpc.stream import ServerStream, StreamHandler

log = logging.getLogger(__name__)


class _Abort(Exception):
    """Raised by context.abort(): ends the call with the context's code and details."""


def aio_call_factory(rpc: grpc.RpcMethodHandler) -> Callable[[ServerStream], StreamHandler]:
    def start(stream: ServerStream) -> StreamHandler:
        return _AioCall(stream, rpc)

    return start


class _AioCall:
    def __init__(self, stream: ServerStream, rpc: grpc.RpcMethodHandler) -> None:
        self.stream = stream
        self.rpc = rpc
        self.inbox: deque[bytes] = deque()
        self.queued = 0
        self.ended = False
        self.cancelled = False
        self.waiter: asyncio.Future[None] | None = None
        self.context = AioContext(self)
        self.task = asyncio.get_running_loop().create_task(self.run(), name=f"grpc {stream.path}")

    # ---- StreamHandler ---------------------------------------------------------------------------------------
    def on_message(self, data: bytes) -> None:
        self.inbox.append(data)
        self.queued += len(data)
        self.stream.hold(len(data))  # unread: counts against the stream's window
        if self.queued > self.stream.conn.max_message_bytes:
            self.stream.fail(status.RESOURCE_EXHAUSTED, "too many unread request messages")
            return
        self._wake()

    def on_end(self) -> None:
        self.ended = True
        self._wake()

    def on_cancel(self) -> None:
        self.cancelled = True
        self.task.cancel()
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # ---- reading -------------------------------------------------------------------------------------------
    async def next(self) -> bytes | None:
        """The next request message; None when the client has half-closed (or the call is over)."""
        while not self.inbox:
            if self.ended or self.cancelled:
                return None
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        data = self.inbox.popleft()
        self.queued -= len(data)
        self.stream.release(len(data))
        return data

    def decode(self, data: bytes) -> Any:
        des = self.rpc.request_deserializer
        return des(data) if des is not None else data

    async def requests(self) -> AsyncIterator[Any]:
        while (data := await self.next()) is not None:
            yield self.decode(data)

    # ---- the call ------------------------------------------------------------------------------------------
    async def run(self) -> None:
        rpc, ctx, stream = self.rpc, self.context, self.stream
        try:
            if rpc.request_streaming:
                request: Any = self.requests()
            else:
                data = await self.next()
                if data is None:
                    stream.finish(status.INTERNAL, "the request message is missing")
                    return
                request = self.decode(data)
            fn = (rpc.stream_stream if rpc.response_streaming else rpc.stream_unary) if rpc.request_streaming else (
                rpc.unary_stream if rpc.response_streaming else rpc.unary_unary)
            result = fn(request, ctx)
            if rpc.response_streaming:
                if inspect.isasyncgen(result):
                    async for message in result:
                        await ctx.write(message)
                elif inspect.isawaitable(result):
                    await result
                elif result is not None:
                    for message in result:
                        await ctx.write(message)
            else:
                response = await result if inspect.isawaitable(result) else result
                if ctx.code_ is None or ctx.code_ == status.OK:
                    await ctx.write(response)
            stream.finish(ctx.code_ or status.OK, ctx.details_ or "", ctx.trailers)
        except _Abort:
            stream.finish(ctx.code_ if ctx.code_ is not None else status.UNKNOWN, ctx.details_ or "", ctx.trailers)
        except asyncio.CancelledError:
            stream.finish(status.CANCELLED, "Cancelled")  # a no-op when the client is already gone
        except Exception as e:
            log.exception("%s failed", stream.path)
            stream.finish(status.UNKNOWN, f"Unexpected {type(e)}: {e}")
        finally:
            ctx.run_callbacks()


class AioContext:
    """The part of grpc.aio.ServicerContext a servicer on this transport can use."""

    def __init__(self, call: _AioCall) -> None:
        self._call = call
        self.code_: int | None = None
        self.details_: str | None = None
        self.trailers: list[tuple[bytes, bytes]] = []
        self._callbacks: list[Callable[[Any], None]] = []
        self._done = False

    async def read(self) -> Any:
        data = await self._call.next()
        return grpc.aio.EOF if data is None else self._call.decode(data)

    async def write(self, message: Any) -> None:
        call = self._call
        ser = call.rpc.response_serializer
        call.stream.send(ser(message) if ser is not None else message)
        await call.stream.writable()

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self.code_ = status.code_of(code)
        self.details_ = details
        self.set_trailing_metadata(trailing_metadata)
        raise _Abort(details)

    async def abort_with_status(self, st: Any) -> None:
        await self.abort(st.code, st.details, getattr(st, "trailing_metadata", ()))

    async def send_initial_metadata(self, metadata: Any) -> None:
        self._call.stream.start([(k.encode(), v.encode() if isinstance(v, str) else v) for k, v in metadata])

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code_ = status.code_of(code)

    def set_details(self, details: str) -> None:
        self.details_ = details

    def code(self) -> int | None:
        return self.code_

    def details(self) -> str | None:
        return self.details_

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailers = [(k.encode(), v.encode() if isinstance(v, str) else v) for k, v in metadata or ()]

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        return tuple((k.decode(), v) for k, v in self.trailers)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._call.stream.metadata())

    def peer(self) -> str:
        return self._call.stream.peer

    def peer_identities(self) -> None:
        return None

    def peer_identity_key(self) -> None:
        return None

    def auth_context(self) -> dict[str, Any]:
        return {}

    def time_remaining(self) -> float | None:
        timer = self._call.stream.timer
        return None if timer is None else max(0.0, timer.when() - asyncio.get_running_loop().time())

    def cancelled(self) -> bool:
        return self._call.cancelled

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._callbacks.append(callback)

    def set_compression(self, compression: Any) -> None:
        pass

    def disable_next_message_compression(self) -> None:
        pass

    def run_callbacks(self) -> None:
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("a done callback failed")
