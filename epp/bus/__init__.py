"""The replica bus: several Pointsman processes share in-flight load, plugin state and records (epp/bus/bus.py).

Imports are lazy, so the CLI can read epp.bus.settings without loading ZMQ (the 'replicas' extra).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BusMessage", "BusMessageError", "ReplicaBus", "decode", "encode"]


def __getattr__(name: str) -> Any:
    if name == "ReplicaBus":
        from epp.bus.bus import ReplicaBus

        return ReplicaBus
    if name in ("BusMessage", "BusMessageError", "decode", "encode"):
        from epp.bus import codec

        return getattr(codec, name)
    raise AttributeError(name)
