"""The replica bus over NATS: one connection per process to a NATS server (or cluster), one subject per pool.

Every process publishes its messages on the pool's subject and subscribes to it (no echo: a process never hears
itself), so N replicas cost N connections and every message is sent once, whatever N is; the server fans it out.
The bus's semantics are the mesh's (epp/bus/bus.py): absolute load snapshots with a ttl, idempotent records, the
replay of recent records to a peer that joins (every peer sees its first message on the subject). The peers are
whoever publishes there (open membership, epp/bus/peer_table.py); sign the messages (`--bus-secret`) or let only
Pointsman publish on the subject (NATS permissions).

Routing never waits on NATS:
- `send` only appends to a bounded outbox, which a writer task hands to nats-py (whose publish buffers and
  returns). A full outbox drops the message ("send-queue-full"); while the connection is down messages are dropped
  ("disconnected"), not buffered: stale snapshots are worthless, the next ones carry the truth.
- The server unreachable at start: the bus runs alone and keeps dialling; a broker restart or a partition: nats-py
  reconnects (forever), and once back the bus replays its recent records and its load (`rejoined`), while the
  peers' snapshots it missed expire or are replaced by their next ones.
- A slow consumer: nats-py's queue for the subscription is bounded; what overflows is dropped and counted
  ("slow-consumer"). A server that gives up on a slow client closes it, and the client reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epp.aio import cancel_all
from epp.bus.transport import Deliver
from epp.natsconn import NatsTarget, connect

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg

log = logging.getLogger("epp.bus.bus")

HMAC_BYTES = 32
OUTBOX = 4096  # messages waiting for the writer task; past that, new ones are dropped
PENDING_MSGS = 65536  # received messages nats-py queues for the subscription (slow consumer past that)
PENDING_BYTES = 64 * 1024 * 1024
RECONNECT_WAIT_S = 0.25
DEFAULT_MAX_PAYLOAD = 1024 * 1024  # nats-server's default max_payload, until the server says its own


def inbox(subject: str, name: str) -> str:
    """The subject on which the process called `name` also listens: messages for it alone (replays)."""
    return f"{subject}.to.{re.sub(r'[^A-Za-z0-9_-]', '_', name)}"


class NatsTransport:
    links = False  # the peers are whoever publishes on the subject
    addressed = True  # a replay goes to the replica that joined alone (its inbox subject)

    def __init__(self, target: NatsTarget, subject: str, *, name: str, signed: bool,
                 pending_msgs: int = PENDING_MSGS) -> None:
        self.target = target
        self.pending_msgs = pending_msgs
        self.subject = subject
        self.name = name  # this process's bus address (its inbox; the connection is "pointsman-bus <name>")
        self.signed = signed  # messages carry an HMAC (its 32 bytes end the payload)
        self.reconnects = 0
        self.disconnects = 0
        self._nc: Client | None = None
        self._deliver: Deliver | None = None
        self._rejoined: Callable[[], None] = lambda: None
        self._dropped: Counter[str] = Counter()
        self._outbox: deque[tuple[str, bytes]] = deque()
        self._ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def connected(self) -> bool:
        nc = self._nc
        return nc is not None and nc.is_connected

    @property
    def max_message(self) -> int:
        nc = self._nc
        return nc.max_payload if nc is not None and nc.is_connected else DEFAULT_MAX_PAYLOAD

    def describe(self) -> str:
        return f"NATS {self.target.redacted()}, subject {self.subject}"

    async def start(self, deliver: Deliver, dropped: Counter[str], rejoined: Callable[[], None] = lambda: None) -> None:
        self._deliver, self._dropped, self._rejoined = deliver, dropped, rejoined
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._dial(), name="bus-nats-dial"),
                       loop.create_task(self._write(), name="bus-nats-write")]
        # Wait a little for the first connection, never for long: the bus runs alone until the server answers.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._tasks[0]), 2.0)

    async def _dial(self) -> None:
        """Connect (again and again until the server answers), then subscribe; nats-py reconnects from then on."""
        first = True
        while self._nc is None:
            try:
                nc = await connect(self.target, name=f"pointsman-bus {self.name}", no_echo=True,
                                   reconnect_time_wait=RECONNECT_WAIT_S,
                                   connect_timeout=2, ping_interval=5, max_outstanding_pings=2,
                                   error_cb=self._error, disconnected_cb=self._disconnected,
                                   reconnected_cb=self._reconnected)
            except Exception as exc:  # noqa: BLE001 - no server yet: keep dialling, the bus runs alone
                if first:
                    log.warning("replica bus: NATS %s unreachable (%s); routing alone until it answers",
                                self.target.redacted(), type(exc).__name__)
                    first = False
                await asyncio.sleep(RECONNECT_WAIT_S)
                continue
            for subject in (self.subject, inbox(self.subject, self.name)):
                await nc.subscribe(subject, cb=self._on_msg, pending_msgs_limit=self.pending_msgs,
                                   pending_bytes_limit=PENDING_BYTES)
            self._nc = nc
            if not first:
                self._rejoined()
        log.info("replica bus: connected to NATS %s as pointsman-bus %s", self.target.redacted(), self.name)

    async def _on_msg(self, msg: Msg) -> None:
        deliver, data = self._deliver, msg.data
        if deliver is None:
            return
        if self.signed and len(data) > HMAC_BYTES:
            deliver([data[:-HMAC_BYTES], data[-HMAC_BYTES:]])
        else:
            deliver([data])

    async def _error(self, exc: Exception) -> None:
        if type(exc).__name__ == "SlowConsumerError":
            self._dropped["slow-consumer"] += 1
        else:
            log.debug("replica bus: NATS error %s", type(exc).__name__)

    async def _disconnected(self) -> None:
        self.disconnects += 1
        log.warning("replica bus: disconnected from NATS %s; routing alone until it is back",
                    self.target.redacted())

    async def _reconnected(self) -> None:
        self.reconnects += 1
        log.info("replica bus: reconnected to NATS %s", self.target.redacted())
        self._rejoined()

    # ---- sending -------------------------------------------------------------------------------------------
    def send(self, frames: list[bytes], to: str | None = None) -> bool:
        if not self.connected:
            self._dropped["disconnected"] += 1
            return False
        payload = b"".join(frames)
        if len(payload) > self.max_message:  # one record larger than the server takes
            self._dropped["too-large"] += 1
            return False
        if len(self._outbox) >= OUTBOX:
            self._dropped["send-queue-full"] += 1
            return False
        self._outbox.append((self.subject if to is None else inbox(self.subject, to), payload))
        self._ready.set()
        return True

    async def _write(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._outbox:
                nc = self._nc
                subject, payload = self._outbox.popleft()
                if nc is None or not nc.is_connected:
                    self._dropped["disconnected"] += 1
                    continue
                try:
                    await nc.publish(subject, payload)
                except Exception as exc:  # noqa: BLE001 - the connection went away under us
                    self._dropped["disconnected"] += 1
                    log.debug("replica bus: NATS publish failed: %s", type(exc).__name__)

    # ---- the mesh's side of the seam (nothing to do here) --------------------------------------------------
    def connect(self, peer: str) -> None:
        pass

    def disconnect(self, peer: str) -> None:
        pass

    def poll(self) -> None:
        pass

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks = []
        self._deliver = None
        nc, self._nc = self._nc, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 2.0)

    def stats(self) -> dict[str, Any]:
        return {"connected": self.connected, "reconnects": self.reconnects, "disconnects": self.disconnects}
