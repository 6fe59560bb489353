"""Writing a flush's frames to the socket in pieces (scatter-gather), not joined first.

A flush hands the transport a list of pieces: frame headers, the gRPC prefixes and envelopes of the replies, and
views of the request bytes a body echo sends back. Python 3.11's asyncio `writelines` joins them into one new
bytes object before its `send` (a copy of every echoed byte, and for a long body a fresh allocation of its size);
3.12's sends them with `sendmsg` instead. Here, on 3.11's plain socket transport, a flush that finds the transport's
own buffer empty writes the pieces with one `os.writev` on the socket; only what the socket did not take goes to the
transport (which then buffers and sends it as ever). Order is kept: nothing is written directly while the
transport holds bytes. Any other transport (TLS, uvloop, a newer Python) gets `writelines` as before.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") and "SC_IOV_MAX" in os.sysconf_names else 16
_writev = getattr(os, "writev", None)


def direct_fd(transport: asyncio.BaseTransport) -> int:
    """The socket's descriptor when flushes may write to it directly (see the module docstring), else -1."""
    cls = type(transport)
    if (_writev is None or sys.version_info >= (3, 12) or cls.__name__ != "_SelectorSocketTransport"
            or cls.__module__ != "asyncio.selector_events"):
        return -1
    sock = transport.get_extra_info("socket")
    return sock.fileno() if sock is not None else -1


def write_pieces(transport: asyncio.Transport, fd: int, pieces: Sequence[bytes | memoryview]) -> None:
    """Write `pieces` in order: to the socket `fd` at once when the transport holds nothing, the rest (all of it
    otherwise) through the transport."""
    if fd < 0 or len(pieces) < 2 or transport.get_write_buffer_size() or transport.is_closing():
        transport.writelines(pieces)
        return
    batch = pieces if len(pieces) <= _IOV_MAX else pieces[:_IOV_MAX]
    try:
        sent = _writev(fd, batch)  # type: ignore[misc]  # direct_fd gave -1 where there is no writev
    except (BlockingIOError, InterruptedError):
        sent = 0
    except OSError:
        transport.writelines(pieces)  # the transport's own send meets the error and closes the connection
        return
    if sent < sum(map(len, batch)) or batch is not pieces:
        transport.writelines(_after(pieces, sent))


def _after(pieces: Sequence[bytes | memoryview], sent: int) -> list[bytes | memoryview]:
    """The pieces after the first `sent` bytes (the first of them cut where the write stopped)."""
    for i, piece in enumerate(pieces):
        n = len(piece)
        if sent < n:
            rest = list(pieces[i + 1:])
            if sent:
                rest.insert(0, memoryview(piece)[sent:])
            else:
                rest.insert(0, piece)
            return rest
        sent -= n
    return []
