"""A gRPC server on h2 (pure-Python HTTP/2, maintained by python-hyper) and asyncio, for Pointsman's gRPC port.

Why: grpc.aio spends most of Pointsman's per-request CPU in its transport (a completion-queue poller thread,
cross-thread wake-ups, one syscall per message: about 60 syscalls and 16 context switches per ext_proc request).
Here a connection is an asyncio Protocol: frames are handled where they are read, replies written together once per
read, and the ext_proc calls are callback-driven (no task per stream). See docs/performance.md for the numbers.

- `H2Server` (server.py): ports, routing, lifecycle; the grpc.aio.Server calls Pointsman uses.
- `Connection` (connection.py): one HTTP/2 connection; flow control both ways; coalesced writes; GOAWAY.
- `ServerStream`/`StreamHandler` (stream.py): one call; message framing and size limit; status trailers.
- `aio_adapter.py`: grpc.aio servicers (health, EDS, the Pointsman API) run unchanged as tasks.
"""

from epp.h2grpc.server import H2Server, server_ssl_context, split_address
from epp.h2grpc.stream import ServerStream, StreamHandler

__all__ = ["H2Server", "ServerStream", "StreamHandler", "server_ssl_context", "split_address"]
