"""The lean --data-plane profiles behind the real Envoy variant each one is for: every request still lands where
Pointsman chose; and what a mismatched profile does (why `full` stays the default)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.support.stack import Stack
from tests.test_envoy_e2e import chat, post

pytestmark = pytest.mark.envoy


@pytest.mark.parametrize("variant", ["original-dst", "override-host"])
async def test_a_lean_profile_routes_on_its_own_variant(tmp_path, variant):
    s = Stack(tmp_path, variant=variant, epp_flags=("--enable-conformance-header", "--data-plane", variant))
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            for port in s.ports + s.ports[::-1]:  # the pick is forced: Envoy must follow it every time
                status, info = await post(c, s.url + "/v1/chat/completions", chat(),
                                          {"test-epp-endpoint-selection": f"127.0.0.1:{port}"})
                assert status == 200 and info["served_by"] == port, info
                for name in ("x-gateway-model-name", "x-gateway-base-model-name", "x-ai-eg-model"):
                    assert name not in info["headers"], f"{variant} profile sends no {name}"
            # A client-sent destination never picks the upstream.
            status, info = await post(c, s.url + "/v1/chat/completions", chat(),
                                      {"x-gateway-destination-endpoint": "127.0.0.1:1",
                                       "test-epp-endpoint-selection": f"127.0.0.1:{s.ports[1]}"})
            assert status == 200 and info["served_by"] == s.ports[1]
            assert info["headers"].get("x-gateway-destination-endpoint") in (None, f"127.0.0.1:{s.ports[1]}")
    finally:
        await s.stop()


async def test_the_override_host_profile_on_an_original_dst_envoy_cannot_route(tmp_path):
    s = Stack(tmp_path, variant="original-dst", epp_flags=("--data-plane", "override-host"))
    await s.start()
    try:
        async with aiohttp.ClientSession() as c:
            status, _ = await post(c, s.url + "/v1/chat/completions", chat())
        assert status == 503, "ORIGINAL_DST has no destination header to dial"
    finally:
        await s.stop()


async def test_the_original_dst_profile_on_an_override_host_envoy_is_silently_round_robin(tmp_path):
    s = Stack(tmp_path, variant="override-host",
              epp_flags=("--enable-conformance-header", "--data-plane", "original-dst"))
    await s.start()
    try:
        served = set()
        async with aiohttp.ClientSession() as c:
            for _ in range(9):
                status, info = await post(c, s.url + "/v1/chat/completions", chat(),
                                          {"test-epp-endpoint-selection": f"127.0.0.1:{s.ports[0]}"})
                assert status == 200
                served.add(info["served_by"])
        assert len(served) > 1, "no envoy.lb metadata: override_host falls back to round robin, ignoring the pick"
    finally:
        await s.stop()
