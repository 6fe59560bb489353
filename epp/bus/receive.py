"""Receiving on the replica bus: drain the SUB socket, validate each message (signature, sender, incarnation,
sequence) and apply it (a peer's load and plugin states, a channel's records). Methods of
`epp.bus.bus.ReplicaBus` (bound there)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import zmq

from epp.bus.codec import BusMessage, BusMessageError, decode
from scheduling.api import InflightLoad

if TYPE_CHECKING:
    from epp.bus.bus import ReplicaBus, _Peer

log = logging.getLogger("epp.bus.bus")

MAX_DRAIN = 256  # messages handled per turn of the event loop; the rest in the next turn


def drain(bus: ReplicaBus) -> None:
    """Handle every message queued on the SUB socket (at most MAX_DRAIN now, the rest in the next turn)."""
    sub = bus._sub
    if sub is None:
        return
    for _ in range(MAX_DRAIN):
        try:
            frames = sub.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        except zmq.ZMQError:
            return  # closing
        receive(bus, frames)
    if bus._loop is not None:
        bus._loop.call_soon(bus._drain)


def receive(bus: ReplicaBus, frames: list[bytes]) -> None:
    try:
        accept(bus, frames)
    except BusMessageError as err:
        bus.dropped[err.reason] += 1
        log.debug("replica bus dropped a message: %s", err)
    except Exception:  # a bug in a sink must not stop the bus
        bus.dropped["error"] += 1
        log.exception("replica bus failed to apply a message")


def accept(bus: ReplicaBus, frames: list[bytes]) -> BusMessage:
    """Validate one received message and apply it (public for tests of hostile input)."""
    msg = decode(frames, bus.secret)
    peer = msg.sender
    st = bus._peers.get(peer)
    if peer not in bus._wanted or st is None:
        raise BusMessageError("unknown-peer", f"sender {peer!r} is not a peer")
    if msg.incarnation != st.incarnation:
        if st.incarnation != -1:
            log.info("replica bus peer %s restarted; dropping what it had shared", peer)
            bus._expire(peer)
        else:
            log.info("replica bus peer %s joined", peer)
        st.incarnation, st.seq = msg.incarnation, -1
        if bus._snapshots and not bus._replay_at:  # a newcomer: replay recent records once it listens
            bus._replay_at = bus.clock() + bus.heartbeat
    if msg.seq <= st.seq:
        raise BusMessageError("stale", f"sequence {msg.seq} after {st.seq} from {peer}")
    st.seq = msg.seq
    bus.received[msg.kind] += 1
    if msg.kind == "load":
        apply_load(bus, peer, st, msg.body)
    else:
        channel = bus._channels.get(msg.body["name"])
        if channel is None:
            raise BusMessageError("unknown-channel", f"no channel {msg.body['name']!r}")
        channel[1](peer, msg.body["items"])
    return msg


def apply_load(bus: ReplicaBus, peer: str, st: _Peer, body: Mapping[str, Any]) -> None:
    st.expires = bus.clock() + float(body["ttl"])
    bus.inflight.set_remote(peer, {k: InflightLoad(v[0], v[1]) for k, v in known_entries(bus, body["inflight"])})
    state = body.get("state", {})
    for name, (_, sink) in list(bus._states.items()):
        sink(peer, {k: float(v) for k, v in known_entries(bus, state.get(name, {}))})


def known_entries(bus: ReplicaBus, entries: Mapping[str, Any]) -> list[tuple[str, Any]]:
    known = bus.known
    if known is None:
        return list(entries.items())
    out = [(k, v) for k, v in entries.items() if known(k)]
    bus.ignored += len(entries) - len(out)
    return out
