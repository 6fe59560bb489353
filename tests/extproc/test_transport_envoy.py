"""End-to-end tests of test_envoy_e2e.py run again with `epp serve --grpc-transport grpcio` (grpc.aio), so both
transports are proven behind a real Envoy; test_envoy_e2e.py itself runs on the default h2 transport."""

from __future__ import annotations

import pytest

from tests.support.stack import Stack
from tests.test_envoy_e2e import (  # noqa: F401 - collected here with the grpcio `stack` below
    VARIANTS,
    test_8_mib_body,
    test_body_split_across_many_chunks_arrives_intact,
    test_client_sent_destination_header_is_ignored,
    test_epp_down_fails_closed_then_recovers,
    test_headers_only_get_is_routed,
    test_request_lands_on_the_chosen_endpoint_with_routing_headers,
    test_streamed_sse_response_arrives_intact,
)

pytestmark = pytest.mark.envoy


@pytest.fixture(params=VARIANTS)
async def stack(request, tmp_path):
    s = Stack(tmp_path, variant=request.param,
              epp_flags=("--enable-conformance-header", "--grpc-transport", "grpcio"))
    await s.start()
    assert type(s.app.server).__module__.startswith("grpc"), "the grpcio transport serves this stack"
    try:
        yield s
    finally:
        await s.stop()
