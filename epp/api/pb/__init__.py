"""Generated gRPC code for Pointsman's own API (proto/pointsman.proto); regenerate, never edit (proto/README.md)."""
