"""Recorded decisions: a fixed, seeded workload through the shipped profiles, compared with a committed record.

The workload (a few hundred requests per profile) has what moves a decision: prompts sharing system prompts and
growing conversations (ASCII and not, some shorter than a block, some salted), two models and endpoints serving one
of them, engine metrics that change between decisions (and go stale), in-flight counts, pre_request and
response_complete applied as requests start and finish, endpoints with small KV caches (eviction), and endpoints
leaving and joining the pool (one coming back at an address that left). The precise profile also gets the engines'
KV events, applied as a model server would publish them, into the index the shell would own.

Profiles: the built-in default (no config: estimated latency), GIE's default weights
(deploy/profiles/gie-default.yaml) and the precise profile (deploy/profiles/estimated-latency-precise.yaml).

Each decision's picks must equal the record, and each candidate's weighted total must equal the recorded one
rounded to 6 decimals (within 1e-6, so a last-bit difference of the arithmetic does not straddle a rounding edge).
A change that alters a pick is a change of routing: make it deliberately, say why in the commit, and re-record:

    .venv/bin/python tests/scheduling/test_sched_recorded_decisions.py --record
"""

from __future__ import annotations

import heapq
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import xxhash

from scheduling.api import InflightLoad, SchedulingContext, SchedulingResult
from scheduling.config import load_scheduler
from scheduling.framework.model_scheduler import ModelScheduler
from scheduling.prefix.precise import PENDING, PreciseIndex
from scheduling.prefix.precise_data import PRECISE_INDEX
from scheduling.types import Endpoint, LLMRequest, Metrics, SchedulingError

ROOT = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).with_name("data") / "recorded_decisions.json"
PROFILES: dict[str, Path | None] = {
    "default": None,
    "gie-default": ROOT / "deploy" / "profiles" / "gie-default.yaml",
    "precise": ROOT / "deploy" / "profiles" / "estimated-latency-precise.yaml",
}
REQUESTS = 400
DIGITS = 6


def _endpoint(i: int, rnd: random.Random, models: frozenset[str] = frozenset()) -> Endpoint:
    addr = f"10.1.{i // 250}.{i % 250}"
    small = i % 5 == 3  # a small KV cache: the prefix index evicts, the latency model prices eviction
    m = Metrics(
        waiting=rnd.randrange(0, 4), running=rnd.randrange(0, 12), kv_usage=round(rnd.random(), 3),
        num_gpu_blocks=96 if small else 4096, block_size=16, stale=False,
    )
    return Endpoint(f"{addr}:8000", addr, 8000, name=f"pod-{i}", models=models, metrics=m)


def _tokens(text: str) -> list[int]:
    """A stand-in tokenizer: one token per 4 characters, a function of those characters only."""
    return [xxhash.xxh32_intdigest(text[i : i + 4].encode()) % 50_000 for i in range(0, len(text), 4)]


@dataclass(order=True)
class _Running:
    end: float
    seq: int
    ctx: SchedulingContext = field(compare=False)
    result: SchedulingResult = field(compare=False)


