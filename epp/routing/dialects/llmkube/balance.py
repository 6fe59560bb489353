"""A ModelRouter backend's `balancing`, as the scheduler that picks its pods.

    RoundRobin (the default)   round-robin-scorer                                  -> max-score-picker
    LoadAware                  least-work-scorer ×1
                               + byte-prefix-affinity-scorer ×2   (prefixAffinity)
                               + session-affinity-scorer ×4       (sessionAffinity) -> max-score-picker

Weights: a session dominates (4 > 2 + 1) while its pod is a candidate and not rebalanced; otherwise a full prefix
match (2) outweighs the whole load range (1), and between equal prefixes the less loaded pod wins. The session
scorer places a new session on the least-loaded pods; a known one stays unless its pod is queuing (waiting > 0)
and busier than the least-loaded pod by `busyMargin` (4) requests or more, and then stays where it moved (LLMKube's
rule). Only an xxh3-128 hash of the session header's value is kept, for `idleTimeout` since its last request.
Ties go to a random pod (the injected RNG).
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from epp.routing.dialects.llmkube.model import Balancing

if TYPE_CHECKING:
    from scheduling.config import ModelScheduler

SESSION_BUSY_MARGIN = 4
WEIGHTS = {"least-work-scorer": 1, "byte-prefix-affinity-scorer": 2, "session-affinity-scorer": 4}


def balancing_plugins(b: Balancing) -> list[dict[str, Any]]:
    if b.mode == "RoundRobin":
        return [{"type": "round-robin-scorer"}]
    plugins: list[dict[str, Any]] = [{"type": "least-work-scorer"}]
    if b.prefix is not None:
        plugins.append({"type": "byte-prefix-affinity-scorer", "parameters": {
            "blockBytes": b.prefix.block_bytes, "maxBlocksPerEndpoint": b.prefix.max_blocks}})
    if b.session is not None:
        plugins.append({"type": "session-affinity-scorer", "parameters": {
            "sources": [{"type": "header", "name": h} for h in b.session.headers],
            "ttlSeconds": b.session.idle_s, "useSessionToken": False, "setResponseHeader": False,
            "rebalance": True, "busyMargin": SESSION_BUSY_MARGIN}})
    return plugins


def balancing_scheduler(b: Balancing, rng: random.Random, name: str) -> ModelScheduler:
    from scheduling.config import load_scheduler

    scorers = balancing_plugins(b)
    doc = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [*scorers, {"type": "max-score-picker"}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            *({"pluginRef": s["type"], "weight": WEIGHTS.get(s["type"], 1)} for s in scorers),
            {"pluginRef": "max-score-picker"}]}],
    }
    return load_scheduler([doc], rng=rng, timer=time.perf_counter, name=name)
