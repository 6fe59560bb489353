"""Precise prefix routing's KV events: the engines' ZMQ publishers (sources.py, subscriber.py, replay.py), or the
pools' NATS JetStream streams (jetstream.py, natswire.py) that `epp kv-relay` writes (relay.py, relay_publish.py),
decoded (decode.py) and applied to the precise index (apply.py), wired as one service (service.py). Flags and
settings: settings.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.fleet.kvevents.relay import KVRelay
    from epp.fleet.kvevents.service import PreciseService
    from epp.fleet.kvevents.sources import KVEventsConfigError, parse_kv_events_field

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562):
# epp.fleet.kvevents.settings loads no subscriber.
_LAZY = {
    "PreciseService": "service", "KVRelay": "relay",
    "KVEventsConfigError": "sources", "parse_kv_events_field": "sources",
}

__all__ = ["KVEventsConfigError", "KVRelay", "PreciseService", "parse_kv_events_field"]


__getattr__ = lazy_exports(__name__, _LAZY)
