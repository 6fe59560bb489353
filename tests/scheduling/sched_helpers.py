"""Builders shared by the scheduling tests."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

from scheduling.api import InflightLoad, SchedulingContext
from scheduling.config.loader import PRODUCER_FACTORIES
from scheduling.framework import BuildContext, Plugin, create
from scheduling.types import Endpoint, LLMRequest, Metrics

ROOT = Path(__file__).resolve().parents[2]
GIE_DEFAULT = ROOT / "deploy" / "profiles" / "gie-default.yaml"  # GIE's default profile, as shipped


def ep(
    i: int,
    *,
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    labels: Mapping[str, str] | None = None,
    models: frozenset[str] = frozenset(),
    active_loras: frozenset[str] = frozenset(),
    waiting_loras: frozenset[str] = frozenset(),
    max_lora: int = 0,
    num_gpu_blocks: int | None = None,
    block_size: int | None = None,
) -> Endpoint:
    addr = f"10.0.{i // 250}.{i % 250}"
    m = Metrics(
        waiting=waiting,
        running=running,
        kv_usage=kv,
        active_loras=active_loras,
        waiting_loras=waiting_loras,
        max_lora=max_lora,
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        stale=False,
    )
    return Endpoint(
        f"{addr}:8000", addr, 8000, name=f"pod-{i}", labels=dict(labels or {}), models=models, metrics=m
    )


def req(
    prompt: str = "",
    *,
    model: str = "llama",
    target: str | None = None,
    headers: Mapping[str, str] | None = None,
    lora: str | None = None,
    rid: str = "r1",
) -> LLMRequest:
    return LLMRequest(
        rid, model, target or model, headers=dict(headers or {}), prompt=prompt, lora_adapter=lora
    )


def ctx(
    request: LLMRequest | None = None,
    candidates: list[Endpoint] | None = None,
    *,
    inflight: Mapping[str, InflightLoad] | None = None,
    now: float = 0.0,
    explain: bool = False,
) -> SchedulingContext:
    return SchedulingContext(request or req(), candidates or [], dict(inflight or {}), now, explain)


def plugin(
    type_name: str, params: Mapping | None = None, *, shared: dict | None = None, dialect: str = "epp"
):
    """A plugin built as the loader builds it. Shared data it requests is bound to producers kept in `shared`,
    so plugins built with one `shared` dict share them (as plugins of one loaded config do)."""
    shared = {} if shared is None else shared
    p = create(type_name, params=params, build=BuildContext("test.yaml", "plugins[0]", dialect, shared))
    wire(p, shared)
    return p


def wire(p: Plugin, shared: dict) -> None:
    producers = shared.setdefault("producers", {})
    for request in p.data_requests():
        producer = producers.get(request.key)
        if producer is None:
            producer = producers[request.key] = PRODUCER_FACTORIES[request.key.name](request.key, request.params, [p])
        p.bind_data(request.key, producer)


def state(seed: int = 0) -> dict:
    return {"rng": random.Random(seed)}


def scores(scorer, c: SchedulingContext, st: dict | None = None) -> list[float]:
    return list(scorer.score(c, list(c.candidates), st if st is not None else state()))


def match(index, hashes) -> dict[str, int]:
    """The reference prefix matcher the index's lazy one is checked against: for every endpoint, the number of
    consecutive hashes from the start that it holds (endpoints with 0 omitted)."""
    out = {}
    for key in index.endpoints():
        n = 0
        for h in hashes:
            if not index.holds(key, h):
                break
            n += 1
        if n:
            out[key] = n
    return out
