"""`epp stack`: the local stack (a modelsim fleet, Pointsman and Envoy as child processes, no Docker). Flags and
settings: settings.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.stack.localstack import stack_command
    from epp.stack.natsd import nats_binary, start_nats_server

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): `epp
# stack`'s flags load no stack.
_LAZY = {
    "stack_command": "localstack",
    "nats_binary": "natsd", "start_nats_server": "natsd",
}

__all__ = ["nats_binary", "stack_command", "start_nats_server"]


__getattr__ = lazy_exports(__name__, _LAZY)
