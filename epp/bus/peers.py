"""Where the replica bus finds its peers: a static list, a headless Service's endpoints, or the workers of one pod.

Addresses are how peers know each other: "host:port" for TCP (the host a peer dials, the port its bus binds) or
"ipc:///path" for the workers of one pod. A process with W workers runs W buses, worker i on port base + i (or on
ipc socket i), so every peer address of a replica expands to W addresses (`expand`).

- static (`--bus-peers a:9004,b:9004`): the same list on every replica (a replica's own address is skipped);
- a headless Service (`--bus-service NAME`): the addresses of its EndpointSlices (label
  kubernetes.io/service-name=NAME), watched with the real Kubernetes client; a pod that appears becomes a peer,
  one that goes stops being one (its shared load is dropped at once). The Service should set
  publishNotReadyAddresses, so replicas find each other before they are ready;
- the workers of one pod: `worker_addresses(dir, W)` in a private directory.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from typing_extensions import Unpack

    from epp.fleet.k8s import ReflectorOptions

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def host_port(host: str, port: int) -> str:
    """"host:port", with an IPv6 host in brackets."""
    try:
        if isinstance(ipaddress.ip_address(host.strip("[]")), ipaddress.IPv6Address):
            return f"[{host.strip('[]')}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port, got {address!r}")
    return host, int(port)


def parse_peers(text: str) -> list[str]:
    """A comma list of "host:port" or "ipc://path" addresses; ValueError naming a bad one."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        if item.startswith("ipc://") or item.startswith("tcp://"):
            out.append(item)
            continue
        host, port = split_address(item)
        out.append(host_port(host, port))
    return out


def expand(addresses: Iterable[str], workers: int) -> list[str]:
    """Every worker's bus of every replica: host:port -> host:port, host:port+1, ... (W workers)."""
    out: list[str] = []
    for a in addresses:
        if workers <= 1 or "://" in a:
            out.append(a)
            continue
        host, port = split_address(a)
        out += [host_port(host, port + j) for j in range(workers)]
    return out


def worker_addresses(directory: str, workers: int) -> list[str]:
    """The ipc bus of each worker of one pod."""
    return [f"ipc://{directory}/bus-{j}" for j in range(workers)]


def slice_hosts(slices: Iterable[dict[str, Any]]) -> list[str]:
    """The addresses of every endpoint of these EndpointSlices (ready or not: a starting or draining replica still
    has load to share)."""
    hosts: set[str] = set()
    for sl in slices:
        if sl.get("addressType", "IPv4") not in ("IPv4", "IPv6"):
            continue
        for ep in sl.get("endpoints") or []:
            for addr in ep.get("addresses") or []:
                if isinstance(addr, str) and addr:
                    hosts.add(addr)
    return sorted(hosts)


class ServicePeers:
    """Watch a headless Service's EndpointSlices; call `on_change(peers)` with the bus addresses of its pods."""

    def __init__(self, api: ApiClient, namespace: str, service: str, port: int, workers: int,
                 on_change: Callable[[list[str]], None], **reflector_opts: Unpack[ReflectorOptions]) -> None:
        from epp.fleet.k8s import ENDPOINT_SLICE, Reflector, list_call

        self.service, self.port, self.workers = service, port, workers
        self.on_change = on_change
        self.slices: dict[str, dict[str, Any]] = {}
        self.peers: list[str] = []
        call = list_call(api, ENDPOINT_SLICE, namespace, label_selector=f"{SERVICE_NAME_LABEL}={service}")
        self.reflector = Reflector(f"endpointslices[{namespace}/{service}]", call, self._listed, self._event,
                                   **reflector_opts)

    def start(self) -> None:
        self.reflector.start()

    async def stop(self) -> None:
        await self.reflector.stop()

    def _listed(self, items: list[dict[str, Any]]) -> None:
        self.slices = {(i.get("metadata") or {}).get("name", ""): i for i in items}
        self._update()

    def _event(self, etype: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if etype == "DELETED":
            self.slices.pop(name, None)
        else:
            self.slices[name] = obj
        self._update()

    def _update(self) -> None:
        peers = expand([host_port(h, self.port) for h in slice_hosts(self.slices.values())], self.workers)
        if peers != self.peers:
            log.info("replica bus: Service %s lists %d peer address(es)", self.service, len(peers))
            self.peers = peers
            self.on_change(peers)
