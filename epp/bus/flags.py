"""The replica bus's and the workers' `epp serve` flags (cheap to import: the CLI builds them for every command)."""

from __future__ import annotations

import argparse
import os

DEFAULT_PORT = 9004


def add_bus_flags(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    g = p.add_argument_group("replicas and workers (a replica bus shares load and routing state; docs/replicas.md)")
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
    # Set by the supervisor of `--workers N` for each worker (epp/workers/); not for operators.
    g.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--worker-dir", default=None, help=argparse.SUPPRESS)
