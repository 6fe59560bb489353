"""The conformance suite's two plugins in a scheduling config, without Envoy: the suite's config loads, the header
filter keeps what the header names (IPs, ip:port, [v6]:port), and declaring either plugin turns conformance on."""

from __future__ import annotations

import random

from scheduling.framework import BuildContext
from scheduling.plugins.filters.header_based_testing import HeaderBasedTestingFilter, named_endpoints
from scheduling.types import Endpoint, LLMRequest, endpoint_key
from tests.conformance.suite import CONFORMANCE_PLUGINS


def ep(address: str, port: int) -> Endpoint:
    return Endpoint(endpoint_key(address, port), address, port)


def test_named_endpoints_parses_addresses_and_pairs():
    ips, pairs = named_endpoints(" 10.0.0.1, 10.0.0.2:8000,[fd00::1]:9000, fd00::2 ,, 10.0.0.3:x")
    assert ips == {"10.0.0.1", "fd00::2", "10.0.0.3"}
    assert pairs == {("10.0.0.2", 8000), ("fd00::1", 9000)}


def test_header_filter_keeps_what_the_header_names():
    from scheduling.api import SchedulingContext

    f = HeaderBasedTestingFilter("f", None, BuildContext())
    eps = [ep("10.0.0.1", 3000), ep("10.0.0.1", 3002), ep("10.0.0.2", 3000), ep("fd00::1", 3000)]

    def keep(header: str | None) -> list[str]:
        headers = {} if header is None else {"test-epp-endpoint-selection": header}
        ctx = SchedulingContext(request=LLMRequest(request_id="r", model="m", target_model="m", headers=headers), candidates=eps)
        return [e.key for e in f.filter(ctx, list(eps), {})]

    assert keep(None) == [e.key for e in eps]
    assert keep("10.0.0.1") == ["10.0.0.1:3000", "10.0.0.1:3002"]
    assert keep("10.0.0.1:3002,[fd00::1]:3000") == ["10.0.0.1:3002", "[fd00::1]:3000"]
    assert keep("10.9.9.9") == []


def test_the_suites_config_loads(tmp_path):
    from scheduling.config import load_scheduler

    path = tmp_path / "conformance-plugins.yaml"
    path.write_text(CONFORMANCE_PLUGINS)
    sched = load_scheduler(str(path), rng=random.Random(1))
    types = {getattr(p, "type_name", "") for p in sched.plugins()}
    assert {"header-based-testing-filter", "destination-endpoint-served-verifier"} <= types
