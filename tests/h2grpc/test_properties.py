"""Random and mutated frame sequences against the h2 transport: nothing escapes, nothing leaks, it keeps routing.

The server (the ext_proc service over a real director, tight limits) runs on its own event loop in a thread, on a
real socket. Each example opens a connection, sends the preface and a frame sequence drawn by hypothesis (frames
of every type with random flags, stream ids and payloads, mixed with valid requests, or a valid request with
bytes flipped, cut or inserted), reads what comes back, and closes. After each one:
- no exception reached the event loop and the connection logged no internal error;
- once the connection is gone the server holds nothing for it (no connection, no buffered byte);
- a fresh gRPC client is routed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.extproc.server import build_server
from epp.h2grpc.limits import ServerLimits
from tests.h2grpc.attacker import GRPC_HEADERS, PREFACE, frame, request_bytes
from tests.h2grpc.hostile import route_once
from tests.support.extproc import real_director
from tests.support.wait import wait_until

LIMITS = ServerLimits(max_concurrent_streams=8, max_message_bytes=64 * 1024, max_connection_buffer_bytes=256 * 1024,
                      max_server_buffer_bytes=1 << 20, initial_stream_window=65535,
                      initial_connection_window=131072, max_header_list_bytes=4096, handshake_timeout=0.5,
                      idle_timeout=0.5, premature_reset_streams=20, max_control_frames=50)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Served:
    """build_server's h2 server on a loop of its own, in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors: list[object] = []
        self.loop.set_exception_handler(lambda loop, context: self.errors.append(context))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server, _ = build_server(real_director(), limits=LIMITS)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.call(self.server.start())

    def call(self, coro):  # noqa: ANN001, ANN201
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _state(self) -> tuple[int, int]:
        return len(self.server.connections), self.server.buffered

    def state(self) -> tuple[int, int]:
        return self.call(self._state())

    def stop(self) -> None:
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def served():
    errors = _Errors()
    logger = logging.getLogger("epp.h2grpc")
    logger.addHandler(errors)
    served = Served()
    served.log = errors  # type: ignore[attr-defined]
    yield served
    served.stop()
    logger.removeHandler(errors)


# ---- what hypothesis draws -------------------------------------------------------------------------------------------
_SIDS = st.sampled_from([0, 1, 2, 3, 5, 7, 9, 0x7FFFFFFF])
_ENCODER_BLOCK = hpack.Encoder().encode(GRPC_HEADERS)
_REQUEST = request_bytes()


def _valid(sid: int) -> bytes:
    return frame(1, 0x4, sid, _ENCODER_BLOCK) + frame(0, 0x1, sid, _REQUEST)


_frames = st.one_of(
    st.builds(frame, st.integers(0, 12), st.integers(0, 255), _SIDS, st.binary(max_size=48)),
    st.builds(frame, st.just(4), st.just(0), st.just(0),  # SETTINGS with any values
              st.lists(st.tuples(st.integers(0, 8), st.integers(0, 2**32 - 1)), max_size=4)
              .map(lambda kv: b"".join(struct.pack(">HI", k, v) for k, v in kv))),
    st.builds(frame, st.just(8), st.just(0), _SIDS, st.integers(0, 2**32 - 1).map(lambda n: n.to_bytes(4, "big"))),
    st.builds(frame, st.just(1), st.sampled_from([0x4, 0x5, 0x0, 0x24, 0x2C]), _SIDS, st.just(_ENCODER_BLOCK)),
    st.builds(frame, st.just(0), st.sampled_from([0, 1, 8, 9]), _SIDS, st.just(_REQUEST[:40]) | st.just(_REQUEST)),
    st.builds(_valid, st.sampled_from([1, 3, 5, 7])),
)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(b"".join(_valid(sid) for sid in (1, 3, 5)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "length"]))
        pos = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[pos: pos + draw(st.integers(1, 16))]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:  # a frame header's length byte
            data[pos] = draw(st.sampled_from([0x00, 0x40, 0xFF]))
        if not data:
            break
    return bytes(data)


_sequences = st.one_of(st.lists(_frames, max_size=12).map(b"".join), _mutated())


def _exchange(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        try:
            sock.sendall(PREFACE + frame(4, 0, 0, b"") + data)
            sock.settimeout(0.05)
            while sock.recv(65536):
                pass
        except OSError:
            pass  # closed by the server, or nothing more to read in time


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_sequences)
def test_random_and_mutated_frames(served, data):
    _exchange(served.port, data)
    wait_until(lambda: served.state() == (0, 0), 3,
               lambda: f"the server to let go; it holds {served.state()} (connections, buffered bytes)", 0.01)
    assert not served.errors, served.errors
    assert not served.log.records, [r.getMessage() for r in served.log.records]
    assert route_once(served.port) is not None
