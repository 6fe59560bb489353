"""The replica bus in `epp serve`: flags, where this process's bus lives, who its peers are, and the wiring.

    epp serve ... --bus-peers 10.0.0.5:9004,10.0.0.6:9004      static replicas (the same list everywhere)
    epp serve ... --bus-service pointsman-bus                   a headless Service's endpoints (Kubernetes)
    epp serve ... --workers 4                                   the workers of one pod share over ipc sockets

The bus is on when peers are given or the process has several workers. A replica's address is `--bus-address`
(default $POD_IP, else 127.0.0.1) and `--bus-port` (9004); worker i of a replica uses port + i. The shared secret
(`--bus-secret`, better $POINTSMAN_BUS_SECRET or `--bus-secret-file`) signs every message with HMAC-SHA256; it is
never logged, shown or exported. Without one, anyone who can reach the bus port can publish load: keep the port
private (deploy/ adds a NetworkPolicy) or set a secret.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Any

from epp.bus.bus import ReplicaBus
from epp.bus.flags import DEFAULT_PORT
from epp.bus.peers import ServicePeers, expand, host_port, parse_peers, split_address, worker_addresses
from epp.bus.replication import Replication
from epp.fleet.datastore import Datastore

log = logging.getLogger(__name__)

@dataclass
class BusSettings:
    address: str
    bind: str
    peers: list[str] = field(default_factory=list)
    service: str | None = None  # watch this headless Service for peers
    service_port: int = DEFAULT_PORT
    workers: int = 1
    secret: bytes | None = None
    ttl: float = 1.0
    heartbeat: float = 0.1


def read_secret(args: argparse.Namespace) -> bytes | None:
    if args.bus_secret_file:
        with open(args.bus_secret_file, "rb") as f:
            data = f.read().strip()
        if not data:
            raise ValueError(f"--bus-secret-file {args.bus_secret_file}: the file is empty")
        return data
    return args.bus_secret.encode() if args.bus_secret else None


def bus_settings(args: argparse.Namespace) -> BusSettings | None:
    """Where this process's bus lives and who its peers are; None when the bus is off."""
    workers = max(1, args.workers)
    index = args.worker_index or 0
    tcp = bool(args.bus_peers or args.bus_service)
    if not tcp and workers <= 1:
        return None
    secret = read_secret(args)
    common: dict[str, Any] = {"workers": workers, "secret": secret, "ttl": args.bus_ttl,
                              "heartbeat": args.bus_heartbeat}
    if not tcp:
        if not args.worker_dir:
            raise ValueError("--workers N shares state over ipc sockets in the supervisor's directory; "
                             "run `epp serve --workers N`, not a worker by hand")
        siblings = worker_addresses(args.worker_dir, workers)
        return BusSettings(siblings[index], siblings[index], siblings, **common)
    host, base = _host_and_port(args.bus_address or "127.0.0.1", args.bus_port)
    address = host_port(host, base + index)
    bind = f"tcp://{host_port(host, base + index)}" if _is_ip(host) else f"tcp://*:{base + index}"
    siblings = [host_port(host, base + j) for j in range(workers)]
    peers = expand(parse_peers(args.bus_peers or ""), workers)
    return BusSettings(address, bind, sorted(set(peers) | set(siblings)), service=args.bus_service,
                       service_port=base, **common)


def _host_and_port(address: str, port: int) -> tuple[str, int]:
    """"host", "host:port", "v6", "[v6]" or "[v6]:port" -> (host without brackets, port)."""
    if address.startswith("[") and "]:" in address or not address.startswith("[") and address.count(":") == 1:
        host, port = split_address(address)
        return host.strip("[]"), port
    return address.strip("[]"), port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class BusRuntime:
    """The bus, its replication adapter and its peer discovery, as `App` runs them."""

    def __init__(self, settings: BusSettings, datastore: Datastore, api: Any = None, namespace: str = "default",
                 **bus_opts: Any) -> None:
        self.settings = settings
        s = settings
        self.bus = ReplicaBus(s.address, datastore.inflight, bind=s.bind, peers=s.peers, secret=s.secret,
                              ttl=s.ttl, heartbeat=s.heartbeat, known=lambda key: key in datastore.members(),
                              **bus_opts)
        self.replication = Replication(self.bus, datastore)
        self.discovery: ServicePeers | None = None
        if s.service:
            static = set(s.peers)
            self.discovery = ServicePeers(api, namespace, s.service, s.service_port, s.workers,
                                          lambda found: self.bus.set_peers(static | set(found)))

    async def start(self) -> None:
        await self.bus.start()
        if self.discovery is not None:
            self.discovery.start()
        s = self.settings
        log.info("replica bus: %s (%s), %s%s", s.address, s.bind,
                 f"peers from Service {s.service}" if s.service else f"{len(self.bus.peers)} peer(s)",
                 ", messages signed" if s.secret else ", messages NOT signed (no --bus-secret)")

    async def stop(self) -> None:
        if self.discovery is not None:
            await self.discovery.stop()
        await self.bus.stop()


async def start_bus(args: argparse.Namespace, datastore: Datastore, api: Any = None) -> BusRuntime | None:
    """Start the bus `args` ask for (None when it is off); `api` is the Kubernetes client for --bus-service."""
    settings = bus_settings(args)
    if settings is None:
        return None
    if settings.service and api is None:
        raise ValueError("--bus-service needs the Kubernetes API (in-cluster config or --kubeconfig)")
    runtime = BusRuntime(settings, datastore, api, args.pool_namespace)
    await runtime.start()
    return runtime
