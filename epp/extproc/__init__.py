"""The ext_proc glue of both transports: the gRPC server (server.py), one stream session (session.py) fed by the
HTTP/2 transport (h2.py) or grpc.aio (aio.py). Flags and settings: settings.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.extproc.server import build_server

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562):
# epp.extproc.settings (the CLI's flags) loads no server.
_LAZY = {
    "build_server": "server",
}

__all__ = ["build_server"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    module, _, attr = _LAZY[name].partition(":")
    value = getattr(import_module(f"{__name__}.{module}"), attr or name)
    globals()[name] = value
    return value
