"""JSON views for the page, built on demand from the recorder, the scheduler and the explain code path.

Nothing here changes state: views read records and the loaded scheduler; explain calls the same dry-run code
as `epp explain` (epp.api.explain.PointsmanService.explain) and formats it the same way (epp.api.client.format_explain).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format

from epp.api.client import format_explain
from epp.api.dashboard.recorder import DecisionRecord
from epp.api.explain import PointsmanService
from epp.api.pb import pointsman_pb2 as api
from epp.api.receipts import primary_run, runner_up

if TYPE_CHECKING:
    from epp.request import DecisionIds
    from scheduling.framework.plugin import Plugin


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def summary(rec: DecisionRecord, to_wall: Callable[[float], float], ids: DecisionIds | None = None) -> dict[str, Any]:
    """One row; `ids` (the director's DecisionIds) formats the decision id."""
    out: dict[str, Any] = {
        "seq": rec.seq,
        "decision_id": ids.format(rec.receipt) if ids is not None and rec.receipt else "",
        "trace_id": rec.trace_id,
        "shadow": rec.shadow,
        "t": round(to_wall(rec.started), 3),
        "id": rec.request_id,
        "model": rec.model,
        "target": rec.target,
        "config": rec.profile,
        "profile": "",
        "decision": rec.decision,
        "endpoint": rec.endpoint,
        "prefill": rec.prefill.key if rec.prefill is not None else "",
        "fallbacks": [e.key for e in rec.targets[1:]],
        "candidates": rec.candidates,
        "runner_up": "",
        "margin": None,
        "total": None,
        "prefix": [rec.prefix_matched, rec.prefix_total] if rec.prefix_total else None,
        "decide_ms": _ms(rec.decided - rec.started),
        "error": rec.error,
        "status": rec.status,
        "ttft_ms": _ms(rec.ttft),
        "duration_ms": _ms(rec.ended - rec.started) if rec.ended and not rec.error else None,
        "done": bool(rec.ended),
    }
    got = primary_run(rec)
    if got is not None:
        name, run = got
        out["profile"] = name
        mine, other, best = runner_up(run, rec.endpoint)
        out["total"], out["runner_up"] = mine, other
        if mine is not None and best is not None:
            out["margin"] = mine - best
    if rec.prompt_tokens:
        out["tokens"] = [rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens]
    note = rec.session
    if note is not None:
        out["session"] = {"id": note.session, "source": note.source, "turn": note.turn, "parallel": note.parallel,
                          "why": note.why}
    return out


def detail(rec: DecisionRecord, to_wall: Callable[[float], float], ids: DecisionIds | None = None) -> dict[str, Any]:
    """The summary plus every profile run's per-plugin scores (from the lists the run kept by reference)."""
    out = summary(rec, to_wall, ids)
    runs: list[dict[str, Any]] = []
    for name, run in rec.runs.items():
        keys = [e.key for e in run.scored] if run.scored is not None else []
        plugins: list[dict[str, Any]] = []
        for det in run.details:
            pl: dict[str, Any] = {"kind": det.kind, "name": det.name, "type": det.type,
                                  "duration_us": round(det.duration_s * 1e6, 1)}
            if det.kind == "scorer":
                pl["weight"] = det.weight
                values = det.values
                by_key = det.scores
                if values is None and by_key is not None:
                    values = [by_key.get(k, 0.0) for k in keys]
                pl["scores"] = dict(zip(keys, values, strict=False)) if values is not None else None
            plugins.append(pl)
        totals = dict(zip(keys, run.score_totals, strict=False)) if run.score_totals is not None else {}
        runs.append({"profile": name, "targets": [e.key for e in run.targets], "candidates": keys,
                     "totals": totals, "plugins": plugins})
    out["runs"] = runs
    out["scores_recorded"] = any(p.get("scores") for r in runs for p in r["plugins"])
    return out


# ---- explain -------------------------------------------------------------------------------------------------
def parse_header_lines(text: str) -> dict[str, str]:
    """'name: value' per line (as `epp explain -H`); blank lines are skipped. Raises ValueError on a bad line."""
    headers: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"header line {line.strip()[:80]!r} is not 'name: value'")
        headers[name.strip().lower()] = value.strip()
    return headers


