"""The replica bus's peer table: who the peers are, the transport's link to each, what was heard from each (its
incarnation and last sequence number) and until when its shared state holds (liveness).

Two kinds of membership:
- a fixed set (the mesh: a static list, a Service's pods, the workers of one pod): only those peers are heard, and
  the transport connects to each (`link.connect`);
- open (NATS: whoever publishes on the pool's subject is a peer): a sender becomes a peer when first heard (at
  most MAX_OPEN_PEERS of them); its shared state expires when its ttl passes without news, and it is forgotten a
  minute later.

A peer's shared state (its in-flight load, its plugin states) is dropped through `on_expire(peer)` when the peer
leaves the set, when `ttl` passes without a load message from it (`sweep`), or when it restarts (a new incarnation,
seen by the receiver).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

MAX_OPEN_PEERS = 4096  # open membership: senders kept at once (more are dropped as unknown peers)
JOIN_GRACE_S = 2.0  # open membership: a new sender is kept this long before its first load message
FORGET_AFTER_S = 60.0  # open membership: a peer silent this long is forgotten (if it comes back, it joins anew)


@dataclass(slots=True)
class PeerState:
    incarnation: int = -1
    seq: int = -1
    expires: float = 0.0
    connected: bool = False
    lapsed: bool = False  # its ttl passed without news (it was partitioned, or gone)
    lapsed_at: float = 0.0


class PeerLink(Protocol):
    def connect(self, peer: str) -> None: ...

    def disconnect(self, peer: str) -> None: ...


class PeerTable:
    def __init__(self, own: str, peers: Iterable[str], clock: Callable[[], float],
                 on_expire: Callable[[str], None], *, open_membership: bool = False) -> None:
        self.own = own
        self.clock = clock
        self.on_expire = on_expire  # drop what the peer shared
        self.open = open_membership
        self.wanted: set[str] = {p for p in peers if p != own}
        self._states: dict[str, PeerState] = {}
        self._link: PeerLink | None = None

    @property
    def peers(self) -> list[str]:
        """The configured peers (fixed set), or those heard within their ttl (open membership)."""
        return self.live() if self.open else sorted(self.wanted)

    def connect(self, link: PeerLink | None) -> None:
        """Connect the transport to every wanted peer (and to those that come later); None: nothing to dial."""
        self._link = link
        self.set(self.wanted)

    def disconnect(self) -> None:
        """Forget every peer (their shared state expires) and let go of the transport."""
        for peer in list(self._states):
            self.forget(peer)
        self._link = None

    def set(self, peers: Iterable[str]) -> None:
        """Follow the current peer set: connect to new peers, disconnect (and forget) departed ones."""
        if self.open:
            return  # the peers are whoever publishes
        wanted = {p for p in peers if p != self.own}
        for gone in self.wanted - wanted:
            self.forget(gone)
        self.wanted = wanted
        if self._link is None:
            return
        for peer in wanted:
            st = self._states.setdefault(peer, PeerState())
            if not st.connected:
                self._link.connect(peer)
                st.connected = True

    def forget(self, peer: str) -> None:
        st = self._states.pop(peer, None)
        if st is not None and st.connected and self._link is not None:
            self._link.disconnect(peer)
        self.on_expire(peer)

    def get(self, peer: str) -> PeerState | None:
        """The state of a current peer (None for a sender that is not one). Open membership: a new sender
        becomes a peer (None past MAX_OPEN_PEERS, or for this process's own name)."""
        if self.open:
            st = self._states.get(peer)
            if st is None and peer != self.own and len(self._states) < MAX_OPEN_PEERS:
                st = self._states[peer] = PeerState(expires=self.clock() + JOIN_GRACE_S)
            return st
        if peer not in self.wanted:
            return None
        return self._states.get(peer)

    def sweep(self) -> None:
        """Expire the peers not heard from within their ttl (open membership: forget them FORGET_AFTER_S later)."""
        now = self.clock()
        for peer, st in list(self._states.items()):
            if st.expires and st.expires <= now:
                st.expires, st.lapsed, st.lapsed_at = 0.0, True, now
                self.on_expire(peer)
            elif self.open and st.lapsed and now - st.lapsed_at > FORGET_AFTER_S:
                del self._states[peer]

    def live(self) -> list[str]:
        now = self.clock()
        return sorted(p for p, st in self._states.items() if st.expires > now)
