"""gRPC health (grpc.health.v1.Health) for the EPP.

Services answered, as GIE's EPP answers them on its health port:
- "liveness": always SERVING while the process runs (GIE without leader election ties it to the pool's sync; a
  restart would not sync the pool sooner, so Pointsman does not ask the kubelet for one).
- "", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "inference-extension": NOT_SERVING until the
  datastore has synced (`datastore.synced`: the first full view of the pool is in), SERVING after.
- any other name: as readiness (GIE without leader election answers every name so); with `leader_election`
  (`--ha-enable-leader-election`) SERVICE_UNKNOWN, and "inference-extension" too, as GIE's elected EPP answers.
  Pointsman is active-active: with leader election every replica is a leader, so readiness is the pool's sync.
After `enter_graceful_shutdown()` every service answers NOT_SERVING.

Status is computed from the datastore on every Check (no state to keep in step). Watch streams re-evaluate every
`watch_poll_s` and send a message whenever the status changes.

    health = await start_health_server(ds, port=9003)         # separate port, plaintext (kubelet probes)
    add_health_servicer(ext_proc_server, ds)                  # the same answers on the ext_proc port
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.fleet import Datastore

log = logging.getLogger(__name__)

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS_SERVICES: tuple[str, ...] = ("liveness",)
READINESS_SERVICES: tuple[str, ...] = ("", "readiness", EXT_PROC_SERVICE, "inference-extension")
LEADER_READINESS_SERVICES: tuple[str, ...] = ("", "readiness", EXT_PROC_SERVICE)  # GIE with leader election

SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class EppHealthServicer(health_pb2_grpc.HealthServicer):
    def __init__(self, is_ready: Callable[[], bool], watch_poll_s: float = 0.2, leader_election: bool = False) -> None:
        self._is_ready = is_ready
        self.watch_poll_s = watch_poll_s
        self.leader_election = leader_election
        self.shutting_down = False

    def status_for(self, service: str) -> int | None:
        """The serving status of a service name, or None if the service is unknown (only with leader election)."""
        if service in LIVENESS_SERVICES:
            return NOT_SERVING if self.shutting_down else SERVING
        if self.leader_election and service not in LEADER_READINESS_SERVICES:
            return None
        if self.shutting_down:
            return NOT_SERVING
        try:
            return SERVING if self._is_ready() else NOT_SERVING
        except Exception:  # a readiness probe must answer, never crash
            log.exception("readiness check failed")
            return NOT_SERVING

    async def Check(  # noqa: N802
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self.status_for(request.service)
        return health_pb2.HealthCheckResponse(status=SERVICE_UNKNOWN if status is None else status)

    async def Watch(  # noqa: N802
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            status = self.status_for(request.service)
            if status is None:
                status = SERVICE_UNKNOWN
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            await asyncio.sleep(self.watch_poll_s)

    def enter_graceful_shutdown(self) -> None:
        self.shutting_down = True


def add_health_servicer(
    server: grpc.aio.Server, datastore: Datastore, watch_poll_s: float = 0.2, leader_election: bool = False
) -> EppHealthServicer:
    """Register the health service on an existing grpc.aio server (e.g. the ext_proc server on 9002)."""
    servicer = EppHealthServicer(lambda: bool(datastore.synced), watch_poll_s, leader_election)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


async def start_health_server(
    datastore: Datastore,
    port: int = 9003,
    host: str = "0.0.0.0",
    credentials: grpc.ServerCredentials | None = None,
    watch_poll_s: float = 0.2,
    leader_election: bool = False,
    servicer: EppHealthServicer | None = None,
) -> grpc.aio.Server:
    """Start a grpc.aio server with only the health service (`--grpc-health-port`, 9003). Plaintext unless
    credentials are given (kubelet gRPC probes do not speak TLS). `servicer`: answer with this one (the ext_proc
    port's, so a graceful shutdown reaches both ports). Stop it with `await server.stop(grace)`."""
    server = grpc.aio.server()
    if servicer is None:
        add_health_servicer(server, datastore, watch_poll_s, leader_election)
    else:
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    addr = f"{host}:{port}"
    bound = server.add_secure_port(addr, credentials) if credentials else server.add_insecure_port(addr)
    if not bound:
        raise OSError(f"health server: cannot listen on {addr}")
    await server.start()
    log.info("gRPC health server listening on %s:%d", host, bound)
    return server
