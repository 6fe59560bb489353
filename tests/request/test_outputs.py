"""Routing outputs (--data-plane and per-output flags)."""

from __future__ import annotations

import random

import orjson
import pytest

from epp.cmd.cli import build_parser
from epp.fleet.datastore import Datastore, PoolSpec
from epp.request.director import DESTINATION, LB_NS, PREFILLER, SERVED, SUBSET, Director, DirectorConfig
from epp.request.settings import RequestSettings
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, endpoint_key

HDRS = {":path": "/v1/chat/completions", ":method": "POST", "x-request-id": "r1"}
FULL_SETS = [DESTINATION, "X-Gateway-Model-Name", "X-Gateway-Base-Model-Name", "x-ai-eg-model"]


def outputs(*flags: str) -> dict:
    return RequestSettings.from_args(build_parser().parse_args(["serve", *flags])).outputs.fields()


def chat(content: str = "hi", model: str = "llama") -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": content}]})


def pool(n: int = 3) -> Datastore:
    ds = Datastore()
    ds.set_pool(PoolSpec("pool"), [Endpoint(key=endpoint_key(f"10.0.0.{i}", 8000), address=f"10.0.0.{i}",
                                            port=8000) for i in range(1, n + 1)])
    return ds


def reply(cfg: DirectorConfig, headers: dict | None = None):
    d = Director(pool(), load_scheduler(None, rng=random.Random(1)), cfg)
    ex = d.exchange()
    out = ex.decide({**HDRS, **(headers or {})}, chat(), {})
    ex.close()
    return out


# ---- flag resolution ---------------------------------------------------------------------------------------------
def test_the_default_is_full_and_matches_the_old_defaults():
    assert outputs() == {"destination_header": True, "destination_metadata": True, "clear_route_cache": True,
                         "remove_absent": True, "model_header": "X-Gateway-Model-Name",
                         "base_model_header": "X-Gateway-Base-Model-Name", "ai_gateway_model_header": "x-ai-eg-model"}


def test_profiles_and_overrides():
    o = outputs("--data-plane", "original-dst")
    assert o["destination_header"] and not o["destination_metadata"] and not o["clear_route_cache"]
    assert o["model_header"] is None and o["ai_gateway_model_header"] is None
    o = outputs("--data-plane", "override-host", "--model-header", "X-Model", "--clear-route-cache", "true")
    assert not o["destination_header"] and o["destination_metadata"] and o["clear_route_cache"]
    assert o["model_header"] == "X-Model" and o["base_model_header"] is None
    assert outputs("--ai-gateway-model-header", "")["ai_gateway_model_header"] is None  # '' disables, as before


@pytest.mark.parametrize("flags,problem", [
    (("--destination-header", "false", "--destination-metadata", "false"), "nothing would route"),
    (("--data-plane", "original-dst", "--fallbacks", "1"), "needs --destination-metadata"),
])
def test_combinations_that_cannot_route_are_refused(flags, problem):
    with pytest.raises(ValueError, match=problem):
        outputs(*flags)


# ---- what the replies carry --------------------------------------------------------------------------------------
def test_full_replies_are_unchanged():
    out = reply(DirectorConfig(**outputs()))
    assert [k for k, _ in out.set_headers] == FULL_SETS
    assert out.remove_headers == [SERVED, SUBSET, PREFILLER]
    assert set(out.metadata) == {LB_NS} and out.clear_route_cache


def test_original_dst_replies_carry_the_header_only():
    out = reply(DirectorConfig(**outputs("--data-plane", "original-dst")))
    assert [k for k, _ in out.set_headers] == [DESTINATION]
    assert out.remove_headers == [] and out.metadata == {} and not out.clear_route_cache
    out = reply(DirectorConfig(**outputs("--data-plane", "original-dst")), {SERVED: "x", PREFILLER: "y"})
    assert out.remove_headers == [SERVED, PREFILLER], "what the client sent is still removed"


def test_override_host_replies_carry_the_metadata_and_strip_a_client_destination():
    cfg = DirectorConfig(**outputs("--data-plane", "override-host"))
    out = reply(cfg)
    assert out.set_headers == [] and out.remove_headers == [] and not out.clear_route_cache
    assert list(out.metadata[LB_NS]) == [DESTINATION]
    out = reply(cfg, {DESTINATION: "6.6.6.6:80"})
    assert out.remove_headers == [DESTINATION], "a client never picks its own upstream"


# ---- commit hooks after the reply --------------------------------------------------------------------------------
