"""A raw HTTP/2 client (h2 over asyncio streams) for poking the h2 transport with frames a gRPC client never sends."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events


def grpc_frame(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), len(message)) + message


class RawH2:
    def __init__(self) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.events: list[h2.events.Event] = []
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self, port: int) -> RawH2:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.conn.initiate_connection()
        self.flush()
        return self

    def flush(self) -> None:
        assert self.writer is not None
        self.writer.write(self.conn.data_to_send())

    def request(self, path: str, *, method: str = "POST", content_type: str = "application/grpc",
                end: bool = False, extra: list[tuple[str, str]] | None = None) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "x"),
                   ("content-type", content_type), ("te", "trailers"), *(extra or [])]
        self.conn.send_headers(sid, headers, end_stream=end)
        self.flush()
        return sid

    def data(self, sid: int, data: bytes, end: bool = False) -> None:
        self.conn.send_data(sid, data, end_stream=end)
        self.flush()

    async def until(self, pred: Callable[[list[h2.events.Event]], bool], timeout: float = 5.0) -> None:
        assert self.reader is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not pred(self.events):
            left = end - loop.time()
            assert left > 0, f"condition not reached; events: {self.events}"
            chunk = await asyncio.wait_for(self.reader.read(65536), left)
            if not chunk:
                raise ConnectionError(f"closed; events: {self.events}")
            for ev in self.conn.receive_data(chunk):
                if isinstance(ev, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                self.events.append(ev)
            self.flush()

    def headers_of(self, sid: int) -> list[dict[str, str]]:
        """Every header block received on the stream (response headers, then trailers)."""
        out = []
        for ev in self.events:
            if isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)) and ev.stream_id == sid:
                out.append(dict(ev.headers))
        return out

    def body_of(self, sid: int) -> bytes:
        return b"".join(ev.data for ev in self.events if isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid)

    def ended(self, sid: int) -> bool:
        return any(isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)) and ev.stream_id == sid
                   for ev in self.events)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except ConnectionError:
                pass
