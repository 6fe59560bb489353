"""`epp serve`'s KV-event flags, parsed once: the port template for endpoints without their own source, the NATS
stream to read instead of the engines (--kv-events-url), and the precise index's block size; and `epp kv-relay`'s
flags (docs/kv-events.md)."""

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
    g.add_argument("--kv-events-url", default=None, metavar="nats://HOST:PORT",
                   help="read every endpoint's KV events from the pools' NATS JetStream streams (written by "
                        "`epp kv-relay`) instead of the engines' ZMQ sockets")
    g.add_argument("--kv-events-block-size", type=int, default=16,
                   help="tokens per block of the precise index's own keys, whatever the engines' block size (16)")


@dataclass(frozen=True)
class KVEventsSettings:
    template: KVEventsTemplate | None = None  # None: only endpoints with their own source (or the config's) publish
    block_size: int = 16
    nats_url: str | None = None  # --kv-events-url: the pools' JetStream streams instead of the engines' sockets

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> KVEventsSettings:
        """Raises KVEventsConfigError for a bad port, data-parallel size or block size; MissingExtra when
        --kv-events-port is given without the 'precise' extra."""
        block = ns.kv_events_block_size
        if block < 1:
            raise KVEventsConfigError(f"--kv-events-block-size: expected a positive number of tokens, got {block}")
        url = ns.kv_events_url
        if url is not None:
            _check_nats_url(url, "--kv-events-url")
            check("precise", "--kv-events-url", ("zmq", "msgpack", "nats"))
        port = ns.kv_events_port
        if port is None:
            return cls(None, block, url)
        for flag, value in (("--kv-events-port", port), ("--kv-events-replay-port", ns.kv_events_replay_port)):
            if value is not None and not 0 < value < 65536:
                raise KVEventsConfigError(f"{flag}: expected a port 1-65535, got {value}")
        check("precise", "--kv-events-port", ("zmq", "msgpack"))
        template = KVEventsTemplate(port, ns.kv_events_replay_port, ns.kv_events_topic or "",
                                    parse_dp_size(ns.kv_events_dp_size, "--kv-events-dp-size"))
        return cls(template, block, url)


def _check_nats_url(url: str, flag: str) -> None:
    from epp.natsconn import NatsTarget

    try:
        NatsTarget.parse(url)
    except ValueError as e:
        raise KVEventsConfigError(f"{flag}: {e}") from None


def add_relay_flags(p: argparse._ActionsContainer) -> None:
    """`epp kv-relay`'s flags."""
    p.add_argument("--engine-events", required=True, metavar="tcp://HOST:PORT",
                   help="the engine rank's KV-event publisher (vLLM's kv-events endpoint)")
    p.add_argument("--engine-replay", default=None, metavar="tcp://HOST:PORT",
                   help="the engine rank's replay socket (vLLM's replay_endpoint), to fill gaps and catch up")
    p.add_argument("--engine-topic", default="", help="topic prefix to subscribe to (default: all topics)")
    p.add_argument("--endpoint", required=True, metavar="ADDR:PORT",
                   help="the engine as Pointsman names it: its serving address and port (the endpoint key)")
    p.add_argument("--rank", type=int, default=0, help="the data-parallel rank this relay carries (default 0)")
    p.add_argument("--pool", required=True, help="the pool whose stream the events go to")
    p.add_argument("--nats-url", required=True, metavar="nats://HOST:PORT", help="the NATS server (JetStream on)")
    p.add_argument("--stream-max-age", type=float, default=3600.0,
                   help="seconds the stream keeps a batch (default 3600); a replica started later than this after "
                        "an engine's first batch sees that engine as unknown until its next cache reset")
    p.add_argument("--stream-max-bytes", type=int, default=1 << 30,
                   help="bytes the pool's stream keeps, oldest dropped first (default 1 GiB)")
    p.add_argument("--duplicate-window", type=float, default=120.0,
                   help="seconds JetStream drops a batch published twice (default 120)")
    p.add_argument("--max-pending", type=int, default=10_000,
                   help="batches queued while NATS is slow or down; past it batches are dropped and asked again "
                        "from the engine's replay (default 10000)")
    p.add_argument("--replay-timeout", type=float, default=2.0, help="seconds to wait for a replay (default 2)")
    p.add_argument("--ack-timeout", type=float, default=2.0, help="seconds to wait for a publish ack (default 2)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at debug level")


def _tcp(value: str | None, flag: str) -> str | None:
    if value is None:
        return None
    host, _, port = value.removeprefix("tcp://").rpartition(":")
    if not value.startswith("tcp://") or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise KVEventsConfigError(f"{flag}: expected tcp://host:port, got {value!r}")
    return value


@dataclass(frozen=True)
class RelaySettings:
    engine_events: str
    endpoint: str
    pool: str
    nats_url: str
    engine_replay: str | None = None
    engine_topic: str = ""
    rank: int = 0
    stream_max_age: float = 3600.0
    stream_max_bytes: int = 1 << 30
    duplicate_window: float = 120.0
    max_pending: int = 10_000
    replay_timeout: float = 2.0
    ack_timeout: float = 2.0
    verbose: bool = False

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RelaySettings:
        """Raises KVEventsConfigError naming the flag; MissingExtra without the 'precise' extra."""
        from epp.fleet.kvevents.natswire import stream_name, subject

        _check_nats_url(ns.nats_url, "--nats-url")
        for flag, value in (("--stream-max-age", ns.stream_max_age), ("--duplicate-window", ns.duplicate_window),
                            ("--replay-timeout", ns.replay_timeout), ("--ack-timeout", ns.ack_timeout),
                            ("--stream-max-bytes", ns.stream_max_bytes), ("--max-pending", ns.max_pending)):
            if not value > 0:
                raise KVEventsConfigError(f"{flag}: expected a positive number, got {value}")
        if not 0 <= ns.rank < 1024:
            raise KVEventsConfigError(f"--rank: expected 0-1023, got {ns.rank}")
        if ns.duplicate_window > ns.stream_max_age:
            raise KVEventsConfigError("--duplicate-window: must not exceed --stream-max-age")
        try:
            stream_name(ns.pool)
            subject(ns.pool, ns.endpoint, ns.rank)
        except ValueError as e:
            raise KVEventsConfigError(str(e)) from None
        check("precise", "epp kv-relay", ("zmq", "nats"))
        return cls(_tcp(ns.engine_events, "--engine-events") or "", ns.endpoint, ns.pool, ns.nats_url,
                   _tcp(ns.engine_replay, "--engine-replay"), ns.engine_topic, ns.rank, ns.stream_max_age,
                   ns.stream_max_bytes, ns.duplicate_window, ns.max_pending, ns.replay_timeout, ns.ack_timeout,
                   ns.verbose)


__all__ = ["KVEventsSettings", "RelaySettings", "add_flags", "add_relay_flags"]
