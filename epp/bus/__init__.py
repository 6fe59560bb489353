"""The replica bus: several Pointsman processes share in-flight load, plugin state and records (epp/bus/bus.py).

Imports are lazy, so the CLI can read epp.bus.settings without loading ZMQ (the 'replicas' extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.bus.bus import ReplicaBus
    from epp.bus.codec import BusMessage, BusMessageError, decode, encode
    from epp.bus.metrics import register_bus_metrics
    from epp.bus.shell import BusRuntime, start_bus

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): the CLI
# reads epp.bus.settings without loading ZMQ (the 'replicas' extra).
_LAZY = {
    "ReplicaBus": "bus",
    "BusMessage": "codec", "BusMessageError": "codec", "decode": "codec", "encode": "codec",
    "register_bus_metrics": "metrics",
    "BusRuntime": "shell", "start_bus": "shell",
}

__all__ = ["BusMessage", "BusMessageError", "BusRuntime", "ReplicaBus", "decode", "encode", "register_bus_metrics",
           "start_bus"]


__getattr__ = lazy_exports(__name__, _LAZY)
