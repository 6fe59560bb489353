"""The replica bus: Pointsman processes (replicas and workers) share what only they know, over a transport that
may lose messages but never makes the sender wait (epp/bus/transport.py).

Theory of operation
- The transport: by default a ZMQ PUB/SUB mesh (every process binds one PUB socket at its own bus address and
  connects one SUB socket to every peer's; ZMQ reconnects by itself, queues nothing for a peer that is down, and
  never blocks the publisher), or one NATS connection per process and one subject per pool
  (epp/bus/nats_transport.py). A lost peer or broker costs nothing but messages. Mesh peers come from a static
  list, the workers of one pod, or a headless Service's endpoints (`set_peers` follows changes); over NATS the
  peers are whoever publishes on the subject.
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
  nothing. (A peer heard again after its ttl lapsed, a partition healed, gets its load back from the next
  snapshots; the records lost meanwhile stay lost: replaying to every peer on every return would let a stalled
  replica set off a storm.)
- Entries for endpoints this process does not know (`known`, the datastore's members) are ignored: a peer can
  never create state here for an endpoint that is not in this process's pools (counted in `ignored`).
- Every received message is validated (epp/bus/codec.py); malformed ones, ones from a sender that is not a current
  peer, ones failing the shared-secret HMAC and stale ones are dropped and counted in `dropped[reason]`.

The bus publishes and runs the lifecycle; its collaborators: the peer table (epp/bus/peer_table.py: peers, their
connections, incarnations and liveness), the channels (epp/bus/channels.py: record channels and plugin states with
their sources and sinks), the receiver (epp/bus/receive.py: validate, apply) and the transport
(epp/bus/transport.py: send and receive frames).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from epp.aio import cancel_all, wait_set
from epp.bus.channels import Channels, RecordSink, RecordSnapshot, RecordSource, StateSink, StateSource
from epp.bus.codec import BusMessage, encode
from epp.bus.peer_table import PeerTable
from epp.bus.receive import Receiver
from epp.bus.transport import MeshTransport, Transport, zmq_url
from epp.fleet import InflightTracker
from scheduling.api import InflightLoad

log = logging.getLogger(__name__)

__all__ = ["MAX_RECORDS_PER_MESSAGE", "RecordSink", "RecordSnapshot", "RecordSource", "ReplicaBus", "StateSink",
           "StateSource"]

MAX_RECORDS_PER_MESSAGE = 512  # records are sent in chunks of this many (a message stays far below the size cap)


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
        transport: Transport | None = None,
    ) -> None:
        """`address` is how peers know this process ("host:port" for tcp, or an "ipc://" path; over NATS, its unique
        name); `bind` is what the mesh's PUB socket binds (default: the address itself, tcp on all interfaces);
        `transport` another transport than the mesh."""
        if not 0 < heartbeat < ttl:
            raise ValueError("the bus needs 0 < heartbeat < ttl")
        self.address = address
        self.transport: Transport = transport or MeshTransport(bind or zmq_url(address, bind_all=True))
        self.inflight = inflight
        self.secret = secret
        self.ttl, self.heartbeat, self.min_gap = ttl, heartbeat, min_gap
        self.clock = clock
        self.known = known  # endpoint keys this process may hold state for (None: any)
        self.incarnation = random.SystemRandom().getrandbits(63)
        self._seq = 0
        self.dropped: Counter[str] = Counter()
        self._channels = Channels()
        self.peer_table = PeerTable(address, peers, clock, self._expire, open_membership=not self.transport.links)
        self.receiver = Receiver(self.peer_table, self._channels, inflight, secret=secret, known=known, clock=clock,
                                 on_join=self._joined, dropped=self.dropped)
        self._replay_at = 0.0  # when to replay recent records to peers that joined (0: nothing due)
        self._joiners: set[str] = set()  # the peers it is for
        self.replays = 0
        self.published = 0
        self._running = False
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._last_local: Mapping[str, InflightLoad] = {}

    # ---- wiring ------------------------------------------------------------------------------------------
    def add_channel(self, name: str, source: RecordSource, sink: RecordSink,
                    snapshot: RecordSnapshot | None = None) -> None:
        self._channels.add_channel(name, source, sink, snapshot)

    def add_state(self, name: str, source: StateSource, sink: StateSink) -> None:
        self._channels.add_state(name, source, sink)

    def remove_channel(self, name: str) -> None:
        self._channels.remove_channel(name)

    def remove_state(self, name: str) -> None:
        self._channels.remove_state(name)

    def channels(self) -> list[str]:
        return self._channels.channels()

    def states(self) -> list[str]:
        return self._channels.states()

    def notify(self) -> None:
        """Something local changed (a pick, a release, a record): publish soon."""
        self._wake.set()

    @property
    def peers(self) -> list[str]:
        return self.peer_table.peers

    def live_peers(self) -> list[str]:
        return self.peer_table.live()

    def set_peers(self, peers: Iterable[str]) -> None:
        """Follow the current peer set: connect to new peers, disconnect (and forget) departed ones."""
        self.peer_table.set(peers)

    # ---- what the receiver counts ------------------------------------------------------------------------
    @property
    def received(self) -> Counter[str]:
        return self.receiver.received

    @property
    def ignored(self) -> int:
        return self.receiver.ignored

    def accept(self, frames: list[bytes]) -> BusMessage:
        """Validate one received message and apply it (public for tests of hostile input)."""
        return self.receiver.accept(frames)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.transport.start(self.receiver.receive, self.dropped, self.rejoined)
        self._running = True
        self.peer_table.connect(self.transport if self.transport.links else None)
        self.inflight.on_local_change = self.notify
        self._tasks = [asyncio.get_running_loop().create_task(self._publish_loop(), name="bus-publish")]
        log.info("replica bus %s (%s); peers %s", self.address, self.transport.describe(),
                 ", ".join(self.peers) or "(none yet)")

    async def stop(self) -> None:
        self._running = False  # the publish loop ends at its next turn even if a cancel is lost
        await cancel_all(self._tasks)
        self._tasks = []
        if self.inflight.on_local_change == self.notify:
            self.inflight.on_local_change = None
        self.peer_table.disconnect()
        await self.transport.stop()

    def rejoined(self) -> None:
        """The transport is back after an outage (a broker restart, a partition): our load goes out at once. (What
        the peers missed of our records is not replayed: records are idempotent and a lost one costs a little
        accuracy, while every replica replaying to everyone after a broker restart would cost each replica N x
        snapshot records at once.)"""
        self.notify()

    def _expire(self, peer: str) -> None:
        """Drop what `peer` shared (it left, restarted or fell silent)."""
        self.inflight.drop_remote(peer)
        self._channels.expire(peer)

    def _joined(self, peer: str) -> None:
        """A peer joined or restarted: replay recent records once it listens."""
        if self._channels.has_snapshots:
            self._joiners.add(peer)
            if not self._replay_at:
                self._replay_at = self.clock() + self.heartbeat

    # ---- publishing --------------------------------------------------------------------------------------
    def _next(self, kind: str, body: Mapping[str, Any]) -> list[bytes]:
        self._seq += 1
        return encode(BusMessage(self.address, self.incarnation, self._seq, kind, body), self.secret)

    def load_message(self) -> list[bytes]:
        inflight = {k: [v.requests, v.tokens] for k, v in self.inflight.local_view().items()}
        return self._next("load", {"ttl": self.ttl, "inflight": inflight, "state": self._channels.state_values()})

    async def _publish_loop(self) -> None:
        last = 0.0
        while self._running:
            await wait_set(self._wake, self.heartbeat)
            self._wake.clear()
            try:
                self.transport.poll()  # a safety net: the descriptor signals edges, never miss queued messages
                self.peer_table.sweep()
                for name, items in self._channels.new_records():
                    self._send_records(name, items)
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

    def _send_records(self, name: str, items: list[Any], to: str | None = None) -> None:
        for i in range(0, len(items), MAX_RECORDS_PER_MESSAGE):
            self._send_chunk(name, items[i:i + MAX_RECORDS_PER_MESSAGE], to)

    def _send_chunk(self, name: str, items: list[Any], to: str | None) -> None:
        """One records message, halved until it fits the transport's largest message (NATS: the server's)."""
        frames = self._next("records", {"name": name, "items": items})
        if len(frames[0]) > self.transport.max_message and len(items) > 1:
            half = len(items) // 2
            self._send_chunk(name, items[:half], to)
            self._send_chunk(name, items[half:], to)
            return
        self._send(frames, to)

    def _replay(self) -> None:
        """Peers joined: send every channel's snapshot of recent records, to each of them where the transport can
        address one peer (NATS), else to every peer (the mesh; idempotent for the others)."""
        self.replays += 1
        joiners, self._joiners = sorted(self._joiners), set()
        for name, items in self._channels.snapshot_records():
            for to in joiners if self.transport.addressed else [None]:
                self._send_records(name, items, to)

    def _send(self, frames: list[bytes], to: str | None = None) -> None:
        if self._running and self.transport.send(frames, to):
            self.published += 1
