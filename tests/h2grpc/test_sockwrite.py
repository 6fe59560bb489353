"""Flush pieces written with writev on the socket (epp/h2grpc/sockwrite.py): every byte arrives, in order, whether the
socket takes all of it at once, part of it, or the transport already holds bytes; other transports keep
`writelines`."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import pytest

from epp.h2grpc.sockwrite import direct_fd, write_pieces


class _Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()


async def _pair(sndbuf: int | None = None) -> tuple[asyncio.Transport, socket.socket]:
    a, b = socket.socketpair()
    if sndbuf is not None:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(_Sink, sock=a)
    b.setblocking(False)
    return transport, b


async def _read(b: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < n:
        chunk = await loop.sock_recv(b, 1 << 20)
        assert chunk, "the connection closed early"
        got += chunk
    return bytes(got)


def _pieces(total: int) -> list[bytes | memoryview]:
    """Frame-like pieces: short headers between views of a long payload, like a body echo's."""
    payload = os.urandom(total)
    view = memoryview(payload)
    out: list[bytes | memoryview] = []
    for i, off in enumerate(range(0, total, 16384)):
        out.append(bytes((i % 251,)) * 9)
        out.append(view[off: off + 16384])
    return out


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's writelines sends the pieces itself")
@pytest.mark.parametrize("total", [100, 262144, 4 << 20])
async def test_pieces_arrive_in_order(total: int) -> None:
    transport, b = await _pair(sndbuf=65536)  # 4 MiB do not fit: the rest goes through the transport
    fd = direct_fd(transport)
    assert fd == transport.get_extra_info("socket").fileno()
    first, second = _pieces(total), _pieces(1000)
    write_pieces(transport, fd, first)
    write_pieces(transport, fd, second)  # maybe behind bytes the transport holds: through it, in order
    expected = b"".join(first) + b"".join(second)
    assert await _read(b, len(expected)) == expected
    transport.close()
    b.close()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's writelines sends the pieces itself")
async def test_more_pieces_than_one_writev_takes() -> None:
    transport, b = await _pair()
    pieces: list[bytes | memoryview] = [bytes((i % 256,)) * 3 for i in range(5000)]
    write_pieces(transport, direct_fd(transport), pieces)
    expected = b"".join(pieces)
    assert await _read(b, len(expected)) == expected
    transport.close()
    b.close()


async def test_other_transports_write_as_before() -> None:
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(w, "wb", buffering=0))
    assert direct_fd(transport) == -1
    write_pieces(transport, direct_fd(transport), [b"ab", memoryview(b"cd"), b"e"])  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert os.read(r, 10) == b"abcde"
    transport.close()
    os.close(r)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's writelines sends the pieces itself")
async def test_a_socket_the_peer_closed_is_left_to_the_transport() -> None:
    """writev's error is not raised here: the transport's own send meets it and closes the connection."""
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    lost = loop.create_future()

    class _Watch(asyncio.Protocol):
        def connection_lost(self, exc: Exception | None) -> None:
            if not lost.done():
                lost.set_result(exc)

    transport, _ = await loop.create_connection(_Watch, sock=a)
    b.close()
    fd = direct_fd(transport)
    for _ in range(3):  # the first write may still be taken before the reset is seen
        write_pieces(transport, fd, _pieces(100_000))
        await asyncio.sleep(0)
    await asyncio.wait_for(lost, 5)
    assert transport.is_closing()
