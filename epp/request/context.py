"""What every file of the request path shares, and nothing it must import: the header and metadata names, the
decision ids, the director's config and the scheduling context the shell decides in (`ShellContext`).

A leaf module: it imports nothing from epp/request, so the director (which makes the exchange) and the stages
(which read these names) never import each other back. `epp.request.director` re-exports all of it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epp.protocol import Outcome
from scheduling.api import SchedulingContext
from scheduling.types import SchedulingError

if TYPE_CHECKING:
    from epp.routing import RouteDecision

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
PREFILLER = "x-prefiller-host-port"
LB_NS = "envoy.lb"
SUBSET_NS = "envoy.lb.subset_hint"
CONFORMANCE_REQ = "test-epp-endpoint-selection"
CONFORMANCE_RESP = "x-conformance-test-served-endpoint"
# Request headers Pointsman reads under llm-d's current name first, then the older GIE name (both accepted).
OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
MODEL_REWRITE_HEADERS = ("x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite")
OBJECTIVE, MODEL_REWRITE = OBJECTIVE_HEADERS[1], MODEL_REWRITE_HEADERS[1]  # the GIE names


def first_header(headers: Mapping[str, str], names: Sequence[str]) -> str:
    """The value of the first of `names` the request carries non-empty (lower-case names), else ""."""
    for name in names:
        value = headers.get(name)
        if value:
            return value
    return ""


RECEIPT_NS = "pointsman"  # the dynamic-metadata namespace of the decision id (Envoy's access log reads it)
RECEIPT_KEY = "decision_id"


class DecisionIds:
    """Decision ids: `<prefix>-<n in hex>`, n counting this process's decisions and rejections from 1, the prefix
    random per process (so ids from replicas, workers and restarts do not collide). Shared by every director of a
    process (a reload keeps counting). `header` / `metadata`: where replies carry the id (`--decision-header`,
    `--decision-metadata`; epp/observe/receipts.py)."""

    __slots__ = ("prefix", "n", "header", "metadata")

    def __init__(self, prefix: str | None = None, *, header: str = "", metadata: bool = False) -> None:
        self.prefix = prefix if prefix is not None else os.urandom(3).hex()
        self.n = 0
        self.header = header
        self.metadata = metadata

    def take(self) -> int:
        self.n = n = self.n + 1
        return n

    def format(self, n: int) -> str:
        return f"{self.prefix}-{n:x}"

    def stamp(self, outcome: Outcome, n: int) -> Outcome:
        """Decision `n`'s id in the reply's `pointsman` metadata namespace (the access log prints it) and, for a
        rejection, in the local reply's header, as configured. Nothing when both are off."""
        if not (self.metadata or (self.header and outcome.reject_status)):
            return outcome
        did = self.format(n)
        if self.metadata:
            outcome.metadata = {**(outcome.metadata or {}), RECEIPT_NS: {RECEIPT_KEY: did}}
        if self.header and outcome.reject_status:
            outcome.reject_headers = [*outcome.reject_headers, (self.header, did)]
        return outcome

    def parse(self, decision_id: str) -> int | None:
        """The number of one of this process's ids; None for a malformed id or another process's."""
        prefix, sep, num = decision_id.strip().rpartition("-")
        if not sep or prefix != self.prefix:
            return None
        try:
            n = int(num, 16)
        except ValueError:
            return None
        return n if 0 < n <= self.n else None


@dataclass(frozen=True, slots=True)
class DirectorConfig:
    model_header: str | None = "X-Gateway-Model-Name"  # None or "": not set
    base_model_header: str | None = "X-Gateway-Base-Model-Name"  # None or "": not set
    ai_gateway_model_header: str | None = "x-ai-eg-model"  # None or "": not set
    fallbacks: int = 0  # extra endpoints listed (comma list) in envoy.lb metadata for override_host retries
    conformance: bool = False  # honour test-epp-endpoint-selection / report x-conformance-test-served-endpoint
    default_pool: str | None = None
    pool_metadata_key: tuple[str, str] = ("pointsman", "pool")  # route metadata naming the pool (set by Envoy)
    log_decisions: bool = False
    # What the replies carry (epp/request/outputs.py: `--data-plane` and its per-output flags); the defaults are `full`.
    destination_header: bool = True  # x-gateway-destination-endpoint: ORIGINAL_DST and agentgateway read it
    destination_metadata: bool = True  # envoy.lb metadata: override_host reads it
    clear_route_cache: bool = True  # gateways that route on the model headers need the route recomputed
    remove_absent: bool = True  # remove the reserved client headers even when the request has none of them


@dataclass(slots=True)
class ShellContext(SchedulingContext):
    """The scheduler's context plus what only the shell reads: the routing layer's decision (epp/routing), if any,
    and the pool the candidates came from (flow control queues per pool)."""

    route: RouteDecision | None = None
    pool: str = ""


def error_outcome(err: SchedulingError) -> Outcome:
    return Outcome(reject_status=err.code.http_status, reject_body=str(err))
