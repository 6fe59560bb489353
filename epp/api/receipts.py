"""Decision receipts as the operator API shows them: a past decision looked up by its id, as the Receipt message
(`GetReceipt`, epp/api/explain.py), as text (`epp explain --decision ID`) and on the dashboard.

The ids, where replies carry them and how long decisions are kept are epp/observe/receipts.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epp.api.pb import pointsman_pb2 as api

if TYPE_CHECKING:
    from epp.api.dashboard import DecisionRecord, DecisionRecorder
    from epp.request import DecisionIds
    from scheduling.api import ProfileResult


def lookup(recorder: DecisionRecorder | None, ids: DecisionIds, decision_id: str, now: float
           ) -> tuple[DecisionRecord | None, str]:
    """(the record, "") or (None, why not)."""
    if recorder is None:
        return None, "no decisions are kept: the dashboard is off and --receipts is 0 or unset"
    n = ids.parse(decision_id)
    if n is None:
        prefix = decision_id.strip().rpartition("-")[0]
        if prefix and prefix != ids.prefix:
            return None, (f"decision {decision_id!r} was not made by this process (its ids start {ids.prefix}-): "
                          "another replica, worker or an earlier run")
        return None, f"{decision_id!r} is not a decision id of this process"
    rec = recorder.find(n, now)
    if rec is None:
        return None, (f"decision {decision_id!r} is no longer kept (the last {recorder.capacity} decisions, "
                      f"at most {recorder.max_age:g}s old, are)")
    return rec, ""


def primary_run(rec: DecisionRecord) -> tuple[str, ProfileResult] | None:
    """The profile run that picked the request's endpoint (the decode run under P/D)."""
    chosen = rec.endpoint
    last = None
    for name, run in rec.runs.items():
        last = (name, run)
        if run.targets and run.targets[0].key == chosen:
            return last
    return last


def runner_up(run: ProfileResult, chosen: str) -> tuple[float | None, str, float | None]:
    """(chosen total, runner-up key, runner-up total); the runner-up is the best-scored endpoint other than the
    chosen one ("" and None when the chosen endpoint was the only candidate, or the run kept no totals)."""
    scored, totals = run.scored, run.score_totals
    if not scored or totals is None:
        return None, "", None
    best_key, best, mine = "", None, None
    for ep, t in zip(scored, totals, strict=False):
        if ep.key == chosen:
            mine = t
        elif best is None or t > best:
            best_key, best = ep.key, t
    return mine, best_key, best


def receipt(rec: DecisionRecord, decision_id: str, now: float, to_wall: Callable[[float], float]) -> api.Receipt:
    """The Receipt message of a record."""
    out = api.Receipt(found=True, decision_id=decision_id, request_id=rec.request_id, trace_id=rec.trace_id,
                      decided_at=to_wall(rec.decided), age_seconds=max(0.0, now - rec.decided), model=rec.model,
                      target_model=rec.target, pool=rec.pool, config=rec.profile, decision=rec.decision,
                      endpoint=rec.endpoint, decide_seconds=rec.decided - rec.started, error_code=rec.error,
                      done=bool(rec.ended), shadow_endpoint=rec.shadow)
    out.fallbacks.extend(e.key for e in rec.targets[1:])
    if rec.prefill is not None:
        out.prefill = rec.prefill.key
    out.candidates.extend(e.key for e in rec.candidate_list)
    if rec.status.isdigit():
        out.status = int(rec.status)
    if rec.ttft is not None:
        out.ttft_seconds = rec.ttft
    if rec.ended and not rec.error:
        out.duration_seconds = rec.ended - rec.started
    out.prompt_tokens, out.completion_tokens = rec.prompt_tokens, rec.completion_tokens
    out.cached_tokens = rec.cached_tokens
    got = primary_run(rec)
    if got is not None:
        out.profile = got[0]
        mine, other, best = runner_up(got[1], rec.endpoint)
        out.runner_up = other
        if mine is not None and best is not None:
            out.margin = mine - best
    for name, run in rec.runs.items():
        keys = [e.key for e in run.scored] if run.scored is not None else []
        pr = out.profiles.add(profile=name, targets=[e.key for e in run.targets])
        if run.score_totals is not None:
            pr.totals.update(zip(keys, map(float, run.score_totals), strict=False))
        for det in run.details:
            pl = pr.plugins.add(name=det.name, type=det.type, kind=det.kind, duration_seconds=det.duration_s)
            if det.weight is not None:
                pl.weight = det.weight
            if det.kept is not None:
                pl.kept.extend(det.kept)
            values: Any = det.values
            if values is None and det.scores is not None:
                values = [det.scores.get(k, 0.0) for k in keys]
            if det.kind == "scorer" and values is not None:
                pl.scores.update(zip(keys, map(float, values), strict=False))
    return out


