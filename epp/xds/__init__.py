"""Pointsman's xDS side: an EDS server that feeds Envoy the pools' endpoints (see docs/envoy.md).

Built on xds-protos (upb) messages and their grpcio stubs, like the ext_proc service, so it shares the grpc.aio
server and port; envoy-data-plane (typed config for `epp envoy-config`) is never imported here.
"""

from epp.xds.resources import EDS_TYPE_URL, ResourceTable, build_assignment, health_of, version_of
from epp.xds.server import EdsService, add_eds_service
from epp.xds.stream import EdsStream

__all__ = [
    "EDS_TYPE_URL",
    "EdsService",
    "EdsStream",
    "ResourceTable",
    "add_eds_service",
    "build_assignment",
    "health_of",
    "version_of",
]
