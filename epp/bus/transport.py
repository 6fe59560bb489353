"""How the replica bus's messages travel: the seam between the bus's logic (epp/bus/bus.py, the same for every
transport) and the wire.

A transport sends one encoded message (its frames: the payload and the optional HMAC) to every peer (or to one,
if it can address one: NATS), never waiting (a message it cannot take now is dropped and counted in the bus's `dropped[reason]`), and hands every
message it receives to `deliver(frames)`. It says whether its peers are a fixed set it dials (`links`: the mesh
connects to each peer the peer table names) or whoever publishes where it listens (the NATS subject).

- `MeshTransport` (this file, the default): ZMQ PUB/SUB, a full mesh. One PUB socket bound at the process's own
  address, one SUB socket connected to every peer's. ZMQ reconnects by itself, never blocks the publisher (NOBLOCK;
  a full queue drops) and queues nothing for a peer that is down.
- `NatsTransport` (epp/bus/nats_transport.py): one connection to a NATS server, one subject per pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol, cast

import zmq

from epp.bus.codec import MAX_MESSAGE_BYTES

log = logging.getLogger("epp.bus.bus")

Deliver = Callable[[list[bytes]], None]
MAX_DRAIN = 256  # messages handled per turn of the event loop; the rest in the next turn


class Transport(Protocol):
    links: bool  # True: the peer table names the peers and the transport connects to each (`connect`)
    addressed: bool  # it can send to one peer (`send(frames, to=peer)`); the mesh sends every message to all

    @property
    def connected(self) -> bool:
        """False while it cannot send (a broker unreachable); the mesh always can."""

    @property
    def max_message(self) -> int:
        """The largest payload it carries (bytes)."""

    async def start(self, deliver: Deliver, dropped: Counter[str], rejoined: Callable[[], None]) -> None:
        """Receive into `deliver`, count drops in `dropped`, call `rejoined` when back after an outage."""

    def send(self, frames: list[bytes], to: str | None = None) -> bool: ...

    def connect(self, peer: str) -> None: ...

    def disconnect(self, peer: str) -> None: ...

    def poll(self) -> None: ...

    async def stop(self) -> None: ...

    def describe(self) -> str: ...


def zmq_url(address: str, *, bind_all: bool = False) -> str:
    """"host:port" -> tcp://host:port (tcp://*:port to bind on every interface); ipc:// and tcp:// pass through."""
    if "://" in address:
        return address
    host, _, port = address.rpartition(":")
    if bind_all:
        return f"tcp://*:{port}"
    return f"tcp://{host}:{port}"


class MeshTransport:
    """ZMQ PUB/SUB. Plain (non-asyncio) sockets: the PUB never blocks (NOBLOCK; a full queue drops and counts) and
    the SUB is read from the event loop when its file descriptor signals, draining every queued message at once
    (zmq.asyncio's per-message futures cost several times the decoding itself)."""

    links = True
    connected = True
    max_message = MAX_MESSAGE_BYTES
    addressed = False

    def __init__(self, bind: str) -> None:
        self.bind = bind
        self._ctx: zmq.Context[Any] | None = None
        self._pub: zmq.Socket[Any] | None = None
        self._sub: zmq.Socket[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._deliver: Deliver | None = None
        self._dropped: Counter[str] = Counter()

    def describe(self) -> str:
        return f"mesh, bound {self.bind}"

    async def start(self, deliver: Deliver, dropped: Counter[str], rejoined: Callable[[], None] = lambda: None) -> None:
        self._deliver, self._dropped = deliver, dropped
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 1000)
        self._pub.bind(self.bind)
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 10000)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._loop = loop = asyncio.get_running_loop()
        self._fd = cast(int, self._sub.getsockopt(zmq.FD))
        loop.add_reader(self._fd, self.poll)
        loop.call_soon(self.poll)

    def connect(self, peer: str) -> None:
        if self._sub is not None:
            self._sub.connect(zmq_url(peer))

    def disconnect(self, peer: str) -> None:
        if self._sub is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sub.disconnect(zmq_url(peer))

    def poll(self) -> None:
        """Handle every message queued on the SUB socket (at most MAX_DRAIN now, the rest in the next turn)."""
        sub, deliver = self._sub, self._deliver
        if sub is None or deliver is None:
            return
        for _ in range(MAX_DRAIN):
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return  # closing
            deliver(frames)
        if self._loop is not None:
            self._loop.call_soon(self.poll)

    def send(self, frames: list[bytes], to: str | None = None) -> bool:
        pub = self._pub
        if pub is None:  # stopping
            return False
        try:
            pub.send_multipart(frames, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            self._dropped["send-queue-full"] += 1
            return False

    async def stop(self) -> None:
        if self._fd is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
        self._fd = None
        self._deliver = None
        for sock in (self._pub, self._sub):
            if sock is not None:
                sock.close(0)
        if self._ctx is not None:
            self._ctx.term()
        self._pub = self._sub = None
        self._ctx = None
