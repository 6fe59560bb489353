"""The floor: a toy ext_proc processor that only sets the destination header (no parsing, no scheduling).

    python bench/toy_extproc.py --port 9002 --backend 127.0.0.1:8000 [--read-write | --sync] [--uvloop] [--buffered]
Used by bench_extproc.py (--floor) to separate the gRPC transport's cost from Pointsman's own. The default is a
grpc.aio async-generator servicer (the floor of the issue's table); --read-write uses context.read()/write(),
--sync a thread-per-stream grpc server. The request body mode is FULL_DUPLEX_STREAMED (the body is held and echoed
at its end), or BUFFERED with --buffered (the header reply is empty, the destination rides on the body reply).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from concurrent import futures
from pathlib import Path

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc


def replies(backend: str):
    hm = pb.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key="x-gateway-destination-endpoint", raw_value=backend.encode()))])
    headers = pb.ProcessingResponse(request_headers=pb.HeadersResponse(
        response=pb.CommonResponse(header_mutation=hm, clear_route_cache=True)))
    return headers


BUFFERED = False  # --buffered: Envoy's request body mode is BUFFERED
_EMPTY_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())


def answer(req: pb.ProcessingRequest, held: list, headers: pb.ProcessingResponse) -> list:
    kind = req.WhichOneof("request")
    if kind == "request_headers":
        if req.request_headers.end_of_stream:
            return [headers]
        return [_EMPTY_HEADERS] if BUFFERED else []
    if kind == "request_body" and BUFFERED:  # one message, the whole body: route on its reply
        return [pb.ProcessingResponse(request_body=pb.BodyResponse(response=headers.request_headers.response))]
    if kind == "request_body":
        held.append(req.request_body.body)
        if not req.request_body.end_of_stream:
            return []
        sbr = pb.StreamedBodyResponse(body=b"".join(held), end_of_stream=True)
        return [headers, pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse(
            body_mutation=pb.BodyMutation(streamed_response=sbr))))]
    if kind == "response_headers":
        return [pb.ProcessingResponse(response_headers=pb.HeadersResponse())]
    if kind == "response_body":
        sbr = pb.StreamedBodyResponse(body=req.response_body.body, end_of_stream=req.response_body.end_of_stream)
        return [pb.ProcessingResponse(response_body=pb.BodyResponse(response=pb.CommonResponse(
            body_mutation=pb.BodyMutation(streamed_response=sbr))))]
    if kind == "request_trailers":
        return [pb.ProcessingResponse(request_trailers=pb.TrailersResponse())]
    return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]


class Aio(pb_grpc.ExternalProcessorServicer):
    def __init__(self, backend: str) -> None:
        self.headers = replies(backend)

    async def Process(self, request_iterator, context):  # noqa: N802
        held: list = []
        while True:
            req = await context.read()
            if req is grpc.aio.EOF:
                return
            for r in answer(req, held, self.headers):
                await context.write(r)


class AioGen(Aio):
    async def Process(self, request_iterator, context):  # noqa: N802
        held: list = []
        async for req in request_iterator:
            for r in answer(req, held, self.headers):
                yield r


class Sync(pb_grpc.ExternalProcessorServicer):
    def __init__(self, backend: str) -> None:
        self.headers = replies(backend)

    def Process(self, request_iterator, context):  # noqa: N802
        held: list = []
        for req in request_iterator:
            yield from answer(req, held, self.headers)


class GrpclibService:
    """The same servicer on grpclib (pure-Python HTTP/2 on the asyncio loop: no gRPC core, no poller thread)."""

    def __init__(self, backend: str) -> None:
        self.headers = replies(backend)

    def __mapping__(self):  # noqa: N807 - grpclib's interface
        from grpclib.const import Cardinality, Handler

        return {"/envoy.service.ext_proc.v3.ExternalProcessor/Process": Handler(
            self.process, Cardinality.STREAM_STREAM, pb.ProcessingRequest, pb.ProcessingResponse)}

    async def process(self, stream) -> None:
        held: list = []
        async for req in stream:
            for r in answer(req, held, self.headers):
                await stream.send_message(r)


class H2Call:
    """The same processor as a callback-driven call on Pointsman's h2 transport (epp.h2grpc)."""

    __slots__ = ("stream", "held", "headers")

    def __init__(self, stream, headers: pb.ProcessingResponse) -> None:
        self.stream, self.held, self.headers = stream, [], headers

    def on_message(self, data: bytes) -> None:
        out = answer(pb.ProcessingRequest.FromString(data), self.held, self.headers)
        if out:
            self.stream.send_many([r.SerializeToString() for r in out])

    def on_end(self) -> None:
        self.stream.finish()

    def on_cancel(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--read-write", action="store_true", help="context.read()/write() instead of an async generator")
    ap.add_argument("--uvloop", action="store_true", help="run the asyncio servers on uvloop")
    ap.add_argument("--grpclib", action="store_true", help="grpclib (h2) instead of grpc.aio")
    ap.add_argument("--h2", action="store_true", help="Pointsman's h2 transport (epp.h2grpc) instead of grpc.aio")
    ap.add_argument("--buffered", action="store_true", help="Envoy's request body mode is BUFFERED")
    ap.add_argument("--option", action="append", default=[], help="a grpc server option name=value (int or text)")
    a = ap.parse_args()
    global BUFFERED
    BUFFERED = a.buffered
    options = []
    for o in a.option:
        k, v = o.split("=", 1)
        options.append((k, int(v) if v.lstrip("-").isdigit() else v))
    if a.sync:
        server = grpc.server(futures.ThreadPoolExecutor(64), options=options)
        pb_grpc.add_ExternalProcessorServicer_to_server(Sync(a.backend), server)
        server.add_insecure_port(f"127.0.0.1:{a.port}")
        server.start()
        server.wait_for_termination()
        return

    async def run_grpclib() -> None:
        from grpclib.server import Server

        server = Server([GrpclibService(a.backend)])
        await server.start("127.0.0.1", a.port)
        await server.wait_closed()

    async def run_h2() -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from epp.h2grpc import H2Server

        headers = replies(a.backend)
        server = H2Server()
        server.add_native_method("/envoy.service.ext_proc.v3.ExternalProcessor/Process",
                                 lambda stream: H2Call(stream, headers))
        server.add_insecure_port(f"127.0.0.1:{a.port}")
        await server.start()
        await server.wait_for_termination()

    async def run() -> None:
        if a.grpclib:
            return await run_grpclib()
        if a.h2:
            return await run_h2()
        server = grpc.aio.server(options=options)
        pb_grpc.add_ExternalProcessorServicer_to_server((Aio if a.read_write else AioGen)(a.backend), server)
        server.add_insecure_port(f"127.0.0.1:{a.port}")
        await server.start()
        await server.wait_for_termination()

    if a.uvloop:
        import uvloop

        uvloop.run(run())
    else:
        asyncio.run(run())


if __name__ == "__main__":
    main()
