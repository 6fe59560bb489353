"""Pointsman's xDS side: an EDS server that feeds Envoy the pools' endpoints (see docs/envoy.md).

Built on xds-protos (upb) messages and their grpcio stubs, like the ext_proc service, so it shares the grpc.aio
server and port; envoy-data-plane (typed config for `epp envoy-config`) is never imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.xds.resources import EDS_TYPE_URL, ResourceTable, build_assignment, health_of, version_of
    from epp.xds.server import EdsService, add_eds_service
    from epp.xds.stream import EdsStream

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562).
_LAZY = {
    "EDS_TYPE_URL": "resources", "ResourceTable": "resources", "build_assignment": "resources",
    "health_of": "resources", "version_of": "resources",
    "EdsService": "server", "add_eds_service": "server",
    "EdsStream": "stream",
}

__all__ = ["EDS_TYPE_URL", "EdsService", "EdsStream", "ResourceTable", "add_eds_service", "build_assignment",
           "health_of", "version_of"]


__getattr__ = lazy_exports(__name__, _LAZY)
