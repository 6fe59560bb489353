"""ext_proc message builders, a synchronous machine driver and a real director over static endpoints."""

from __future__ import annotations

import random

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.fleet.datastore import Datastore, PoolSpec
from epp.protocol import BodyMode, Outcome, Phase, RequestMachine
from epp.request.director import Director
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, endpoint_key

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


class Recorder:
    """Records what the machine asks; routes everything to one fixed endpoint."""

    def __init__(self, outcome: Outcome | None = None) -> None:
        self.decisions: list[tuple[dict, bytes, dict]] = []
        self.outcome = outcome or Outcome(
            set_headers=[("x-gateway-destination-endpoint", "10.0.0.1:8000")],
            remove_headers=["x-gateway-destination-endpoint-served"],
            metadata={"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000"}},
        )
        self.response_chunks: list[tuple[bytes, bool]] = []

    def decide(self, headers, body, metadata):
        self.decisions.append((dict(headers), body, metadata))
        return self.outcome

    def response_headers(self, headers, metadata):
        return [("x-served", "yes")]

    def response_body(self, chunk, end_of_stream):
        self.response_chunks.append((chunk, end_of_stream))
        return chunk

    def response_end(self):
        pass

    def close(self):
        pass


def set_headers(resp: pb.ProcessingResponse, phase: str) -> dict[str, bytes]:
    common = getattr(resp, phase).response
    for opt in common.header_mutation.set_headers:
        assert opt.header.value == "", "only raw_value may be set"
    return {o.header.key: o.header.raw_value for o in common.header_mutation.set_headers}



class SyncMachine(RequestMachine):
    """The machine with the grpc layer's fast path: a needed decision is made at once by the exchange."""

    __slots__ = ()

    def feed(self, req: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        out = super().feed(req)
        if self.phase is Phase.DECIDING or self.phase is Phase.EARLY:
            d = self.decision
            assert d is not None
            out += self.resolve(self.exchange.decide(d.headers, d.body, d.metadata))  # type: ignore[arg-type]
        return out


def headers_msg(
    eos: bool = False, *, use_value: bool = False, mode: BodyMode | None = None, response_mode: BodyMode | None = None,
    wait: bool = True, path: str = "/v1/chat/completions", method: str = "POST", **extra: str,
) -> pb.ProcessingRequest:
    hdrs = {":path": path, ":method": method, "content-type": "application/json", **extra}
    hm = pb.HttpHeaders(end_of_stream=eos)
    for k, v in hdrs.items():
        if use_value:
            hm.headers.headers.add(key=k, value=v)
        else:
            hm.headers.headers.add(key=k, raw_value=v.encode())
    req = pb.ProcessingRequest(request_headers=hm)
    if mode is not None:
        set_config(req, mode, response_mode if response_mode is not None else mode, wait)
    return req


def set_config(req: pb.ProcessingRequest, mode: int, response_mode: int, wait: bool = True) -> pb.ProcessingRequest:
    req.protocol_config.request_body_mode = int(mode)
    req.protocol_config.response_body_mode = int(response_mode)
    req.protocol_config.send_body_without_waiting_for_header_response = not wait
    return req


def body_msg(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


def trailers_msg() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def response_headers_msg(eos: bool = False, content_type: str = "application/json") -> pb.ProcessingRequest:
    rh = pb.HttpHeaders(end_of_stream=eos)
    rh.headers.headers.append(base_pb2.HeaderValue(key=":status", raw_value=b"200"))
    rh.headers.headers.append(base_pb2.HeaderValue(key="content-type", raw_value=content_type.encode()))
    return pb.ProcessingRequest(response_headers=rh)


def response_body_msg(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=eos))


def response_trailers_msg() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())


def kinds(replies: list[pb.ProcessingResponse]) -> list[str]:
    return [r.WhichOneof("response") for r in replies]


ENDPOINTS = [("10.0.0.1", 8000), ("10.0.0.2", 8000), ("10.0.0.3", 8000)]


def real_director(seed: int = 1, config: dict | None = None) -> Director:
    """A real Director over a real Datastore with three static endpoints and the built-in default scheduler (or the
    scheduling config document `config`)."""
    ds = Datastore()
    ds.set_pool(PoolSpec("pool"), [Endpoint(key=endpoint_key(ip, port), address=ip, port=port)
                                   for ip, port in ENDPOINTS])
    return Director(ds, load_scheduler([config] if config else None, rng=random.Random(seed)))


# A scheduling config that reads no prompt: a full-duplex request decides as soon as its model has arrived.
LOAD_ONLY = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
             "plugins": [{"type": "queue-scorer"}]}


def inflight(director: Director) -> int:
    return sum(load.requests for load in director.datastore.inflight.view().values())
