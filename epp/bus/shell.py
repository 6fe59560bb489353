"""The replica bus in `epp serve`: the bus, its replication adapter and its peer discovery, started from
`epp.bus.settings.BusSettings` (where the flags, the addresses and the peers are resolved).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from epp.bus.bus import ReplicaBus
from epp.bus.nats_transport import NatsTransport
from epp.bus.peers import ServicePeers
from epp.bus.replication import Replication
from epp.bus.settings import BusSettings
from epp.fleet import Datastore

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)


class BusRuntime:
    """The bus, its replication adapter and its peer discovery, as `App` runs them."""

    def __init__(self, settings: BusSettings, datastore: Datastore, api: ApiClient | None = None,
                 namespace: str = "default") -> None:
        if settings.service and api is None:
            raise ValueError("--bus-service needs the Kubernetes API (in-cluster config or --kubeconfig)")
        self.settings = settings
        s = settings
        transport = None
        if s.nats is not None:
            transport = NatsTransport(s.nats, s.subject, name=s.address, signed=s.secret is not None)
        self.bus = ReplicaBus(s.address, datastore.inflight, bind=s.bind or None, peers=s.peers, secret=s.secret,
                              ttl=s.ttl, heartbeat=s.heartbeat, known=lambda key: key in datastore.members(),
                              transport=transport)
        self.replication = Replication(self.bus, datastore)
        self.discovery: ServicePeers | None = None
        if s.service and api is not None:
            static = set(s.peers)
            self.discovery = ServicePeers(api, namespace, s.service, s.service_port, s.workers,
                                          lambda found: self.bus.set_peers(static | set(found)))

    async def start(self) -> None:
        await self.bus.start()
        if self.discovery is not None:
            self.discovery.start()
        s = self.settings
        peers = (f"peers from Service {s.service}" if s.service else "peers: whoever publishes on the subject"
                 if s.nats else f"{len(self.bus.peers)} peer(s)")
        log.info("replica bus: %s (%s), %s%s", s.address, self.bus.transport.describe(), peers,
                 ", messages signed" if s.secret else ", messages NOT signed (no --bus-secret)")

    async def stop(self) -> None:
        if self.discovery is not None:
            await self.discovery.stop()
        await self.bus.stop()


async def start_bus(settings: BusSettings, datastore: Datastore, api: ApiClient | None = None,
                    namespace: str = "default") -> BusRuntime:
    """Start the bus of `settings`; `api` is the Kubernetes client for a Service's peers (in `namespace`)."""
    runtime = BusRuntime(settings, datastore, api, namespace)
    await runtime.start()
    return runtime