def get_receipt(recorder: DecisionRecorder | None, ids: DecisionIds, decision_id: str,
                clock: Callable[[], float]) -> api.Receipt:
    now = clock()
    rec, why = lookup(recorder, ids, decision_id, now)
    if rec is None:
        return api.Receipt(found=False, error=why, decision_id=decision_id)
    wall, mono = time.time(), clock()
    return receipt(rec, decision_id, now, lambda t: wall - (mono - t))


def format_receipt(r: api.Receipt) -> str:
    """`epp explain --decision ID` as text."""
    if not r.found:
        return f"not found: {r.error}"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.decided_at))
    lines = [f"decision  {r.decision_id}   {when} ({r.age_seconds:.1f}s ago)   request {r.request_id}"
             + (f"   trace {r.trace_id}" if r.trace_id else "")]
    lines.append(f"model {r.model!r} -> target {r.target_model!r}" + (f"   pool {r.pool}" if r.pool else ""))
    if r.error_code:
        lines.append(f"rejected  {r.error_code}   candidates: {len(r.candidates)}")
    else:
        lines.append(f"endpoint  {r.endpoint}" + (f"   (fallbacks: {', '.join(r.fallbacks)})" if r.fallbacks else ""))
        if r.prefill:
            lines.append(f"prefill   {r.prefill}   ({r.decision})")
        margin = f"   margin {r.margin:+.3f}" if r.HasField("margin") else ""
        lines.append(f"profile   {r.profile} (config {r.config})   runner-up {r.runner_up or '-'}{margin}"
                     f"   candidates: {len(r.candidates)}")
        if r.shadow_endpoint:
            agree = "agrees" if r.shadow_endpoint == r.endpoint else "disagrees"
            lines.append(f"shadow    {r.shadow_endpoint} ({agree})")
        outcome = [f"status {r.status}" if r.status else "status -"]
        if r.ttft_seconds:
            outcome.append(f"ttft {r.ttft_seconds * 1e3:.1f} ms")
        if r.duration_seconds:
            outcome.append(f"duration {r.duration_seconds * 1e3:.1f} ms")
        if r.prompt_tokens or r.completion_tokens:
            outcome.append(f"tokens {r.prompt_tokens} in / {r.completion_tokens} out / {r.cached_tokens} cached")
        lines.append("outcome   " + ("   ".join(outcome) if r.done else "in flight"))
    lines.append(f"decided in {r.decide_seconds * 1e3:.2f} ms over: {', '.join(r.candidates)}")
    for run in r.profiles:
        lines.append(f"\n[{run.profile}] -> {', '.join(run.targets)}")
        eps = sorted(run.totals, key=lambda k: -run.totals[k]) or list(r.candidates)
        for pl in run.plugins:
            if pl.kind == "scorer":
                scores = "  ".join(f"{k}={pl.scores.get(k, 0):.2f}" for k in eps[:6])
                lines.append(f"  scorer {pl.name:<28} w={pl.weight:g}  {scores}")
            elif pl.kind == "filter":
                lines.append(f"  filter {pl.name:<28} kept {len(pl.kept)}")
            else:
                lines.append(f"  picker {pl.name}")
        if run.totals:
            lines.append("  total  " + "  ".join(f"{k}={run.totals[k]:.2f}" for k in eps[:6]))
    return "\n".join(lines)
