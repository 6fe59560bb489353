"""Decision receipts: ids in replies, the decision as it was made over the gRPC API and `epp explain --decision`,
the count and age windows."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.api.dashboard.recorder import DecisionRecorder
from epp.api.pb import pointsman_pb2 as api
from epp.api.pb import pointsman_pb2_grpc
from epp.request.director import DecisionIds
from scheduling.api import SchedulingResult
from scheduling.types import Endpoint, LLMRequest
from tests.observe.test_tracing_otlp import FD, request, start
from tests.support.extproc import body_msg, headers_msg

ROOT = Path(__file__).resolve().parents[2]


async def receipt(port: int, decision_id: str) -> api.Receipt:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        return await pointsman_pb2_grpc.PointsmanStub(ch).GetReceipt(api.ReceiptRequest(decision_id=decision_id))


async def test_a_decision_is_shown_as_it_was_made(tmp_path):
    app = await start(tmp_path, "--receipts", "100")
    try:
        picked = await request(app.port, **{"x-request-id": "r-1"})
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:  # the access-log metadata
            call = pb_grpc.ExternalProcessorStub(ch).Process()
            await call.write(headers_msg(mode=FD))
            await call.write(body_msg(b'{"model": "llama", "messages": []}', True))
            msg = await call.read()
            await call.done_writing()
        did = msg.dynamic_metadata.fields["pointsman"].struct_value.fields["decision_id"].string_value
        ids = app.director.ids
        assert did == ids.format(2)
        first = await receipt(app.port, ids.format(1))
        assert first.found, first.error
        assert first.request_id == "r-1" and first.endpoint == picked and first.pool == "pool"
        assert sorted(first.candidates) == ["10.0.0.1:8000", "10.0.0.2:8000"]
        assert first.runner_up == ({"10.0.0.1:8000", "10.0.0.2:8000"} - {picked}).pop()
        assert first.HasField("margin") and first.margin >= 0
        run = first.profiles[0]
        scorer = next(p for p in run.plugins if p.kind == "scorer")
        assert set(scorer.scores) == set(first.candidates) and set(run.totals) == set(first.candidates)
        assert first.done and first.status == 200 and first.prompt_tokens == 9 and first.completion_tokens == 4
        # The CLI prints the same receipt.
        out = await asyncio.to_thread(  # the server answers on this loop: the CLI runs in a thread
            subprocess.run, [sys.executable, "-m", "epp.cmd.cli", "explain", "--addr", f"127.0.0.1:{app.port}",
                             "--decision", ids.format(1)], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        assert f"decision  {ids.format(1)}" in out.stdout and f"endpoint  {picked}" in out.stdout
        assert "estimated-latency-scorer" in out.stdout and "status 200" in out.stdout
        missing = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "epp.cmd.cli", "explain", "--addr", f"127.0.0.1:{app.port}",
                             "--decision", "abcdef-1"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert missing.returncode == 1 and "not made by this process" in missing.stdout
    finally:
        await app.stop(0)


async def test_the_count_window(tmp_path):
    app = await start(tmp_path, "--receipts", "2")
    try:
        for _ in range(3):
            await request(app.port)
        ids = app.director.ids
        gone = await receipt(app.port, ids.format(1))
        assert not gone.found and "no longer kept" in gone.error
        assert (await receipt(app.port, ids.format(3))).found
        bad = await receipt(app.port, "not-an-id")
        assert not bad.found and "not made by this process" in bad.error
    finally:
        await app.stop(0)


def test_the_age_window_and_the_search():
    rec = DecisionRecorder(capacity=100, max_age=10.0)
    ep = Endpoint("10.0.0.1:8000", "10.0.0.1", 8000)
    result = SchedulingResult(targets=[ep])
    for n, t in ((1, 0.0), (2, 5.0), (4, 8.0)):  # decision 3 was a provider decision: not recorded
        r = rec.decided(LLMRequest("r", "m", "m"), 1, result, t, t)
        r.receipt = n
    assert rec.find(2, 9.0).receipt == 2 and rec.find(3, 9.0) is None and rec.find(4, 9.0).receipt == 4
    assert rec.find(1, 12.0) is None  # older than 10 s when asked
    r = rec.decided(LLMRequest("r", "m", "m"), 1, result, 16.0, 16.0)  # appending drops what is too old
    r.receipt = 5
    assert [x.receipt for x in rec] == [4, 5]


def test_ids_are_per_process():
    a, b = DecisionIds(), DecisionIds()
    assert a.prefix != b.prefix
    n = a.take()
    assert a.parse(a.format(n)) == n and b.parse(a.format(n)) is None and a.parse(a.format(n + 1)) is None


async def test_receipts_follow_the_dashboard_by_default(tmp_path):
    from tests.support.envoy import free_port as port

    app = await start(tmp_path)  # no metrics port: no dashboard, so no decisions kept (and nothing spent on them)
    try:
        await request(app.port)
        assert app.recorder is None
        gone = await receipt(app.port, app.director.ids.format(1))
        assert not gone.found and "--receipts" in gone.error
    finally:
        await app.stop(0)
    app = await start(tmp_path, "--metrics-port", str(port()), "--dashboard-decisions", "7")
    try:
        assert app.recorder is not None and app.recorder.capacity == 7
    finally:
        await app.stop(0)


@pytest.mark.parametrize("flag", ["--decision-header", "--receipts"])
def test_bad_flags_are_clear(tmp_path, flag):
    from epp.observe import ObserveSettings
    from tests.support.stack import serve_args

    with pytest.raises(ValueError, match=flag):
        ObserveSettings.from_args(serve_args(flag, ":bad" if flag == "--decision-header" else "-1"))
