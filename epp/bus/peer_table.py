"""The replica bus's peer table: who the peers are, the SUB connection to each, what was heard from each (its
incarnation and last sequence number) and until when its shared state holds (liveness).

A peer's shared state (its in-flight load, its plugin states) is dropped through `on_expire(peer)` when the peer
leaves the set, when `ttl` passes without a load message from it (`sweep`), or when it restarts (a new incarnation,
seen by the receiver).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import zmq


@dataclass(slots=True)
class PeerState:
    incarnation: int = -1
    seq: int = -1
    expires: float = 0.0
    connected: bool = False


def zmq_url(address: str, *, bind_all: bool = False) -> str:
    """"host:port" -> tcp://host:port (tcp://*:port to bind on every interface); ipc:// and tcp:// pass through."""
    if "://" in address:
        return address
    host, _, port = address.rpartition(":")
    if bind_all:
        return f"tcp://*:{port}"
    return f"tcp://{host}:{port}"


class PeerTable:
    def __init__(self, own: str, peers: Iterable[str], clock: Callable[[], float],
                 on_expire: Callable[[str], None]) -> None:
        self.own = own
        self.clock = clock
        self.on_expire = on_expire  # drop what the peer shared
        self.wanted: set[str] = {p for p in peers if p != own}
        self._states: dict[str, PeerState] = {}
        self._sub: zmq.Socket[Any] | None = None

    def connect(self, sub: zmq.Socket[Any]) -> None:
        """Connect the SUB socket to every wanted peer (and to those that come later)."""
        self._sub = sub
        self.set(self.wanted)

    def disconnect(self) -> None:
        """Forget every peer (their shared state expires) and let go of the socket."""
        for peer in list(self._states):
            self.forget(peer)
        self._sub = None

    def set(self, peers: Iterable[str]) -> None:
        """Follow the current peer set: connect to new peers, disconnect (and forget) departed ones."""
        wanted = {p for p in peers if p != self.own}
        for gone in self.wanted - wanted:
            self.forget(gone)
        self.wanted = wanted
        if self._sub is None:
            return
        for peer in wanted:
            st = self._states.setdefault(peer, PeerState())
            if not st.connected:
                self._sub.connect(zmq_url(peer))
                st.connected = True

    def forget(self, peer: str) -> None:
        st = self._states.pop(peer, None)
        if st is not None and st.connected and self._sub is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sub.disconnect(zmq_url(peer))
        self.on_expire(peer)

    def get(self, peer: str) -> PeerState | None:
        """The state of a current peer (None for a sender that is not one)."""
        if peer not in self.wanted:
            return None
        return self._states.get(peer)

    def sweep(self) -> None:
        """Expire the peers not heard from within their ttl."""
        now = self.clock()
        for peer, st in self._states.items():
            if st.expires and st.expires <= now:
                st.expires = 0.0
                self.on_expire(peer)

    def live(self) -> list[str]:
        now = self.clock()
        return sorted(p for p, st in self._states.items() if st.expires > now)
