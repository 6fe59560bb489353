"""Traces over real OTLP: Pointsman in-process, a raw ext_proc client playing Envoy, and a real receiver on the wire
(a gRPC TraceService server, and an OTLP/HTTP endpoint)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.cmd.app import App
from epp.protocol import BodyMode
from tests.support.envoy import free_port
from tests.support.extproc import body_msg, headers_msg, response_body_msg, response_headers_msg
from tests.support.otlp import GrpcReceiver, HttpReceiver
from tests.support.stack import serve_args

ROOT = Path(__file__).resolve().parents[2]
FD = BodyMode.FULL_DUPLEX_STREAMED
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
ENVOY_SPAN = "00f067aa0ba902b7"
CLIENT_SPAN = "b7ad6b7169203331"


def endpoints(tmp_path: Path) -> Path:
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: pool\n  endpoints:\n"
                   "  - {address: 10.0.0.1, port: 8000, models: [llama]}\n"
                   "  - {address: 10.0.0.2, port: 8000, models: [llama]}\n")
    return eps


async def start(tmp_path: Path, *flags: str) -> App:
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(endpoints(tmp_path)), *flags))
    await app.start()
    return app


async def request(port: int, *, metadata: tuple = (), stream: bool = True, **headers: str) -> str:
    """One request as Envoy sends it (headers, body, then the response's headers and an SSE body with usage);
    returns the endpoint picked."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = pb_grpc.ExternalProcessorStub(ch).Process(metadata=metadata or None)
        await call.write(headers_msg(mode=FD, **headers))
        body = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "hello"}]})
        await call.write(body_msg(body, True))
        picked = ""
        while not picked:
            msg = await call.read()
            assert msg is not grpc.aio.EOF, "the stream ended before the pick"
            assert msg.WhichOneof("response") != "immediate_response", msg
            for src in (msg.request_headers, msg.request_body):
                for o in src.response.header_mutation.set_headers:
                    if o.header.key == "x-gateway-destination-endpoint":
                        picked = o.header.raw_value.decode()
        await call.write(response_headers_msg(content_type="text/event-stream" if stream else "application/json"))
        chunk = (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
                 b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}\n\ndata: [DONE]\n\n')
        await call.write(response_body_msg(chunk, True))
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass
    return picked


