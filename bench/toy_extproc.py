"""The floor: a toy ext_proc processor that only sets the destination header (no parsing, no scheduling).

    python bench/toy_extproc.py --port 9002 --backend 127.0.0.1:8000 [--sync]
Used by bench_extproc.py (--toy) to separate the gRPC transport's cost from Pointsman's own.
"""

from __future__ import annotations

import argparse
import asyncio
from concurrent import futures

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


def answer(req: pb.ProcessingRequest, held: list, headers: pb.ProcessingResponse) -> list:
    kind = req.WhichOneof("request")
    if kind == "request_headers":
        if req.request_headers.end_of_stream:
            return [headers]
        return []
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--gen", action="store_true", help="async-generator servicer instead of read/write")
    a = ap.parse_args()
    if a.sync:
        server = grpc.server(futures.ThreadPoolExecutor(64))
        pb_grpc.add_ExternalProcessorServicer_to_server(Sync(a.backend), server)
        server.add_insecure_port(f"127.0.0.1:{a.port}")
        server.start()
        server.wait_for_termination()
        return

    async def run() -> None:
        server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server((AioGen if a.gen else Aio)(a.backend), server)
        server.add_insecure_port(f"127.0.0.1:{a.port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


if __name__ == "__main__":
    main()
