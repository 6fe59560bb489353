"""bench_streams.py's frames and its in-process measurements: Envoy's lean ext_proc sequence as raw HTTP/2 frames,
the HTTP/2 connection alone (`--transport-only`) and the whole EPP fed without sockets (`--in-process`)."""

from __future__ import annotations

import asyncio
import collections
import struct
import time

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    return struct.pack(">HBBBI", len(payload) >> 8, len(payload) & 0xFF, ftype, flags, sid) + payload


def request_messages() -> bytes:
    """The request headers and body messages (gRPC-framed), as Envoy sends them in FULL_DUPLEX_STREAMED."""
    import orjson

    from epp.protocol import BodyMode
    from tests.support.extproc import body_msg, headers_msg

    body = orjson.dumps({"model": "meta-llama/Llama-3.1-8B", "messages": [
        {"role": "user", "content": "What is the capital of France?"}]})
    out = b""
    for m in (headers_msg(mode=BodyMode.FULL_DUPLEX_STREAMED), body_msg(body, True)):
        data = m.SerializeToString()
        out += b"\x00" + struct.pack(">I", len(data)) + data
    return out


def header_block() -> bytes:
    """Fields that need no HPACK table state (static entries, never-indexed literals): the same bytes each time."""
    fields = [(":method", "POST", False), (":scheme", "http", False), (":path", PATH, True),
              (":authority", "epp", True), ("content-type", "application/grpc", True), ("te", "trailers", True)]
    return hpack.Encoder().encode(fields)


class _NullTransport:
    """Takes writes and drops them: `--transport-only` measures the HTTP/2 layer's own CPU, nothing else."""

    def get_extra_info(self, key: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if key == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def writelines(self, data: object) -> None:
        pass

    def write(self, data: object) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def transport_only(streams: int, requests: int) -> float:
    """CPU µs per request of epp.h2grpc's connection alone, in this process, with `streams` held open on one
    connection: each request opens a stream (headers, two messages, one reply), and the oldest one half-closes
    (the status goes out). The handler parses the message and answers (no routing)."""
    import gc

    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    from epp.h2grpc import H2Server
    from epp.h2grpc.connection import Connection
    from epp.h2grpc.limits import ServerLimits

    class Call:
        def __init__(self, stream: object) -> None:
            self.stream = stream

        def on_message(self, data: bytes) -> None:
            pb.ProcessingRequest.FromString(data)
            self.stream.send(b"reply")  # type: ignore[attr-defined]

        def on_end(self) -> None:
            self.stream.finish()  # type: ignore[attr-defined]

        def on_cancel(self) -> None:
            pass

    server = H2Server(limits=ServerLimits(max_concurrent_streams=max(streams + 1, 1024)))
    server.add_native_method(PATH, Call)
    conn = Connection(server)
    conn.connection_made(_NullTransport())  # type: ignore[arg-type]
    block, messages = header_block(), request_messages()
    conn.data_received(PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, (1 << 31) - 1))
                       + frame(8, 0, 0, struct.pack(">I", (1 << 31) - 65536)))
    sid, held = -1, collections.deque()
    for _ in range(streams + requests):
        sid += 2
        held.append(sid)
    held_ids = list(held)
    for s in held_ids[:streams]:
        conn.data_received(frame(1, 4, s, block) + frame(0, 0, s, messages))
    gc.collect()
    t0 = time.process_time()
    for i in range(requests):
        s = held_ids[streams + i]
        conn.data_received(frame(1, 4, s, block) + frame(0, 0, s, messages))
        conn.data_received(frame(0, 1, held_ids[i], b""))
    spent = time.process_time() - t0
    assert len(conn.streams) == streams, "every request was served"
    return spent / requests * 1e6


SERVE_FLAGS = ["--secure-serving=false", "--grpc-host", "127.0.0.1", "--grpc-health-port", "0", "--metrics-port", "0",
               "--refresh-metrics-interval", "1h", "--metrics-staleness-threshold", "2h", "-v", "0"]


async def in_process(streams: int, requests: int, endpoints: str, flags: list[str], connections: int = 4) -> float:
    """CPU µs per request of `epp serve`'s application in this process, with `streams` held open over
    `connections` HTTP/2 connections whose transports drop what they are given: each request opens a stream on
    the next connection (headers and both messages: routed) and half-closes that connection's oldest one."""
    import gc

    from epp.cmd.app import App
    from epp.cmd.settings import ServeSettings
    from epp.h2grpc.connection import Connection
    from epp.stack.ports import free_port

    app = App(ServeSettings.from_argv([*SERVE_FLAGS, "--grpc-port", str(free_port()), "--endpoints-file", endpoints,
                                       *flags]))
    await app.start()
    try:
        block, messages = header_block(), request_messages()
        conns, held = [], []
        for _ in range(connections):
            conn = Connection(app.server)
            conn.connection_made(_NullTransport())  # type: ignore[arg-type]
            conn.data_received(PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, (1 << 31) - 1))
                               + frame(8, 0, 0, struct.pack(">I", (1 << 31) - 65536)))
            conns.append([conn, 1])  # the connection, its next stream id
            held.append(collections.deque())

        def open_one(i: int) -> None:
            c = conns[i]
            c[0].data_received(frame(1, 4, c[1], block) + frame(0, 0, c[1], messages))
            held[i].append(c[1])
            c[1] += 2

        for k in range(streams):
            open_one(k % connections)
            if k % 64 == 0:
                await asyncio.sleep(0)
        await asyncio.sleep(0.1)
        gc.collect()
        t0 = time.process_time()
        for k in range(requests):
            i = k % connections
            open_one(i)
            conns[i][0].data_received(frame(0, 1, held[i].popleft(), b""))
            if k % 32 == 0:
                await asyncio.sleep(0)  # timers and callbacks run (passive health's tick, flow control)
        spent = time.process_time() - t0
        open_now = sum(len(c[0].streams) for c in conns)
        assert open_now == streams, f"{open_now} streams open, {streams} expected: not every request was served"
        return spent / requests * 1e6
    finally:
        await app.stop(0)
