"""The ext_proc glue of both transports: the gRPC server (server.py), one stream session (session.py) fed by the
HTTP/2 transport (h2.py) or grpc.aio (aio.py). Flags and settings: settings.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.extproc.server import build_server

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562):
# epp.extproc.settings (the CLI's flags) loads no server.
_LAZY = {
    "build_server": "server",
}

__all__ = ["build_server"]


__getattr__ = lazy_exports(__name__, _LAZY)
