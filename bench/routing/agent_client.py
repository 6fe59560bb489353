"""Drives agent sessions (bench/routing/agent.py) against one URL, closed loop, and summarizes them.

`concurrency` sessions run at once (their starts spread over one mean pause); when one finishes the next starts,
until `sessions` have started. Each turn's prompt is built from the answer the server actually streamed back.
A failed request ends its session (it counts as unfinished). Times are model seconds (wall / time scale).

Which server served a request: the `x-inference-pod` response header, else the simulator's own record
(`GET /admin/requests`, matched on the `x-request-id` the client sent).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.routing.agent import AgentWorkload, SessionPlan
from bench.routing.client import server_records
from bench.routing.report import percentile

_MAX_BODY = 16 * 1024 * 1024
_ids = itertools.count(1)


@dataclass
class Call:
    session: str
    turn: int
    branch: int
    request_id: str
    status: int = 0
    ttft: float | None = None
    e2e: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    pod: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.ttft is not None


@dataclass
class SessionResult:
    plan: SessionPlan
    calls: list[Call] = field(default_factory=list)
    started: float | None = None  # model seconds from the stage start
    duration: float | None = None  # first request sent to last answer received; None if unfinished


def _parse_stream(raw: bytes) -> tuple[str, dict[str, Any]]:
    """(the streamed answer text, the usage object) of an OpenAI chat SSE body."""
    text: list[str] = []
    usage: dict[str, Any] = {}
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        try:
            obj = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        for ch in obj.get("choices") or ():
            content = ((ch or {}).get("delta") or {}).get("content")
            if isinstance(content, str):
                text.append(content)
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
    return "".join(text), usage


async def _call(http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], call: Call,
                scale: float, timeout: float) -> str:
    """Send one turn request; fills `call`, returns the answer text ('' on failure)."""
    t0 = time.monotonic()
    h = {"content-type": "application/json", "x-request-id": call.request_id, **headers}
    try:
        async with http.post(url, data=orjson.dumps(body), headers=h,
                             timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            call.status = resp.status
            if resp.status != 200:
                call.error = (await resp.read())[:200].decode(errors="replace")
                return ""
            call.pod = resp.headers.get("x-inference-pod", "")
            buf = bytearray()
            async for chunk in resp.content.iter_any():
                if call.ttft is None:
                    call.ttft = (time.monotonic() - t0) / scale
                if len(buf) < _MAX_BODY:
                    buf += chunk
            call.e2e = (time.monotonic() - t0) / scale
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        call.status, call.error = 0, f"{type(exc).__name__}: {exc}"
        return ""
    answer, usage = _parse_stream(bytes(buf))
    call.prompt_tokens = usage.get("prompt_tokens", 0) or 0
    call.output_tokens = usage.get("completion_tokens", 0) or 0
    call.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    return answer


async def _run_session(http: aiohttp.ClientSession, url: str, wl: AgentWorkload, res: SessionResult, scale: float,
                       timeout: float, t_start: float) -> None:
    plan = res.plan
    headers = wl.headers(plan)
    t0 = time.monotonic()
    res.started = (t0 - t_start) / scale
    messages, answer = wl.first_messages(plan), ""
    for turn in plan.turns:
        if turn.index > 0:
            messages = wl.next_messages(messages, answer, turn)
        calls = [Call(plan.session_id, turn.index, b, f"agent-{next(_ids)}") for b in range(turn.fanout)]
        res.calls += calls
        answers = await asyncio.gather(*(_call(http, url, body, headers, c, scale, timeout)
                                         for body, c in zip(wl.bodies(plan, messages, turn), calls, strict=True)))
        if not all(c.ok for c in calls):
            return
        answer = answers[0]
        if turn.pause_after > 0:
            await asyncio.sleep(turn.pause_after * scale)
    res.duration = (time.monotonic() - t0) / scale


async def run_agent_stage(url: str, wl: AgentWorkload, concurrency: int, sessions: int, time_scale: float,
                          stage: int = 0, request_timeout: float = 120.0,
                          stage_timeout: float = 600.0) -> tuple[list[SessionResult], float]:
    """Run `sessions` sessions, `concurrency` at a time; returns them (finished or not) and the stage's model
    duration. Bounded: each request by `request_timeout`, the stage by `stage_timeout` (wall seconds)."""
    results = [SessionResult(wl.session(i, stage)) for i in range(sessions)]
    queue = iter(results)
    ramp = max(wl.spec.pause_mean, 1.0) * time_scale  # spread the first starts over one mean pause
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as http:
        start = time.monotonic()

        async def worker(w: int) -> None:
            await asyncio.sleep(ramp * w / max(1, concurrency))
            for res in queue:
                await _run_session(http, url, wl, res, time_scale, request_timeout, start)

        tasks = [asyncio.ensure_future(worker(w)) for w in range(min(concurrency, sessions))]
        _, pending = await asyncio.wait(tasks, timeout=stage_timeout)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        elapsed = (time.monotonic() - start) / time_scale
    for res in results:
        for c in res.calls:
            if c.status == 0 and not c.error:
                c.error = "stage deadline"
    return results, elapsed


async def fill_pods(results: list[SessionResult], server_urls: list[str]) -> None:
    """Calls whose reply named no server: look them up in the servers' own records by request id."""
    missing = {c.request_id: c for r in results for c in r.calls if c.ok and not c.pod}
    if not missing:
        return
    async for pod, rec in server_records(server_urls):
        c = missing.get(rec.get("request_id"))
        if c is not None:
            c.pod = pod


