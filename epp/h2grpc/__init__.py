"""A gRPC server on our own HTTP/2 (RFC 9113, the server's side) and asyncio, for Pointsman's gRPC port.

Why: grpc.aio spends most of Pointsman's per-request CPU in its transport (a completion-queue poller thread,
cross-thread wake-ups, one syscall per message: about 60 syscalls and 16 context switches per ext_proc request).
Here a connection is an asyncio Protocol: frames are handled where they are read, replies written together once per
read, and the ext_proc calls are callback-driven (no task per stream). See docs/performance.md for the numbers.
The HTTP/2 layer is our own rather than a general library's state machine so that every cost a client can cause
is bounded by a limit and O(1) per frame: see docs/frontdoor.md.

- `H2Server` (server.py): ports, routing, lifecycle, the connection cap; the grpc.aio.Server calls Pointsman uses.
- `Connection` (connection.py): one HTTP/2 connection, the parts it owns and wires together, and its life (timers,
  GOAWAY). Frames in: `FrameReader` (reader.py) hands a stream's frames to `Inbound` (inbound.py), the
  connection's to `Control` (control.py); header blocks are `HeaderAssembly`'s (headers.py). The open streams are
  `StreamTable`'s (streamtable.py); the sending side and the windows we send within `Outbound`'s (outbound.py),
  the windows the client sends within `ReceiveWindows`' (windows.py); the flood budgets `Budget`'s (budget.py);
  wire format (frames.py).
- `ServerStream`/`StreamHandler` (stream.py): one call and its status; its `MessageAssembly` (assembly.py) cuts
  the body into messages within the size limit. Compressed messages are inflated off the loop (inflate.py); header
  blocks decoded with hpack, once per distinct block (headers.py).
- `ServerLimits` (limits.py): every limit, its default and its `epp serve` flag.
- `aio_adapter.py`: grpc.aio servicers (health, EDS, the Pointsman API) run unchanged as tasks.

The names below are imported on first use, so `epp.h2grpc.limits` (the CLI's flags) does not load grpc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.h2grpc.server import H2Server, server_ssl_context, split_address
    from epp.h2grpc.stream import ServerStream, StreamHandler

__all__ = ["H2Server", "ServerStream", "StreamHandler", "server_ssl_context", "split_address"]


def __getattr__(name: str) -> Any:
    if name in ("H2Server", "server_ssl_context", "split_address"):
        from epp.h2grpc import server

        return getattr(server, name)
    if name in ("ServerStream", "StreamHandler"):
        from epp.h2grpc import stream

        return getattr(stream, name)
    raise AttributeError(name)