class Workload:
    """Drives one scheduler through the fixed workload and returns its decisions."""

    def __init__(self, profile: str, seed: int = 20240622) -> None:
        self.rnd = random.Random(seed)
        self.precise = PreciseIndex() if profile == "precise" else None
        services = {PRECISE_INDEX: self.precise} if self.precise is not None else None
        self.sched: ModelScheduler = load_scheduler(PROFILES[profile], rng=random.Random(seed + 1), services=services)
        rnd = self.rnd
        self.next_id = 0
        self.pool: list[Endpoint] = []
        for _ in range(14):
            self._join()
        self.pool[2] = self._with_models(self.pool[2], frozenset({"llama"}))
        self.pool[5] = self._with_models(self.pool[5], frozenset({"qwen"}))
        self.left: list[str] = []
        self.inflight: dict[str, list[int]] = {}
        self.running: list[_Running] = []
        self.events: list[tuple[float, int, str, list[int]]] = []  # engine stores due: (at, seq, endpoint, tokens)
        self.seq = 0
        self.now = 100.0
        self.systems = [
            "".join(rnd.choice("abcdefghij klmnop\n") for _ in range(n)) for n in (300, 1024, 2500, 4096)
        ] + ["Système: réponds en français, avec précision. " * 30, "系统提示：请用中文回答。" * 40]
        self.conversations: list[str] = []

    # ---- pool ---------------------------------------------------------------------------------------------
    def _with_models(self, e: Endpoint, models: frozenset[str]) -> Endpoint:
        return Endpoint(e.key, e.address, e.port, e.name, models=models, metrics=e.metrics)

    def _join(self, index: int | None = None) -> None:
        i = self.next_id if index is None else index
        if index is None:
            self.next_id += 1
        e = _endpoint(i, self.rnd)
        self.pool.append(e)
        if self.precise is not None:
            if i % 7 == 4:
                self.precise.set_state(e.key, 0, PENDING)  # no events yet: priced from the approximate index
            else:
                self.precise.clear(e.key, 0)
                self.precise.set_capacity(e.key, 96 if i % 5 == 3 else 400)

    def _leave(self) -> None:
        e = self.pool.pop(self.rnd.randrange(len(self.pool)))
        self.left.append(e.key)
        self.sched.endpoint_removed(e.key)
        if self.precise is not None:
            self.precise.forget(e.key)
        self.inflight.pop(e.key, None)
        self.running = [r for r in self.running if r.result.targets[0].key != e.key]  # no response_complete
        heapq.heapify(self.running)
        self.events = [ev for ev in self.events if ev[2] != e.key]
        heapq.heapify(self.events)

    def _update_metrics(self) -> None:
        rnd = self.rnd
        for j, e in enumerate(self.pool):
            if rnd.random() < 0.3:
                m = e.metrics
                n = len(self.inflight.get(e.key, ()))
                stale = rnd.random() < 0.08
                new = Metrics(
                    waiting=max(0, n - 6 + rnd.randrange(-1, 3)), running=min(n, 12) + rnd.randrange(0, 3),
                    kv_usage=round(min(1.0, rnd.random() * 0.3 + n / 20), 3), num_gpu_blocks=m.num_gpu_blocks,
                    block_size=m.block_size, stale=stale, updated_at=self.now,
                )
                self.pool[j] = e.with_metrics(new)

    # ---- requests -----------------------------------------------------------------------------------------
    def _prompt(self) -> tuple[str, str, str]:
        rnd = self.rnd
        r = rnd.random()
        if r < 0.05:
            return "", "llama", ""
        if r < 0.12:
            return "hi " * rnd.randrange(1, 15), rnd.choice(["llama", "qwen"]), ""
        if self.conversations and r < 0.55:
            c = rnd.randrange(len(self.conversations))
            turn = " ".join(rnd.choice(["yes", "no", "why", "tell me more", "ok, and then?"]) for _ in range(40))
            self.conversations[c] += f"\n[user] {turn}\n[assistant] " + "a" * rnd.randrange(10, 400)
            text = self.conversations[c]
            model = "qwen" if c % 4 == 3 else "llama"
            return text, model, ("tenant-b" if c % 6 == 5 else "")
        system = self.systems[min(int(rnd.paretovariate(1.2)) - 1, len(self.systems) - 1)]
        text = system + f"\n[user {self.seq}] " + "".join(rnd.choice("qrstuvwxyz ") for _ in range(rnd.randrange(20, 900)))
        self.conversations.append(text)
        c = len(self.conversations) - 1
        return text, "qwen" if c % 4 == 3 else "llama", ("tenant-b" if c % 6 == 5 else "")

    def _request(self) -> LLMRequest:
        prompt, model, salt = self._prompt()
        rid = f"r{self.seq}"
        body: dict[str, Any] = {"model": model}
        if self.rnd.random() < 0.4:
            body["max_tokens"] = self.rnd.choice([16, 64, 256, 1024])
        req = LLMRequest(rid, model, model, prompt=prompt, cache_salt=salt, body=body)
        if self.precise is not None:
            req.token_ids = _tokens(prompt)
            req.token_source = "local"
        return req

    def _advance(self, to: float) -> None:
        """Finish the requests and apply the engine events due by `to`, in time order."""
        while True:
            r_at = self.running[0].end if self.running else float("inf")
            e_at = self.events[0][0] if self.events else float("inf")
            if min(r_at, e_at) > to:
                break
            if r_at <= e_at:
                run = heapq.heappop(self.running)
                key = run.result.targets[0].key
                self.inflight[key].remove(run.seq)
                done = SchedulingContext(run.ctx.request, run.ctx.candidates, self._loads(), run.end)
                self.sched.response_complete(done, run.result)
            else:
                at, _, key, tokens = heapq.heappop(self.events)
                self._engine_store(key, tokens)
        self.now = to

    def _engine_store(self, key: str, tokens: list[int]) -> None:
        """The engine at `key` publishes BlockStored for the prompt's full blocks (its own block hashes)."""
        assert self.precise is not None
        n = len(tokens) // 16
        if not n:
            return
        hashes, prev = [], 0
        for b in range(n):
            prev = xxhash.xxh64_intdigest(prev.to_bytes(8, "little") + str(tokens[b * 16 : (b + 1) * 16]).encode())
            hashes.append(prev)
        self.precise.store(key, 0, hashes, None, tokens[: n * 16], 16)

    def _loads(self) -> dict[str, InflightLoad]:
        return {k: InflightLoad(len(v), 0) for k, v in self.inflight.items() if v}

    def run(self, n: int = REQUESTS) -> list[dict[str, Any]]:
        rnd = self.rnd
        out = []
        for _ in range(n):
            self._advance(self.now + rnd.expovariate(8.0))
            self._update_metrics()
            if self.seq % 60 == 59:
                self._leave()
                if self.left and rnd.random() < 0.5:
                    back = self.left.pop(0)  # the same address comes back: it must start clean
                    idx = int(back.split(".")[3].split(":")[0]) + 250 * int(back.split(".")[2])
                    self._join(idx)
                else:
                    self._join()
            if self.precise is not None and self.seq == 150:
                self.precise.mark_unknown(self.pool[1].key, 0)  # lost events: approximate from now on
            req = self._request()
            ctx = SchedulingContext(req, list(self.pool), self._loads(), self.now)
            try:
                res = self.sched.schedule(ctx)
            except SchedulingError as err:
                out.append({"id": req.request_id, "error": err.code.value})
                self.seq += 1
                continue
            self.sched.pre_request(ctx, res)
            pr = next(iter(res.profile_results.values()))
            out.append({
                "id": req.request_id,
                "pick": [e.key for e in res.targets],
                "scores": [round(float(t), DIGITS) for t in pr.score_totals or ()],
            })
            key = res.targets[0].key
            self.inflight.setdefault(key, []).append(self.seq)
            duration = 0.2 + len(req.prompt) / 40_000 + rnd.expovariate(1.5)
            heapq.heappush(self.running, _Running(self.now + duration, self.seq, ctx, res))
            if self.precise is not None and req.token_ids and rnd.random() < 0.85:
                heapq.heappush(self.events, (self.now + rnd.uniform(0.01, 0.5), self.seq, key, list(req.token_ids)))
            self.seq += 1
        return out


