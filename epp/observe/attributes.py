"""The request span's attributes (epp/observe/tracing.py), built once when a sampled request's stream ends.

Bounded: at most MAX_SCORERS scorers, plugin names cut to MAX_NAME characters in keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.observe.tracing import Trace
    from epp.request import RequestExchange, Usage
    from scheduling.api import SchedulingResult

MAX_SCORERS = 12  # scorers whose scores become attributes
MAX_NAME = 48  # characters of a plugin name in an attribute key
RESOLVE = 0  # the first stage mark


def marks_start(trace: Trace) -> int:
    """When the decision began (perf_counter ns)."""
    return trace.marks[RESOLVE] or trace.perf0


def _key(name: str) -> str:
    return name if len(name) <= MAX_NAME else name[:MAX_NAME]


def request_attributes(ex: RequestExchange, trace: Trace, usage: Usage | None, error: str) -> dict[str, Any]:
    """The request span's attributes (see the module docstring)."""
    a: dict[str, Any] = {"pointsman.decision_id": ex.decision_id}
    if trace.source:
        a["pointsman.parent"] = trace.source
    req = ex.request
    if req is not None:
        if req.model:
            a["gen_ai.request.model"] = req.model
        if req.target_model and req.target_model != req.model:
            a["pointsman.target_model"] = req.target_model
        a["pointsman.request_id"] = req.request_id
    ctx = ex.ctx
    if ctx is not None:
        if ctx.pool:
            a["pointsman.pool"] = ctx.pool
        a["pointsman.candidates"] = len(ctx.candidates)
        if ctx.route is not None:
            a["pointsman.route"] = f"{ctx.route.route.key}/{ctx.route.rule.name}"
            a["pointsman.backend"] = ctx.route.backend_name
    result = ex.result
    if result is not None:
        decision_attributes(result, a)
    if error:
        a["error.type"] = error
    if trace.status:
        a["http.response.status_code"] = trace.status
    pick = result.primary.key if result is not None else ""
    if trace.served and trace.served != pick:
        a["pointsman.served"] = trace.served
    if trace.first_byte:
        seconds = (trace.first_byte - marks_start(trace)) / 1e9
        a["pointsman.first_byte_seconds"] = seconds
        if ex.scanner is not None and ex.scanner.sse:
            a["gen_ai.response.time_to_first_chunk"] = seconds
    if usage is not None and usage.found:
        a["gen_ai.usage.input_tokens"] = usage.prompt_tokens
        a["gen_ai.usage.output_tokens"] = usage.completion_tokens
        if usage.cached_tokens:
            a["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
    return a


def decision_attributes(result: SchedulingResult, a: dict[str, Any]) -> None:
    """The pick, the runner-up, the margin and each scorer's score for both (the profile run that picked)."""
    pick = result.primary.key
    a["pointsman.config"] = result.profile
    a["pointsman.pick"] = pick
    if result.prefill is not None:
        a["pointsman.prefill"] = result.prefill.key
    if result.decision:
        a["pointsman.pd_decision"] = result.decision
    run_name, run = primary_run(result)
    if run is None:
        return
    a["pointsman.profile"] = run_name
    scored, totals = run.scored, run.score_totals
    if not scored or totals is None:
        return
    mine = other = -1
    best = None
    for i, (ep, t) in enumerate(zip(scored, totals, strict=False)):
        if ep.key == pick:
            mine = i
        elif best is None or t > best:
            other, best = i, t
    if other >= 0:
        a["pointsman.runner_up"] = scored[other].key
        if mine >= 0:
            a["pointsman.margin"] = float(totals[mine] - totals[other])
    n = 0
    for det in run.details:
        if det.kind != "scorer" or n >= MAX_SCORERS:
            continue
        n += 1
        values = det.values
        if values is not None:
            if 0 <= mine < len(values):
                a["pointsman.score." + _key(det.name)] = float(values[mine])
        elif det.scores is not None and mine >= 0:  # by endpoint: only the pick's is read
            a["pointsman.score." + _key(det.name)] = float(det.scores.get(pick, 0.0))


def primary_run(result: SchedulingResult) -> tuple[str, Any]:
    """The profile run that picked the primary endpoint (the decode run under P/D)."""
    chosen = result.primary.key
    last: tuple[str, Any] = ("", None)
    for name, run in result.profile_results.items():
        last = (name, run)
        if run.targets and run.targets[0].key == chosen:
            return last
    return last
