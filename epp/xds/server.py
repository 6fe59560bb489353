"""The EDS gRPC service (envoy.service.endpoint.v3.EndpointDiscoveryService) on Pointsman's grpc.aio server.

Change flow: a datastore writer (endpoints file, Kubernetes, selector) calls `on_change` → the refresh task wakes at
once, rebuilds the changed pools' assignments and wakes every stream whose content changed. Health changes
(`Datastore.unhealthy`, stale metrics) are not datastore notifications, so the refresh task also polls every
`poll_s` (0.25 s). Either way Envoy hears of a change well within a second.

`StreamEndpoints` (state of the world) is what Envoy uses (`api_type: GRPC`); `FetchEndpoints` answers one-shot
requests (debugging, scripts). `DeltaEndpoints` is not served: Envoy configs from `epp envoy-config --eds` use
the state-of-the-world API, and a pool's assignment is small.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc

from epp.aio import cancel_and_wait, wait_set
from epp.fleet import Datastore
from epp.xds.resources import EDS_TYPE_URL, ResourceTable, version_of
from epp.xds.stream import EdsStream

log = logging.getLogger("epp.xds")

_CHANGE = object()
_CLOSE = object()


class EdsService(eds_pb2_grpc.EndpointDiscoveryServiceServicer):
    def __init__(self, datastore: Datastore, poll_s: float = 0.25) -> None:
        self.datastore = datastore
        self.table = ResourceTable(datastore)
        self.poll_s = poll_s
        self.streams: dict[EdsStream, asyncio.Queue[object]] = {}
        self.closed = False
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._synced_seen = False
        self._change_queued: set[EdsStream] = set()
        datastore.on_change(self._on_datastore_change)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.refresh()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._refresh_loop(), name="eds-refresh")

    async def stop(self) -> None:
        """End every stream now (Envoy reconnects elsewhere or later) and refuse new ones."""
        self.closed = True
        for queue in self.streams.values():
            queue.put_nowait(_CLOSE)
        await cancel_and_wait(self._task)
        self._task = None

    def _on_datastore_change(self, pool: str) -> None:
        self._dirty.set()

    async def _refresh_loop(self) -> None:
        while True:
            await wait_set(self._dirty, self.poll_s)
            self._dirty.clear()
            try:
                self.refresh()
            except Exception:  # the loop must outlive any bad snapshot
                log.exception("EDS refresh failed")

    def refresh(self) -> None:
        """Rebuild what changed and wake every stream if anything did. Everything that refreshes the table goes
        through here, so no change is seen by one caller and missed by the streams."""
        changed = self.table.refresh()
        synced = self.table.synced
        if changed or synced != self._synced_seen:
            self._synced_seen = synced
            for stream, queue in self.streams.items():
                if stream not in self._change_queued:  # one pending wake-up per stream is enough
                    self._change_queued.add(stream)
                    queue.put_nowait(_CHANGE)

    # ---- gRPC methods ------------------------------------------------------------------------------------
    async def StreamEndpoints(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        if self.closed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Pointsman is shutting down")
        stream = EdsStream(self.table, context.peer())
        queue: asyncio.Queue[object] = asyncio.Queue()
        self.streams[stream] = queue
        reader = asyncio.ensure_future(self._read(request_iterator, queue))
        try:
            while True:
                item = await queue.get()
                if item is _CLOSE:
                    break
                if item is _CHANGE:
                    self._change_queued.discard(stream)
                    reply = stream.on_change()
                else:
                    self.refresh()
                    try:
                        reply = stream.on_request(item)
                    except ValueError as e:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                if reply is not None:
                    yield reply
        finally:
            self.streams.pop(stream, None)
            self._change_queued.discard(stream)
            await cancel_and_wait(reader)
            log.info("EDS %s disconnected (sent %d, acked %d, rejected %d)", stream.who, stream.sent,
                     stream.acks, stream.nacks)

    async def _read(self, requests: AsyncIterator[discovery_pb2.DiscoveryRequest], queue: asyncio.Queue[Any]) -> None:
        try:
            async for req in requests:
                queue.put_nowait(req)
        except Exception as e:  # a broken stream ends the handler, it never hangs it
            log.debug("EDS stream read failed: %s", e)
        queue.put_nowait(_CLOSE)

    async def FetchEndpoints(  # noqa: N802 - gRPC method name
        self, request: discovery_pb2.DiscoveryRequest, context: grpc.aio.ServicerContext
    ) -> discovery_pb2.DiscoveryResponse:
        if request.type_url and request.type_url != EDS_TYPE_URL:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"this service serves {EDS_TYPE_URL}")
        self.refresh()
        resources, _ = self.table.resolve(request.resource_names)
        return discovery_pb2.DiscoveryResponse(version_info=version_of(resources), type_url=EDS_TYPE_URL,
                                               resources=[r.packed for r in resources])

    async def DeltaEndpoints(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "Pointsman serves state-of-the-world EDS (api_type GRPC), not delta xDS")


def add_eds_service(server: grpc.aio.Server, service: EdsService) -> None:
    eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(service, server)
