"""Routing outputs (--data-plane and per-output flags) and commit hooks deferred past the reply."""

from __future__ import annotations

import asyncio
import itertools
import random

import orjson
import pytest

from epp.cli import build_parser
from epp.datastore import Datastore, PoolSpec
from epp.director import DESTINATION, LB_NS, PREFILLER, SERVED, SUBSET, Director, DirectorConfig
from epp.outputs import director_outputs
from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, endpoint_key

HDRS = {":path": "/v1/chat/completions", ":method": "POST", "x-request-id": "r1"}
FULL_SETS = [DESTINATION, "X-Gateway-Model-Name", "X-Gateway-Base-Model-Name", "x-ai-eg-model"]


def outputs(*flags: str) -> dict:
    return director_outputs(build_parser().parse_args(["serve", *flags]))


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
class Recording:
    """A scheduler that records the order of the director's calls (picks endpoints in turn)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.n = 0

    def schedule(self, ctx: SchedulingContext, *, dry_run: bool = False) -> SchedulingResult:
        self.n += 1
        self.log.append(f"schedule{self.n}")
        eps = sorted(ctx.candidates, key=lambda e: e.key)
        return SchedulingResult(targets=[eps[self.n % len(eps)]], profile="t")

    def pre_request(self, ctx, result) -> None:
        self.log.append(f"pre:{ctx.request.body['messages'][0]['content']}")

    def response_complete(self, ctx, result) -> None:
        self.log.append(f"done:{ctx.request.body['messages'][0]['content']}")

    def endpoint_removed(self, key) -> None:
        self.log.append("removed")


async def test_pre_request_runs_after_the_reply_and_before_anything_that_needs_it():
    sched = Recording()
    ds = pool()
    d = Director(ds, sched)
    a = d.exchange()
    a.decide(HDRS, chat("a"), {})
    assert sched.log == ["schedule1"], "the reply is built before the commit hook runs"
    assert sum(v.requests for v in ds.inflight.view().values()) == 1, "the in-flight count is taken at once"
    b = d.exchange()
    b.decide(HDRS, chat("b"), {})
    assert sched.log == ["schedule1", "pre:a", "schedule2"], "the next decision sees every earlier commit"
    await asyncio.sleep(0)  # the end of the loop iteration runs what is left
    assert sched.log[-1] == "pre:b"
    c = d.exchange()
    c.decide(HDRS, chat("c"), {})
    c.close()
    assert sched.log[-2:] == ["pre:c", "done:c"], "a request's close follows its own commit"
    e = d.exchange()
    e.decide(HDRS, chat("e"), {})
    ds.set_pool(PoolSpec("pool"), [])
    d.endpoint_removed("10.0.0.1:8000")
    assert sched.log[-2:] == ["pre:e", "removed"], "an endpoint is forgotten after the commits that name it"
    for ex in (a, b, e):
        ex.close()


def test_without_a_loop_hooks_run_at_once():
    sched = Recording()
    d = Director(pool(), sched)
    d.exchange().decide(HDRS, chat("a"), {})
    assert sched.log == ["schedule1", "pre:a"]


async def test_deferred_hooks_route_exactly_like_immediate_ones():
    """Many requests decided back to back (one read's worth, no loop iteration in between) with repeated prompts:
    the real default scheduler (prefix-aware) picks the same endpoints whether its prefix recording runs at once
    or after each reply."""
    prompts = [f"shared system prompt {i % 4} " * 40 + f"question {i}" for i in range(60)]

    def picks(defer: bool) -> list[str]:
        ticks = itertools.count()
        d = Director(pool(4), load_scheduler(None, rng=random.Random(5)), DirectorConfig(defer_commit_hooks=defer),
                     clock=lambda: next(ticks) * 0.001)  # the same time line for both runs
        out, open_ = [], []
        for i, p in enumerate(prompts):
            ex = d.exchange()
            o = ex.decide(HDRS, chat(p), {})
            out.append(dict(o.set_headers)[DESTINATION])
            open_.append(ex)
            if i % 3 == 2:
                open_.pop(0).close()
        return out

    immediate = picks(False)
    assert len(set(immediate)) > 1
    assert picks(True) == immediate
