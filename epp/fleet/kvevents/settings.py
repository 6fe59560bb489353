"""`epp serve`'s KV-event flags, parsed once: the port template for endpoints without their own source, and the
precise index's block size (docs/kv-events.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from epp.extras import check
from epp.fleet.kvevents.sources import KVEventsConfigError, KVEventsTemplate, parse_dp_size


def add_flags(g: argparse._ActionsContainer) -> None:
    """The "KV events" group."""
    g.add_argument("--kv-events-port", type=int, default=None,
                   help="subscribe to tcp://<endpoint ip>:PORT for endpoints without their own kvEvents source")
    g.add_argument("--kv-events-replay-port", type=int, default=None,
                   help="the publishers' replay (ROUTER) port, to fill sequence gaps")
    g.add_argument("--kv-events-topic", default="",
                   help="topic prefix to subscribe to; {ip}, {port}, {model} are filled in (default: all topics)")
    g.add_argument("--kv-events-dp-size", type=int, default=1,
                   help="data-parallel ranks per endpoint; rank r publishes on PORT + r (default 1)")
    g.add_argument("--kv-events-block-size", type=int, default=16,
                   help="tokens per block of the precise index's own keys, whatever the engines' block size (16)")


@dataclass(frozen=True)
class KVEventsSettings:
    template: KVEventsTemplate | None = None  # None: only endpoints with their own source (or the config's) publish
    block_size: int = 16

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> KVEventsSettings:
        """Raises KVEventsConfigError for a bad port, data-parallel size or block size; MissingExtra when
        --kv-events-port is given without the 'precise' extra."""
        block = ns.kv_events_block_size
        if block < 1:
            raise KVEventsConfigError(f"--kv-events-block-size: expected a positive number of tokens, got {block}")
        port = ns.kv_events_port
        if port is None:
            return cls(None, block)
        for flag, value in (("--kv-events-port", port), ("--kv-events-replay-port", ns.kv_events_replay_port)):
            if value is not None and not 0 < value < 65536:
                raise KVEventsConfigError(f"{flag}: expected a port 1-65535, got {value}")
        check("precise", "--kv-events-port", ("zmq", "msgpack"))
        template = KVEventsTemplate(port, ns.kv_events_replay_port, ns.kv_events_topic or "",
                                    parse_dp_size(ns.kv_events_dp_size, "--kv-events-dp-size"))
        return cls(template, block)


__all__ = ["KVEventsSettings", "add_flags"]
