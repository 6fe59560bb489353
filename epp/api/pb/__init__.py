"""Generated gRPC code for Pointsman's own API (proto/pointsman.proto); regenerate, never edit (proto/README.md).

The face lists the two generated modules; `from epp.api.pb import pointsman_pb2` imports one on first use."""

__all__ = ["pointsman_pb2", "pointsman_pb2_grpc"]
