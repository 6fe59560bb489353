"""The replica bus's and the workers' `epp serve` flags, parsed once (cheap to import: no ZMQ).

    epp serve ... --bus-peers 10.0.0.5:9004,10.0.0.6:9004      static replicas (the same list everywhere)
    epp serve ... --bus-service pointsman-bus                   a headless Service's endpoints (Kubernetes)
    epp serve ... --workers 4                                   the workers of one pod share over ipc sockets
    epp serve ... --bus-url nats://10.0.0.9:4222                over a NATS server instead of the mesh

The bus is on when peers are given, a NATS URL (`--bus-url`: every process, every worker included, then talks over
NATS on the pool's subject; credentials in the URL, `--bus-nats-creds`, TLS flags; epp/natsconn.py) or the process
is a worker of several. A replica's address is `--bus-address`
(default $POD_IP, else 127.0.0.1) and `--bus-port` (9004); worker i of a replica uses port + i. The shared secret
(`--bus-secret`, better $POINTSMAN_BUS_SECRET or `--bus-secret-file`) signs every message with HMAC-SHA256; it is
never logged, shown or exported. Without one, anyone who can reach the bus port can publish load: keep the port
private (deploy/ adds a NetworkPolicy) or set a secret.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field

from epp.bus.peers import expand, host_port, parse_peers, split_address, worker_addresses
from epp.extras import check
from epp.natsconn import NatsTarget

DEFAULT_PORT = 9004


def add_flags(g: argparse._ActionsContainer) -> None:
    """The "replicas and workers" group."""
    env = os.environ.get
    g.add_argument("--workers", type=int, default=env("POINTSMAN_WORKERS", "1"),
                   help="worker processes sharing the gRPC port (SO_REUSEPORT) and state over the bus (1)")
    g.add_argument("--bus-peers", default=env("POINTSMAN_BUS_PEERS") or None,
                   help="other replicas' buses: host:port,... (the same list on every replica; its own is skipped)")
    g.add_argument("--bus-service", default=env("POINTSMAN_BUS_SERVICE") or None,
                   help="find the replicas in this headless Service's EndpointSlices (in --pool-namespace)")
    g.add_argument("--bus-port", type=int, default=env("POINTSMAN_BUS_PORT", str(DEFAULT_PORT)),
                   help=f"the bus's TCP port ({DEFAULT_PORT}); worker i uses port + i")
    g.add_argument("--bus-address", default=env("POINTSMAN_BUS_ADDRESS") or env("POD_IP") or None,
                   help="how peers reach this replica: host or host:port (default $POD_IP, else 127.0.0.1)")
    g.add_argument("--bus-secret", default=env("POINTSMAN_BUS_SECRET") or None,
                   help="shared secret that signs bus messages; prefer $POINTSMAN_BUS_SECRET (flags show in ps)")
    g.add_argument("--bus-secret-file", default=None, help="read the shared secret from this file")
    g.add_argument("--bus-ttl", type=float, default=1.0,
                   help="seconds a peer's shared load counts without news from it (1.0)")
    g.add_argument("--bus-heartbeat", type=float, default=0.1, help="seconds between a replica's snapshots (0.1)")
    g.add_argument("--bus-url", default=env("POINTSMAN_BUS_URL") or None,
                   help="share over NATS instead of the mesh: nats://[user:password@]host:port[,...] (tls:// too)")
    g.add_argument("--bus-subject", default=None,
                   help="the NATS subject of this pool's replicas (pointsman.bus.<pool namespace>.<pool name>)")
    g.add_argument("--bus-nats-creds", default=env("POINTSMAN_BUS_NATS_CREDS") or None,
                   help="a NATS credentials file (JWT and NKey seed)")
    g.add_argument("--bus-nats-ca", default=None, help="CA file that signs the NATS server's certificate")
    g.add_argument("--bus-nats-cert", default=None, help="client certificate for NATS (with --bus-nats-key)")
    g.add_argument("--bus-nats-key", default=None, help="the client certificate's key")
    # Set by the supervisor of `--workers N` for each worker (epp/workers/); not for operators.
    g.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--worker-dir", default=None, help=argparse.SUPPRESS)


@dataclass(frozen=True)
class BusSettings:
    """Where this process's bus lives and who its peers are."""

    address: str
    bind: str
    peers: list[str] = field(default_factory=list)
    service: str | None = None  # watch this headless Service for peers
    service_port: int = DEFAULT_PORT
    workers: int = 1
    secret: bytes | None = field(default=None, repr=False)  # never in a repr, a log or a metric
    ttl: float = 1.0
    heartbeat: float = 0.1
    nats: NatsTarget | None = None  # over NATS (address is then this process's unique name), else the mesh
    subject: str = ""