def record() -> dict[str, list[dict[str, Any]]]:
    return {name: Workload(name).run() for name in PROFILES}


def _dump(data: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["{"]
    for i, (name, decisions) in enumerate(data.items()):
        lines.append(f"  {json.dumps(name)}: [")
        lines += [f"    {json.dumps(d, separators=(',', ':'))}," for d in decisions]
        lines[-1] = lines[-1].rstrip(",")
        lines.append("  ]" + ("," if i < len(data) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("profile", list(PROFILES))
def test_decisions_match_the_record(profile: str) -> None:
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))[profile]
    got = Workload(profile).run()
    assert len(got) == len(recorded)
    picks_differ = [
        (r["id"], r.get("pick"), g.get("pick"))
        for r, g in zip(recorded, got, strict=True)
        if r.get("pick") != g.get("pick") or r.get("error") != g.get("error")
    ]
    assert not picks_differ, f"{len(picks_differ)} decisions changed, first: {picks_differ[:5]}"
    for r, g in zip(recorded, got, strict=True):
        if "scores" in r:
            assert len(g["scores"]) == len(r["scores"]), r["id"]
            worst = max((abs(a - b) for a, b in zip(r["scores"], g["scores"], strict=True)), default=0.0)
            assert worst <= 1.01 * 10**-DIGITS, f"{r['id']}: scores {g['scores']} != recorded {r['scores']}"


def test_the_workload_exercises_what_moves_a_decision() -> None:
    """The record would guard little if the workload never spread, evicted, erred or reused prefixes."""
    data = json.loads(RECORD.read_text(encoding="utf-8"))
    for name, decisions in data.items():
        picked = {d["pick"][0] for d in decisions if "pick" in d}
        assert len(picked) >= 10, name
    default = [d for d in data["default"] if "scores" in d]
    assert sum(1 for d in default if sorted(d["scores"])[-2:] != [1.0, 1.0]) > REQUESTS // 2


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(f"usage: {sys.argv[0]} --record   (re-records {RECORD.relative_to(ROOT)})")
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(_dump(record()), encoding="utf-8")
    print(f"recorded {RECORD.relative_to(ROOT)}")
