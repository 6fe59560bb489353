"""The replica bus: several Pointsman processes share in-flight load, plugin state and records (epp/bus/bus.py)."""

from epp.bus.bus import ReplicaBus
from epp.bus.codec import BusMessage, BusMessageError, decode, encode

__all__ = ["BusMessage", "BusMessageError", "ReplicaBus", "decode", "encode"]
