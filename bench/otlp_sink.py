"""A do-nothing OTLP/gRPC trace collector for the benchmarks: accepts TraceService/Export calls, counts them and
their bytes, and answers success without decoding (a tracing candidate's export should cost it, not the sink).

    .venv/bin/python bench/otlp_sink.py --port 4317
"""

from __future__ import annotations

import argparse
import signal
import threading
from concurrent import futures

import grpc

EXPORT = "Export"
SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=4317)
    args = ap.parse_args()
    seen = {"calls": 0, "bytes": 0}

    def export(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen["calls"] += 1
        seen["bytes"] += len(request)
        return b""  # an empty ExportTraceServiceResponse: full success

    handler = grpc.method_handlers_generic_handler(SERVICE, {EXPORT: grpc.unary_unary_rpc_method_handler(export)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler],
                         options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    server.stop(0)
    print(f"otlp sink: {seen['calls']} exports, {seen['bytes']} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