def by_name(spans, name):
    return [s for s in spans if s.name == name]


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
async def test_a_request_span_with_stage_children_reaches_a_grpc_receiver(tmp_path, transport):
    rx = GrpcReceiver()
    await rx.start()
    app = await start(tmp_path, "--grpc-transport", transport, "--tracing", "--tracing-endpoint", rx.endpoint,
                      "--tracing-sample-ratio", "1", "--tracing-service-name", "epp-test")
    try:
        picked = await request(app.port, **{"x-request-id": "req-1"})
        spans = await rx.wait_for(lambda s: any(r.name == "pointsman.schedule" for r in s)
                                  and any(r.name == "pointsman.request" for r in s))
    finally:
        await app.stop(0)
        await rx.stop()
    root = by_name(spans, "pointsman.request")[0]
    assert root.service == "epp-test"
    assert root.span.kind == 2  # SERVER
    assert root.parent_id == ""  # no context came with the request: a new trace
    a = root.attrs()
    assert a["pointsman.pick"] == picked
    assert a["pointsman.runner_up"] in {"10.0.0.1:8000", "10.0.0.2:8000"} - {picked}
    assert isinstance(a["pointsman.margin"], float) and a["pointsman.margin"] >= 0
    assert 0.0 <= a["pointsman.score.estimated-latency-scorer"] <= 1.0
    assert a["pointsman.pool"] == "pool" and a["gen_ai.request.model"] == "llama"
    assert a["pointsman.candidates"] == 2 and a["pointsman.request_id"] == "req-1"
    assert a["http.response.status_code"] == 200
    assert a["gen_ai.usage.input_tokens"] == 9 and a["gen_ai.usage.output_tokens"] == 4
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    assert a["pointsman.decision_id"].startswith(app.director.ids.prefix + "-")
    child = by_name(spans, "pointsman.schedule")[0]
    assert child.trace_id == root.trace_id and child.parent_id == root.span_id
    assert root.span.start_time_unix_nano <= child.span.start_time_unix_nano
    assert child.span.end_time_unix_nano <= root.span.end_time_unix_nano
    # Stages that did no work of their own get no span: no flow control, no tokenization, and admission is the
    # built-in saturation check alone.
    assert not by_name(spans, "pointsman.queue") and not by_name(spans, "pointsman.tokenize")
    assert not by_name(spans, "pointsman.admit")


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
async def test_the_parent_is_the_stream_metadata_else_the_request_headers(tmp_path, transport):
    rx = GrpcReceiver()
    await rx.start()
    app = await start(tmp_path, "--grpc-transport", transport, "--tracing", "--tracing-endpoint", rx.endpoint,
                      "--tracing-sample-ratio", "0")  # only sampled parents are followed
    envoy = f"00-{CLIENT_TRACE}-{ENVOY_SPAN}-01"
    client = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    try:
        # Envoy traces: its egress span's context is in the stream's metadata (and wins over the headers).
        await request(app.port, metadata=(("traceparent", envoy), ("tracestate", "envoy=1")), traceparent=client)
        # Envoy does not trace: the client's traceparent in the request headers.
        await request(app.port, traceparent=client, tracestate="vendor=x")
        # An unsampled parent, and no parent at ratio 0: no spans.
        await request(app.port, traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00")
        await request(app.port)
        spans = await rx.wait_for(lambda s: len(by_name(s, "pointsman.request")) >= 2)
    finally:
        await app.stop(0)
        await rx.stop()
    roots = by_name(spans, "pointsman.request")
    assert len(roots) == 2, [r.attrs() for r in roots]
    from_envoy = next(r for r in roots if r.attrs()["pointsman.parent"] == "envoy")
    from_client = next(r for r in roots if r.attrs()["pointsman.parent"] == "client")
    assert from_envoy.trace_id == from_client.trace_id == CLIENT_TRACE
    assert from_envoy.parent_id == ENVOY_SPAN and from_client.parent_id == CLIENT_SPAN
    assert from_envoy.span.trace_state == "envoy=1" and from_client.span.trace_state == "vendor=x"
    assert from_envoy.span.flags & 0x300 == 0x300  # the parent is remote


async def test_otlp_http_export_and_a_rejection_span(tmp_path):
    rx = HttpReceiver()
    await rx.start()
    app = await start(tmp_path, "--tracing", "--tracing-protocol", "http/protobuf", "--tracing-endpoint",
                      rx.endpoint, "--tracing-sample-ratio", "1")
    try:
        await request(app.port, stream=False)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:  # a bad body: rejected with 400
            call = pb_grpc.ExternalProcessorStub(ch).Process()
            await call.write(headers_msg(mode=FD))
            await call.write(body_msg(b"{not json", True))
            msg = await call.read()
            assert msg.immediate_response.status.code == 400
        spans = await rx.wait_for(lambda s: len(by_name(s, "pointsman.request")) >= 2)
    finally:
        await app.stop(0)
        await rx.stop()
    assert set(rx.content_types) == {"application/x-protobuf"}
    roots = by_name(spans, "pointsman.request")
    rejected = next(r for r in roots if "error.type" in r.attrs())
    assert rejected.attrs()["error.type"] == "BadRequest"
    assert rejected.span.status.code == 2  # ERROR
    ok = next(r for r in roots if "error.type" not in r.attrs())
    assert "gen_ai.response.time_to_first_chunk" not in ok.attrs()  # not an event stream
    assert ok.attrs()["pointsman.first_byte_seconds"] > 0


def test_tracing_without_the_sdk_fails_with_a_clear_error(tmp_path):
    """`--tracing` with the [otel] extra missing: the process exits naming the extra (the SDK is hidden from it)."""
    code = ("import sys; sys.modules['opentelemetry'] = None; sys.modules['opentelemetry.sdk'] = None\n"
            "from epp.cmd.cli import main\n"
            f"sys.exit(main(['serve', '--grpc-port', '{free_port()}', '--grpc-health-port', '0', "
            f"'--metrics-port', '0', '--endpoints-file', '{endpoints(tmp_path)}', '--tracing']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1, run.stderr
    assert "pip install 'pointsman[otel]'" in run.stderr


def test_tracing_off_imports_no_sdk(tmp_path):
    code = ("import sys, asyncio\nfrom epp.cmd.app import App\nfrom tests.support.stack import serve_args\n"
            "async def main():\n"
            f"    app = App(serve_args('--grpc-port', '{free_port()}', '--endpoints-file', '{endpoints(tmp_path)}'))\n"
            "    await app.start(); await app.stop(0)\n"
            "asyncio.run(main())\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"


class Refuse:
    """An admitter that refuses every request, as a rate limit past its budget does (epp/request/admit.py)."""

    def admit(self, ctx, parsed, dry_run=False):
        from epp.protocol import Outcome

        return Outcome(reject_status=429, reject_body="inference error: ResourceExhausted - over the limit")


async def test_an_admission_refusal_has_an_admit_span(tmp_path):
    rx = GrpcReceiver()
    await rx.start()
    app = await start(tmp_path, "--tracing", "--tracing-endpoint", rx.endpoint, "--tracing-sample-ratio", "1")
    app.publish(app.director.replace(admitters=(*app.director.admitters, Refuse())))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:
            call = pb_grpc.ExternalProcessorStub(ch).Process()
            await call.write(headers_msg(mode=FD))
            body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}
            await call.write(body_msg(orjson.dumps(body), True))
            assert (await call.read()).immediate_response.status.code == 429
        spans = await rx.wait_for(lambda s: by_name(s, "pointsman.admit") and by_name(s, "pointsman.request"))
    finally:
        await app.stop(0)
        await rx.stop()
    root, admit = by_name(spans, "pointsman.request")[0], by_name(spans, "pointsman.admit")[0]
    assert admit.parent_id == root.span_id and root.attrs()["error.type"] == "ResourceExhausted"
    assert not by_name(spans, "pointsman.schedule")