@dataclass(frozen=True)
class ReplicaSettings:
    """The workers of this replica, which one this process is, and its bus (None: off)."""

    workers: int = 1
    worker_index: int | None = None  # set by the supervisor for each worker
    worker_dir: str | None = None  # the supervisor's private directory (ipc sockets, control sockets)
    bus: BusSettings | None = None
    secret: str | None = field(default=None, repr=False)  # --bus-secret as given (the supervisor hands it on)

    @property
    def supervises(self) -> bool:
        """This process is the supervisor of `--workers N` (it serves nothing itself)."""
        return self.workers != 1 and self.worker_index is None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ReplicaSettings:
        if ns.workers < 1:
            raise ValueError("--workers must be at least 1")
        s = cls(workers=ns.workers, worker_index=ns.worker_index, worker_dir=ns.worker_dir, secret=ns.bus_secret)
        tcp = bool(ns.bus_peers or ns.bus_service)
        if tcp and ns.bus_url:
            raise ValueError("--bus-url (NATS) replaces --bus-peers and --bus-service: give one or the other")
        peers = parse_peers(ns.bus_peers or "") if tcp else []
        if not tcp and not ns.bus_url and s.workers <= 1:
            return s  # no bus
        if ns.bus_url:
            check("replicas", "--bus-url", ("nats", "msgpack"))
        else:
            check("replicas", "--bus-service" if ns.bus_service else "--bus-peers" if tcp else "--workers")
        if s.supervises:
            return s  # each worker resolves its own bus
        bus = BusSettings("", "", workers=s.workers, secret=read_secret(ns.bus_secret_file, ns.bus_secret),
                          ttl=ns.bus_ttl, heartbeat=ns.bus_heartbeat)
        if ns.bus_url:
            bus = nats_bus(bus, ns, s.worker_index or 0)
        elif tcp:
            bus = tcp_bus(bus, s.worker_index or 0, ns.bus_address or "127.0.0.1", ns.bus_port, peers, ns.bus_service)
        else:
            bus = ipc_bus(bus, s.worker_index or 0, s.worker_dir)
        return dataclasses.replace(s, bus=bus)


def read_secret(path: str | None, secret: str | None) -> bytes | None:
    """The shared secret: the file's content (stripped), else the flag's or the environment's value."""
    if path:
        with open(path, "rb") as f:
            data = f.read().strip()
        if not data:
            raise ValueError(f"--bus-secret-file {path}: the file is empty")
        return data
    return secret.encode() if secret else None


def ipc_bus(common: BusSettings, index: int, worker_dir: str | None) -> BusSettings:
    """The workers of one pod: ipc sockets in the supervisor's directory."""
    if not worker_dir:
        raise ValueError("--workers N shares state over ipc sockets in the supervisor's directory; "
                         "run `epp serve --workers N`, not a worker by hand")
    siblings = worker_addresses(worker_dir, common.workers)
    return dataclasses.replace(common, address=siblings[index], bind=siblings[index], peers=siblings)


def tcp_bus(common: BusSettings, index: int, address: str, port: int, peers: list[str],
            service: str | None) -> BusSettings:
    """Replicas over TCP: worker i of this replica on port + i, every peer replica's workers likewise."""
    host, base = _host_and_port(address, port)
    bind = f"tcp://{host_port(host, base + index)}" if _is_ip(host) else f"tcp://*:{base + index}"
    siblings = [host_port(host, base + j) for j in range(common.workers)]
    return dataclasses.replace(common, address=host_port(host, base + index), bind=bind,
                               peers=sorted(set(expand(peers, common.workers)) | set(siblings)), service=service,
                               service_port=base)


def nats_bus(common: BusSettings, ns: argparse.Namespace, index: int) -> BusSettings:
    """Over NATS: the server, the pool's subject, and this process's name on it (its bus address and port + worker
    index, as on the mesh: unique per process of a pool)."""
    target = NatsTarget.parse(ns.bus_url, creds=ns.bus_nats_creds, tls_ca=ns.bus_nats_ca, tls_cert=ns.bus_nats_cert,
                              tls_key=ns.bus_nats_key)
    host, base = _host_and_port(ns.bus_address or socket.gethostname(), ns.bus_port)
    subject = ns.bus_subject or ".".join(["pointsman", "bus", *(_token(x) for x in (
        getattr(ns, "pool_namespace", None) or "default", getattr(ns, "pool_name", None) or "default"))])
    if not re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*", subject):
        raise ValueError(f"--bus-subject {subject!r}: dot-separated tokens of letters, digits, _ and - (no wildcards)")
    return dataclasses.replace(common, address=host_port(host, base + index), nats=target, subject=subject)


def _token(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text) or "_"


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


__all__ = ["DEFAULT_PORT", "BusSettings", "ReplicaSettings", "add_flags"]