def explain(
    service: PointsmanService, path: str, headers: Mapping[str, str], body: bytes, pool: str
) -> dict[str, Any]:
    """The dry-run decision exactly as `epp explain --json` returns it, plus `text` as `epp explain` prints it."""
    resp = service.explain(api.ExplainRequest(path=path, headers=dict(headers), body=body, pool=pool))
    return _explained(resp)


async def explain_async(
    service: PointsmanService, path: str, headers: Mapping[str, str], body: bytes, pool: str
) -> dict[str, Any]:
    """As `explain`, tokenizing the request as a real one would be (the engine's /tokenize included)."""
    resp = await service.explain_async(api.ExplainRequest(path=path, headers=dict(headers), body=body, pool=pool))
    return _explained(resp)


def _explained(resp: api.ExplainResponse) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(resp, preserving_proto_field_name=True)
    out["text"] = format_explain(resp)
    return out


# ---- config --------------------------------------------------------------------------------------------------
def _jsonable(value: object) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _plugin(p: Plugin[Any], **extra: object) -> dict[str, Any]:
    return {"name": p.name, "type": p.type_name, "params": _jsonable(p.params), **extra}


def _profile_scheduler(sched: object) -> dict[str, Any]:
    profiles = []
    for name, prof in getattr(sched, "profiles", {}).items():
        profiles.append({
            "name": name,
            "filters": [_plugin(f) for f in prof.filters],
            "scorers": [_plugin(s, weight=w) for s, w in prof.scorers],
            "picker": _plugin(prof.picker),
        })
    handler = getattr(sched, "handler", None)
    return {"name": getattr(sched, "name", ""), "handler": _plugin(handler) if handler is not None else None,
            "profiles": profiles}


def budget_states(gates: Sequence[Any]) -> list[dict[str, Any]]:
    """LLMKube budgets' usage (name, scope, tokens and USD used and allowed, window, utilization), from the
    director's budget gate (epp/ratelimit/budgets.py); [] without one."""
    for gate in gates:
        states = getattr(gate, "states", None)
        if callable(states):
            return list(states())
    return []


def config_view(scheduler: Any, source: str, watchers: Mapping[str, Any], started_at: float,
                budgets: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The effective scheduling configs, the model bindings, how each hot-reloaded file last fared, and the state
    of the budgets."""
    scheds: Sequence[Any]
    if hasattr(scheduler, "schedulers"):  # scheduling.framework.model_scheduler.ModelScheduler
        named = dict(scheduler.schedulers)
        fallback = scheduler.fallback
        scheds = [*named.values(), *([fallback] if fallback not in named.values() else [])]
        bindings = [{"model": m, "profile": p} for m, p in scheduler.bindings]
        default = getattr(scheduler.default, "name", "")
        served = bool(getattr(scheduler, "filter_served_models", True))
    else:
        scheds, bindings, default, served = [scheduler], [], getattr(scheduler, "name", ""), False
    reloads = []
    for what, w in watchers.items():
        applied, rejected = getattr(w, "applied_at", None), getattr(w, "rejected_at", None)
        last_ok = rejected is None or (applied is not None and applied >= rejected)
        reloads.append({
            "what": what,
            "path": str(w.path),
            "reloads": w.reloads,
            "failures": w.failures,
            "last_at": applied if last_ok else rejected,
            "last_result": "ok" if last_ok else "rejected",
            "last_error": w.last_error,
        })
    return {
        "source": source,
        "started_at": started_at,
        "now": time.time(),
        "default": default,
        "filter_served_models": served,
        "bindings": bindings,
        "schedulers": [_profile_scheduler(s) for s in scheds],
        "reloads": reloads,
        "budgets": [dict(b) for b in budgets],
    }
