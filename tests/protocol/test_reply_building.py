"""Replies are built in place (epp/protocol/messages.py) for speed; they must be byte-identical to the same
messages built the plain way, with nested constructors."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from epp.protocol.contract import Outcome
from epp.protocol.messages import CHUNK_LIMIT, buffered_body_reply, headers_reply, streamed_chunks

OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def plain_mutation(sets, remove) -> pb.HeaderMutation:
    return pb.HeaderMutation(remove_headers=remove, set_headers=[
        base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=OVERWRITE)
        for k, v in sets])


def plain_metadata(md) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    for ns, fields in md.items():
        s.fields[ns].struct_value.update(fields)
    return s


def plain_headers_reply(o: Outcome) -> pb.ProcessingResponse:
    common = pb.CommonResponse(header_mutation=plain_mutation(o.set_headers, o.remove_headers),
                               clear_route_cache=o.clear_route_cache)
    resp = pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))
    if o.metadata:
        resp.dynamic_metadata.CopyFrom(plain_metadata(o.metadata))
    return resp


OUTCOMES = [
    Outcome(set_headers=[("x-gateway-destination-endpoint", "10.0.0.1:8000"), ("X-Gateway-Model-Name", "llama")],
            remove_headers=["x-gateway-destination-endpoint-served", "x-prefiller-host-port"],
            metadata={"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000,10.0.0.2:8000"}}),
    Outcome(),
    Outcome(set_headers=[("x-é", "ü")], clear_route_cache=False),
    Outcome(metadata={"a": {"n": 1.5, "s": "x", "l": ["p", "q"], "d": {"k": "v"}}, "b": {}}),
]


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_headers_reply_is_the_plain_message(outcome):
    built = headers_reply(outcome).SerializeToString(deterministic=True)
    assert built == plain_headers_reply(outcome).SerializeToString(deterministic=True)


def test_buffered_body_reply_carries_the_same_mutations():
    o = Outcome(set_headers=[("a", "b")], remove_headers=["r"], body=b'{"model":"x"}',
                metadata={"envoy.lb": {"k": "v"}})
    common = pb.CommonResponse(clear_route_cache=True)
    common.body_mutation.body = o.body
    common.header_mutation.CopyFrom(plain_mutation([*o.set_headers, ("content-length", str(len(o.body)))], ["r"]))
    plain = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    plain.dynamic_metadata.CopyFrom(plain_metadata(o.metadata))
    assert buffered_body_reply(o).SerializeToString(deterministic=True) == plain.SerializeToString(deterministic=True)


@pytest.mark.parametrize("size", [0, 5, CHUNK_LIMIT, CHUNK_LIMIT * 2 + 7])
@pytest.mark.parametrize("request_side", [True, False])
@pytest.mark.parametrize("eos", [True, False])
def test_streamed_chunks_are_the_plain_messages(size, request_side, eos):
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    offsets = range(0, max(len(data), 1), CHUNK_LIMIT)
    plain = []
    for off in offsets:
        sbr = pb.StreamedBodyResponse(body=data[off: off + CHUNK_LIMIT], end_of_stream=eos and off == offsets[-1])
        br = pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=sbr)))
        plain.append(pb.ProcessingResponse(request_body=br) if request_side else pb.ProcessingResponse(response_body=br))
    assert [r.SerializeToString() for r in streamed_chunks(data, eos, request_side)] == [
        r.SerializeToString() for r in plain]
