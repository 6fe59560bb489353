"""Limits shared by two real `epp serve` processes through one real redis-server, driven concurrently as Envoy would
drive them (a raw ext_proc client, with the engine's usage in the response): together they admit within 5% of the
configured amount. LLMKube's ModelRouter budgets (`--redis-url`), and Kthena's ModelRoute global rateLimit (the
Redis address from the route)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import orjson
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.stack.ports import free_port, wait_port
from tests.support.extproc_client import one_request
from tests.support.redis_server import RedisServer
from tests.support.wait import until

pytestmark = [pytest.mark.realtime, pytest.mark.slow]
EPP = str(Path(sys.executable).parent / "epp")


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


class EppProcess:
    def __init__(self, tmp: Path, name: str, *flags: str) -> None:
        self.grpc_port, self.metrics_port = free_port(), free_port()
        self.log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [EPP, "serve", "--secure-serving=false", "--grpc-host", "127.0.0.1", "--grpc-port", str(self.grpc_port), "--grpc-health-port", "0",
             "--metrics-port", str(self.metrics_port), "--refresh-metrics-interval", "60s",
             # a loaded test machine can take more than the default 30 ms to answer; 2 replicas share the limits
             "--ratelimit-redis-timeout", "2s", "--ratelimit-replicas", "2", *flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_port(self.grpc_port, timeout=30, proc=self.proc, what="epp serve")
        wait_port(self.metrics_port, timeout=30, proc=self.proc, what="epp serve metrics")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            return await r.text()


def estimated(messages: list) -> int:
    """Pointsman's own prompt estimate for a chat request (the JSON of its messages, 4 characters per token)."""
    return len(orjson.dumps(messages)) // 4


async def hammer(port: int, model: str, seed: int, stats: dict, *, workers: int = 12, give_up: int = 25,
                 max_seconds: float = 60.0) -> None:
    """Workers send requests until each has been refused `give_up` times in a row."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_seconds
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)

        async def worker(i: int) -> None:
            rng = random.Random(seed * 100 + i)
            refused = 0
            while refused < give_up and loop.time() < deadline:
                messages = [{"role": "user", "content": "x" * rng.randint(200, 1600)}]
                max_tokens = rng.randint(1, 100)
                prompt = estimated(messages)
                completion = rng.randint(0, max_tokens)
                res = await one_request(stub, {"model": model, "messages": messages, "max_tokens": max_tokens},
                                        usage=(prompt, completion))
                if res.status == 429:
                    refused += 1
                    stats["refused"] += 1
                    assert "ResourceExhausted" in res.body
                    continue
                assert res.status == 200, res
                refused = 0
                stats["admitted"] += 1
                stats["input"] += prompt
                stats["total"] += prompt + completion

        await asyncio.gather(*(worker(i) for i in range(workers)))


async def run_two(procs: list[EppProcess], model: str) -> list[dict]:
    stats = [{"admitted": 0, "refused": 0, "input": 0, "total": 0} for _ in procs]
    await asyncio.gather(*(hammer(p.grpc_port, model, i + 1, s) for i, (p, s) in enumerate(zip(procs, stats,
                                                                                                 strict=True))))
    for p in procs:  # every admission was Redis's: none was answered by the Redis-down policy
        text = await p.metrics()
        assert "pointsman_ratelimit_redis_up 1.0" in text
        fallbacks = [li for li in text.splitlines() if li.startswith("pointsman_ratelimit_redis_fallback_total{")]
        assert all(li.endswith(" 0.0") for li in fallbacks), fallbacks
    return stats


async def test_model_router_budgets_are_shared_by_two_processes_within_5_percent(tmp_path, redis_server):
    budget = 60_000
    (tmp_path / "eps.yaml").write_text(yaml.safe_dump({"pools": [
        {"name": "svc-a", "endpoints": [{"address": "127.0.0.1", "port": 9}]}]}))
    (tmp_path / "routes.yaml").write_text(yaml.safe_dump({
        "apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelRouter", "metadata": {"name": "shared"},
        "spec": {"backends": [{"name": "a", "inferenceServiceRef": {"name": "svc-a"}}], "defaultRoute": "a",
                 "policy": {"budgets": [{"name": "daily", "scope": "router", "maxTokens": budget,
                                         "windowSeconds": 3600}]}}}))
    flags = ("--endpoints-file", str(tmp_path / "eps.yaml"), "--routes-file", str(tmp_path / "routes.yaml"),
             "--redis-url", redis_server.url)
    procs = [EppProcess(tmp_path, f"epp-{i}", *flags) for i in range(2)]
    try:
        stats = await run_two(procs, "anything")
        total = sum(s["total"] for s in stats)
        assert all(s["admitted"] > 10 for s in stats), stats  # both replicas served
        assert 0.95 * budget <= total <= budget + 200, stats  # + at most the last request's output
        for p in procs:  # each process re-reads the shared state every 2 s for its metrics page
            seen: list[str] = []

            async def utilization(p: EppProcess = p, seen: list[str] = seen) -> bool:
                text = await p.metrics()
                line = next(li for li in text.splitlines()
                            if li.startswith('pointsman_budget_utilization{budget="default/shared/daily"}'))
                seen.append(line)
                return float(line.rsplit(" ", 1)[1]) >= 0.95

            await until(utilization, 10, lambda seen=seen: f"the shared budget's utilization >= 0.95: {seen[-1:]}",
                        interval=0.1)
    finally:
        for p in procs:
            p.stop()


async def test_kthena_global_rate_limit_is_shared_by_two_processes_within_5_percent(tmp_path, redis_server):
    amount = 40_000
    docs = [
        {"apiVersion": "networking.serving.volcano.sh/v1alpha1", "kind": "ModelServer", "metadata": {"name": "ms"},
         "spec": {"inferenceEngine": "vLLM", "workloadPort": {"port": 9},
                  "endpoints": [{"name": "e0", "address": "127.0.0.1"}]}},
        {"apiVersion": "networking.serving.volcano.sh/v1alpha1", "kind": "ModelRoute", "metadata": {"name": "r"},
         "spec": {"modelName": "deepseek", "rules": [{"name": "all", "targetModels": [{"modelServerName": "ms"}]}],
                  "rateLimit": {"inputTokensPerUnit": amount, "unit": "month",
                                "global": {"redis": {"address": redis_server.address}}}}},
    ]
    (tmp_path / "routes.yaml").write_text(yaml.safe_dump_all(docs))
    procs = [EppProcess(tmp_path, f"epp-{i}", "--routes-file", str(tmp_path / "routes.yaml")) for i in range(2)]
    try:
        stats = await run_two(procs, "deepseek")
        admitted = sum(s["input"] for s in stats)
        assert all(s["admitted"] > 10 for s in stats), stats
        assert 0.95 * amount <= admitted <= amount + 1, stats  # +1: the month-long bucket's refill during the run
    finally:
        for p in procs:
            p.stop()