def dump_calls(results: list[SessionResult], router: str, seed: int, stage: int) -> None:
    """With $BENCH_AGENT_CALLS set (a directory), write every call of the stage there as JSON lines, for analysis
    (which turns missed, where parallel calls went)."""
    out = os.environ.get("BENCH_AGENT_CALLS")
    if not out:
        return
    path = Path(out) / f"{router}-s{seed}-{stage}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for r in results:
            for c in r.calls:
                f.write(orjson.dumps({**dataclasses.asdict(c), "started": r.started, "duration": r.duration,
                                      "program": r.plan.agent_type}) + b"\n")


@dataclass
class AgentRow:
    regime: str
    router: str
    concurrency: int
    sessions: int
    finished: int  # sessions whose every turn succeeded
    requests: int
    errors: int
    ttft_first_p50: float | None
    ttft_first_p90: float | None
    ttft_later_p50: float | None
    ttft_later_p90: float | None
    ttft_p90: float | None  # every turn
    session_p50: float | None  # time to finish, finished sessions
    session_p90: float | None
    stayed: float | None  # later-turn calls served where the previous turn's (first) call was
    hit_rate: float
    output_tok_s: float
    sample: int = 0
    error_sample: str = ""
    floor_p90: float | None = None  # session p90 with no queueing and no prefill: pauses + pure decode
    floor_prefill_p90: float | None = None  # ... + the least prefill each turn needs (its new tokens)


def summarize_agent(regime: str, router: str, concurrency: int, results: list[SessionResult], elapsed: float,
                    sample: int = 0, workload: AgentWorkload | None = None) -> AgentRow:
    calls = [c for r in results for c in r.calls]
    ok = [c for c in calls if c.ok]
    errs = [c for c in calls if not c.ok]
    first = [c.ttft for c in ok if c.turn == 0 and c.ttft is not None]
    later = [c.ttft for c in ok if c.turn > 0 and c.ttft is not None]
    durations = [r.duration for r in results if r.duration is not None]
    stay = moved = 0
    for r in results:
        lead = {c.turn: c.pod for c in r.calls if c.branch == 0 and c.ok}
        for c in r.calls:
            prev = lead.get(c.turn - 1, "")
            if c.turn > 0 and c.ok and c.pod and prev:
                stay, moved = stay + (c.pod == prev), moved + (c.pod != prev)
    prompt = sum(c.prompt_tokens for c in ok)
    floors = [workload.floor(r.plan) for r in results] if workload is not None else []
    return AgentRow(
        regime, router, concurrency, len(results), len(durations), len(calls), len(errs),
        percentile(first, 0.5), percentile(first, 0.9), percentile(later, 0.5), percentile(later, 0.9),
        percentile(first + later, 0.9), percentile(durations, 0.5), percentile(durations, 0.9),
        stay / (stay + moved) if stay + moved else None, sum(c.cached_tokens for c in ok) / prompt if prompt else 0.0,
        sum(c.output_tokens for c in ok) / elapsed if elapsed > 0 else 0.0, sample,
        errs[0].error[:120] if errs else "", percentile([f[0] for f in floors], 0.9),
        percentile([f[1] for f in floors], 0.9))


def _f(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def agent_markdown(rows: list[AgentRow]) -> str:
    if not rows:
        return ""
    out = ["", "Agent sessions (TTFT per turn, model s; session = time to finish all turns; stayed = later-turn "
               "calls served by the server of the previous turn):", "",
           "| regime | router | sample | concurrency | sessions done | reqs | err | first turn TTFT p50 / p90 | "
           "later turns TTFT p50 / p90 | session p50 / p90 s | floor p90 s | stayed | prefix hit | out tok/s |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r.regime} | {r.router} | {r.sample} | {r.concurrency} | {r.finished}/{r.sessions} | "
                   f"{r.requests} | {r.errors} | {_f(r.ttft_first_p50)} / {_f(r.ttft_first_p90)} | "
                   f"{_f(r.ttft_later_p50)} / {_f(r.ttft_later_p90)} | {_f(r.session_p50, 1)} / "
                   f"{_f(r.session_p90, 1)} | {_f(r.floor_p90, 1)} / {_f(r.floor_prefill_p90, 1)} | "
                   f"{'-' if r.stayed is None else f'{100 * r.stayed:.0f}%'} | "
                   f"{100 * r.hit_rate:.1f}% | {r.output_tok_s:.0f} |")
    return "\n".join(out) + "\n"
