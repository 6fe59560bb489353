"""The replica bus: Pointsman processes (replicas and workers) share what only they know, over ZMQ PUB/SUB.

Theory of operation
- Every process binds one PUB socket at its own bus address and connects one SUB socket to every peer's. ZMQ
  reconnects by itself, queues nothing for a peer that is down (PUB drops), and never blocks the publisher, so a
  lost peer costs nothing but its messages. Peers come from a static list, the workers of one pod, or a headless
  Service's endpoints; `set_peers` follows changes.
- What is shared, and how it stays right when messages are lost:
  * in-flight requests per endpoint: ABSOLUTE snapshots ("load" messages) of what each process itself has in
    flight, sent when its counts change (at most every `min_gap`) and at least every `heartbeat`; a receiver
    replaces the sender's previous snapshot and drops it `ttl` after the last one arrived. A lost message is fixed
    by the next, a dead peer's load disappears after `ttl`: no phantom load, ever.
  * absolute per-endpoint state of plugins (`add_state`, e.g. the prefill backlog a process has sent): the same way.
  * idempotent records (`add_channel`, e.g. the prefix blocks of a pick, session bindings): sent as they happen;
    applying one twice is harmless, losing one costs a little accuracy.
- A replica that loses the bus keeps routing on its own view (peers' snapshots expire); one that joins hears every
  peer's snapshot within one heartbeat, and every peer that hears a new incarnation replays a bounded snapshot of
  its recent records (`add_channel(..., snapshot=)`) one heartbeat later, so the newcomer does not start from
  nothing.
- Entries for endpoints this process does not know (`known`, the datastore's members) are ignored: a peer can
  never create state here for an endpoint that is not in this process's pools (counted in `ignored`).
- Every received message is validated (epp/bus/codec.py); malformed ones, ones from a sender that is not a current
  peer, ones failing the shared-secret HMAC and stale ones are dropped and counted in `dropped[reason]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import zmq

from epp.aio import wait_set
from epp.bus import receive
from epp.bus.codec import BusMessage, encode
from epp.fleet import InflightTracker
from scheduling.api import InflightLoad

log = logging.getLogger(__name__)

RecordSource = Callable[[], list[Any]]  # records produced since the last call
RecordSink = Callable[[str, list[Any]], None]  # (peer, records)
RecordSnapshot = Callable[[], list[Any]]  # recent records, for a peer that joined
StateSource = Callable[[], dict[str, float]]  # absolute per-endpoint values of this process
StateSink = Callable[[str, "dict[str, float] | None"], None]  # (peer, values, or None when the peer expired)


MAX_RECORDS_PER_MESSAGE = 512  # records are sent in chunks of this many (a message stays far below the size cap)


@dataclass(slots=True)
class _Peer:
    incarnation: int = -1
    seq: int = -1
    expires: float = 0.0
    connected: bool = False


class ReplicaBus:
    def __init__(
        self,
        address: str,
        inflight: InflightTracker,
        *,
        bind: str | None = None,
        peers: Iterable[str] = (),
        secret: bytes | None = None,
        ttl: float = 1.0,
        heartbeat: float = 0.1,
        min_gap: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
        known: Callable[[str], bool] | None = None,
    ) -> None:
        """`address` is how peers know this process ("host:port" for tcp, or an "ipc://" path); `bind` is what the
        PUB socket binds (default: the address itself, tcp on all interfaces)."""
        if not 0 < heartbeat < ttl:
            raise ValueError("the bus needs 0 < heartbeat < ttl")
        self.address = address
        self.bind = bind or _zmq_url(address, bind_all=True)
        self.inflight = inflight
        self.secret = secret
        self.ttl, self.heartbeat, self.min_gap = ttl, heartbeat, min_gap
        self.clock = clock
        self.known = known  # endpoint keys this process may hold state for (None: any)
        self.incarnation = random.SystemRandom().getrandbits(63)
        self._seq = 0
        self._peers: dict[str, _Peer] = {}
        self._wanted: set[str] = {p for p in peers if p != address}
        self._channels: dict[str, tuple[RecordSource, RecordSink]] = {}
        self._snapshots: dict[str, RecordSnapshot] = {}
        self._states: dict[str, tuple[StateSource, StateSink]] = {}
        self._replay_at = 0.0  # when to replay recent records to peers that joined (0: nothing due)
        self.received: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.ignored = 0  # received entries for endpoints this process does not know
        self.replays = 0
        self.published = 0
        # Plain (non-asyncio) ZMQ sockets: the PUB never blocks (NOBLOCK; a full queue drops and counts) and the
        # SUB is read from the event loop when its file descriptor signals, draining every queued message at once.
        # (zmq.asyncio's per-message futures cost several times the decoding itself.)
        self._ctx: zmq.Context[Any] | None = None
        self._pub: zmq.Socket[Any] | None = None
        self._sub: zmq.Socket[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._last_local: Mapping[str, InflightLoad] = {}

    # ---- wiring ------------------------------------------------------------------------------------------
    def add_channel(self, name: str, source: RecordSource, sink: RecordSink,
                    snapshot: RecordSnapshot | None = None) -> None:
        self._channels[name] = (source, sink)
        if snapshot is not None:
            self._snapshots[name] = snapshot

    def add_state(self, name: str, source: StateSource, sink: StateSink) -> None:
        self._states[name] = (source, sink)

    def remove_channel(self, name: str) -> None:
        self._channels.pop(name, None)
        self._snapshots.pop(name, None)

    def remove_state(self, name: str) -> None:
        self._states.pop(name, None)

    def channels(self) -> list[str]:
        return sorted(self._channels)

    def states(self) -> list[str]:
        return sorted(self._states)

    def notify(self) -> None:
        """Something local changed (a pick, a release, a record): publish soon."""
        self._wake.set()

    @property
    def peers(self) -> list[str]:
        return sorted(self._wanted)

    def live_peers(self) -> list[str]:
        now = self.clock()
        return sorted(p for p, st in self._peers.items() if st.expires > now)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 1000)
        self._pub.bind(self.bind)
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 10000)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.set_peers(self._wanted)
        self.inflight.on_local_change = self.notify
        self._loop = loop = asyncio.get_running_loop()
        self._fd = cast(int, self._sub.getsockopt(zmq.FD))
        loop.add_reader(self._fd, self._drain)
        loop.call_soon(self._drain)
        self._tasks = [loop.create_task(self._publish_loop(), name="bus-publish")]
        log.info("replica bus %s bound %s; peers %s", self.address, self.bind, ", ".join(self.peers) or "(none)")

    async def stop(self) -> None:
        pub, self._pub = self._pub, None  # the publish loop ends at its next turn even if a cancel is lost
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        if self._fd is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None
        if self.inflight.on_local_change == self.notify:
            self.inflight.on_local_change = None
        for peer in list(self._peers):
            self._forget_peer(peer)
        for sock in (pub, self._sub):
            if sock is not None:
                sock.close(0)
        if self._ctx is not None:
            self._ctx.term()
        self._pub = self._sub = None
        self._ctx = None

    def set_peers(self, peers: Iterable[str]) -> None:
        """Follow the current peer set: connect to new peers, disconnect (and forget) departed ones."""
        wanted = {p for p in peers if p != self.address}
        for gone in self._wanted - wanted:
            self._forget_peer(gone)
        self._wanted = wanted
        if self._sub is None:
            return
        for peer in wanted:
            st = self._peers.setdefault(peer, _Peer())
            if not st.connected:
                self._sub.connect(_zmq_url(peer))
                st.connected = True

    def _forget_peer(self, peer: str) -> None:
        st = self._peers.pop(peer, None)
        if st is not None and st.connected and self._sub is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sub.disconnect(_zmq_url(peer))
        self._expire(peer)

    def _expire(self, peer: str) -> None:
        self.inflight.drop_remote(peer)
        for _, sink in self._states.values():
            sink(peer, None)

    # ---- publishing --------------------------------------------------------------------------------------
    def _next(self, kind: str, body: Mapping[str, Any]) -> list[bytes]:
        self._seq += 1
        return encode(BusMessage(self.address, self.incarnation, self._seq, kind, body), self.secret)

    def load_message(self) -> list[bytes]:
        inflight = {k: [v.requests, v.tokens] for k, v in self.inflight.local_view().items()}
        state = {name: source() for name, (source, _) in self._states.items()}
        return self._next("load", {"ttl": self.ttl, "inflight": inflight, "state": state})

    async def _publish_loop(self) -> None:
        last = 0.0
        while self._pub is not None:
            await wait_set(self._wake, self.heartbeat)
            self._wake.clear()
            try:
                self._drain()  # a safety net: the descriptor signals edges, never miss queued messages
                self._sweep()
                self._publish_records()
                if self._replay_at and self.clock() >= self._replay_at:
                    self._replay_at = 0.0
                    self._replay()
                local = self.inflight.local_view()
                now = self.clock()
                if local != self._last_local or now - last >= self.heartbeat:
                    self._send(self.load_message())
                    self._last_local = dict(local)
                    last = now
            except Exception:  # the bus must survive anything one round throws
                log.exception("replica bus publish failed")
            await asyncio.sleep(self.min_gap)

    def _publish_records(self) -> None:
        for name, (source, _) in list(self._channels.items()):
            self._send_records(name, source())

    def _send_records(self, name: str, items: list[Any]) -> None:
        for i in range(0, len(items), MAX_RECORDS_PER_MESSAGE):
            self._send(self._next("records", {"name": name, "items": items[i:i + MAX_RECORDS_PER_MESSAGE]}))

    def _replay(self) -> None:
        """Peers joined: send every channel's snapshot of recent records (idempotent for the others)."""
        self.replays += 1
        for name, snapshot in list(self._snapshots.items()):
            self._send_records(name, snapshot())

    def _send(self, frames: list[bytes]) -> None:
        pub = self._pub
        if pub is None:  # stopping
            return
        try:
            pub.send_multipart(frames, flags=zmq.NOBLOCK)
            self.published += 1
        except zmq.Again:
            self.dropped["send-queue-full"] += 1

    def _sweep(self) -> None:
        now = self.clock()
        for peer, st in self._peers.items():
            if st.expires and st.expires <= now:
                st.expires = 0.0
                self._expire(peer)

    # ---- receiving (epp/bus/receive.py: plain functions bound as methods) --------------------------------
    _drain = receive.drain
    _receive = receive.receive
    accept = receive.accept
    _apply_load = receive.apply_load
    _known = receive.known_entries


def _zmq_url(address: str, *, bind_all: bool = False) -> str:
    """"host:port" -> tcp://host:port (tcp://*:port to bind on every interface); ipc:// and tcp:// pass through."""
    if "://" in address:
        return address
    host, _, port = address.rpartition(":")
    if bind_all:
        return f"tcp://*:{port}"
    return f"tcp://{host}:{port}"
