"""The replica bus's receive path: take each message the transport received, validate it (signature, sender, incarnation,
sequence) and apply it (a peer's load and plugin states, a channel's records).

Counts what it accepted (`received`, by kind), what it dropped (`dropped`, by reason; the bus's counter, shared with
its sending side) and the entries it ignored for endpoints this process does not know (`ignored`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from epp.bus.channels import Channels
from epp.bus.codec import BusMessage, BusMessageError, decode
from epp.bus.peer_table import PeerState, PeerTable
from epp.fleet import InflightTracker
from scheduling.api import InflightLoad

log = logging.getLogger("epp.bus.bus")


class Receiver:
    def __init__(self, peers: PeerTable, channels: Channels, inflight: InflightTracker, *, secret: bytes | None,
                 known: Callable[[str], bool] | None, clock: Callable[[], float], on_join: Callable[[str], None],
                 dropped: Counter[str]) -> None:
        self.peers = peers
        self.channels = channels
        self.inflight = inflight
        self.secret = secret
        self.known = known  # endpoint keys this process may hold state for (None: any)
        self.clock = clock
        self.on_join = on_join  # a peer joined or restarted
        self.received: Counter[str] = Counter()
        self.dropped = dropped
        self.ignored = 0  # received entries for endpoints this process does not know

    def receive(self, frames: list[bytes]) -> None:
        try:
            self.accept(frames)
        except BusMessageError as err:
            self.dropped[err.reason] += 1
            log.debug("replica bus dropped a message: %s", err)
        except Exception:  # a bug in a sink must not stop the bus
            self.dropped["error"] += 1
            log.exception("replica bus failed to apply a message")

    def accept(self, frames: list[bytes]) -> BusMessage:
        """Validate one received message and apply it (public for tests of hostile input)."""
        msg = decode(frames, self.secret)
        peer = msg.sender
        if peer == self.peers.own:  # another process uses this one's bus address (or name, over NATS)
            raise BusMessageError("name-clash", f"a message from another process named {peer!r}")
        st = self.peers.get(peer)
        if st is None:
            raise BusMessageError("unknown-peer", f"sender {peer!r} is not a peer")
        if msg.incarnation != st.incarnation:
            if st.incarnation != -1:
                log.info("replica bus peer %s restarted; dropping what it had shared", peer)
                self.peers.on_expire(peer)
            else:
                log.info("replica bus peer %s joined", peer)
            st.incarnation, st.seq = msg.incarnation, -1
            self.on_join(peer)
        if msg.kind == "load":  # an older snapshot must not replace a newer one (records are idempotent: any order)
            if msg.seq <= st.seq:
                raise BusMessageError("stale", f"sequence {msg.seq} after {st.seq} from {peer}")
            st.seq = msg.seq
        self.received[msg.kind] += 1
        if msg.kind == "load":
            if st.lapsed:  # back after its ttl passed (a partition healed)
                log.info("replica bus peer %s is back", peer)
                st.lapsed = False
            self.apply_load(peer, st, msg.body)
        else:
            self.channels.deliver(peer, msg.body["name"], msg.body["items"])
        return msg

    def apply_load(self, peer: str, st: PeerState, body: Mapping[str, Any]) -> None:
        st.expires = self.clock() + float(body["ttl"])
        self.inflight.set_remote(peer, {k: InflightLoad(v[0], v[1]) for k, v in self.known_entries(body["inflight"])})
        self.channels.apply_states(peer, body.get("state", {}), self.known_entries)

    def known_entries(self, entries: Mapping[str, Any]) -> list[tuple[str, Any]]:
        known = self.known
        if known is None:
            return list(entries.items())
        out = [(k, v) for k, v in entries.items() if known(k)]
        self.ignored += len(entries) - len(out)
        return out
