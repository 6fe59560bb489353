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

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.h2grpc.limits import ServerLimits, grpcio_options
    from epp.h2grpc.limits import add_flags as add_limit_flags
    from epp.h2grpc.limits import from_args as limits_from_args
    from epp.h2grpc.server import H2Server, server_ssl_context, split_address
    from epp.h2grpc.stream import ServerStream, StreamHandler
    from epp.h2grpc.tls import CERT_FILE, KEY_FILE, certificate_name, peer_certificate, self_signed_cert

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562):
# epp.h2grpc.limits (the CLI's flags) does not load grpc.
_LAZY = {
    "ServerLimits": "limits", "add_limit_flags": "limits:add_flags", "grpcio_options": "limits",
    "limits_from_args": "limits:from_args",
    "H2Server": "server", "server_ssl_context": "server", "split_address": "server",
    "ServerStream": "stream", "StreamHandler": "stream",
    "CERT_FILE": "tls", "KEY_FILE": "tls", "certificate_name": "tls", "peer_certificate": "tls",
    "self_signed_cert": "tls",
}

__all__ = ["CERT_FILE", "H2Server", "KEY_FILE", "ServerLimits", "ServerStream", "StreamHandler", "add_limit_flags",
           "certificate_name", "grpcio_options", "limits_from_args", "peer_certificate", "self_signed_cert",
           "server_ssl_context", "split_address", "status", "tls"]


__getattr__ = lazy_exports(__name__, _LAZY)
