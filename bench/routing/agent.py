"""Agent sessions workload (pure, seeded): many concurrent programs, each a chain of turns with growing contexts.

A session belongs to one of `agent_types` agents (each with its own system prompt of `system_len` tokens, shared
by its sessions, as tool definitions are). Turn 1 sends the system prompt and a `question_len`-token user message.
Every later turn sends the previous turn's messages plus the model's answer (the text the server streamed back)
and a `tool_len`-token tool result, so each prompt extends the previous one. Between turns the session pauses while
its tool runs: a lognormal pause with mean `pause_mean` model seconds and shape `pause_sigma` (capped at
`pause_cap` × the mean). A share `fanout_share` of the later turns fan out: `2..fanout_max` parallel calls with the
same context, each with a short sub-task line of its own; the next turn continues from the first call's answer.

Turns per session are uniform in `turns ± turns_spread`; every turn asks for `output_len` tokens (ignore_eos).
Session identity travels as clients send it, per session, drawn from `carriers`: a mix of carrier sets, each a
'+'-joined subset of `header` (the `session_header` header), `user` (OpenAI's `user` field), `prompt_cache_key`
(OpenAI's newer cache-routing field), `metadata` (`metadata.session_id`), or `none`.
Lengths are in modelsim tokens (4 ASCII characters).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "
CARRIERS = ("header", "user", "prompt_cache_key", "metadata", "none")


@dataclass(frozen=True)
class AgentSpec:
    agent_types: int = 4
    system_len: int = 2000  # tokens, shared by an agent type's sessions
    question_len: int = 200
    tool_len: int = 500
    output_len: int = 64
    turns: int = 6
    turns_spread: int = 2
    pause_mean: float = 5.0  # model seconds
    pause_sigma: float = 1.0
    pause_cap: float = 10.0  # pauses are capped at this many times the mean
    fanout_share: float = 0.2  # of the later turns
    fanout_max: int = 4
    carriers: tuple[tuple[tuple[str, ...], float], ...] = ((("header", "user"), 0.7), (("user",), 0.3))
    session_header: str = "x-session-id"

    def __post_init__(self) -> None:
        if self.turns - self.turns_spread < 1:
            raise ValueError("agent spec: turns - turns_spread must be >= 1")
        if not 0.0 <= self.fanout_share <= 1.0 or self.fanout_max < 2:
            raise ValueError("agent spec: fanout_share must be in [0, 1] and fanout_max >= 2")
        if self.pause_mean < 0 or self.pause_sigma < 0:
            raise ValueError("agent spec: pause_mean and pause_sigma must be >= 0")
        for names, weight in self.carriers:
            if not names or weight <= 0 or any(n not in CARRIERS for n in names):
                raise ValueError(f"agent spec: bad session carrier {'+'.join(names)}:{weight} "
                                 f"(names from {', '.join(CARRIERS)}, weight > 0)")


def parse_carriers(text: str) -> tuple[tuple[tuple[str, ...], float], ...]:
    """'header+user:0.7,user:0.3' -> ((("header", "user"), 0.7), (("user",), 0.3)); a missing weight is 1."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        names, _, weight = part.partition(":")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"bad session carrier {part!r}: expected name[+name...][:weight]") from None
        out.append((tuple(n.strip() for n in names.split("+") if n.strip()), w))
    if not out:
        raise ValueError("no session carrier given")
    return tuple(out)


@dataclass(frozen=True)
class TurnPlan:
    index: int  # 0-based
    new_text: str  # the user question (turn 0) or the tool result of the previous turn
    fanout: int  # parallel calls (1 = none)
    pause_after: float  # model seconds before the next turn (0 after the last)


@dataclass(frozen=True)
class SessionPlan:
    session_id: str
    agent_type: int
    carrier: tuple[str, ...]
    turns: tuple[TurnPlan, ...]
    system: str = field(repr=False, default="")


def _text(rng: random.Random, tokens: int) -> str:
    return "".join(rng.choices(_ALPHABET, k=4 * tokens))


def _labelled(label: str, text: str) -> str:
    return (label + text[len(label):])[: len(text)]


class AgentWorkload:
    def __init__(self, spec: AgentSpec, model: str, seed: int = 0) -> None:
        self.spec = spec
        self.model = model
        self.seed = seed
        self._systems = [_labelled(f"agent {a:03d} tools: ", _text(random.Random(f"{seed}/agent/{a}"), spec.system_len))
                         for a in range(spec.agent_types)]

    def pause(self, rng: random.Random) -> float:
        s = self.spec
        if s.pause_mean <= 0:
            return 0.0
        mu = math.log(s.pause_mean) - s.pause_sigma ** 2 / 2  # so that the mean is pause_mean
        return min(rng.lognormvariate(mu, s.pause_sigma), s.pause_cap * s.pause_mean)

    def session(self, index: int, stage: int = 0) -> SessionPlan:
        """Session `index` of stage `stage`: the same for every router."""
        s = self.spec
        rng = random.Random(f"{self.seed}/session/{stage}/{index}")
        sid = f"sess-{self.seed}-{stage}-{index:05d}-{rng.getrandbits(32):08x}"
        agent = rng.randrange(s.agent_types)
        u, acc, carrier = rng.random() * sum(w for _, w in s.carriers), 0.0, s.carriers[-1][0]
        for names, w in s.carriers:
            acc += w
            if u < acc:
                carrier = names
                break
        n = rng.randint(s.turns - s.turns_spread, s.turns + s.turns_spread)
        turns = []
        for k in range(n):
            text = (_labelled(f"task {sid}: ", _text(rng, s.question_len)) if k == 0
                    else _labelled(f"result {k} of {sid}: ", _text(rng, s.tool_len)))
            fan = rng.randint(2, s.fanout_max) if k > 0 and rng.random() < s.fanout_share else 1
            turns.append(TurnPlan(k, text, fan, self.pause(rng) if k < n - 1 else 0.0))
        return SessionPlan(sid, agent, carrier, tuple(turns), self._systems[agent])

    def floor(self, plan: SessionPlan, itl: float = 0.012, overhead: float = 0.030,
              per_token: float = 0.000250) -> tuple[float, float]:
        """What no router can beat, in model seconds: (the session's pauses + its pure decode at batch size 1, that +
        the least prefill each turn needs: the overhead and its new tokens, everything before them cached). The
        timings are modelsim's reference engine (the fleet's, with no latency factor); no queueing, no load."""
        s = self.spec
        decode = sum(s.output_len - 1 for _ in plan.turns) * itl
        new = sum(s.system_len + s.question_len if t.index == 0 else s.tool_len + s.output_len for t in plan.turns)
        base = sum(t.pause_after for t in plan.turns) + decode
        return base, base + len(plan.turns) * overhead + new * per_token

    def first_messages(self, plan: SessionPlan) -> list[dict[str, Any]]:
        return [{"role": "system", "content": plan.system}, {"role": "user", "content": plan.turns[0].new_text}]

    @staticmethod
    def next_messages(messages: list[dict[str, Any]], answer: str, turn: TurnPlan) -> list[dict[str, Any]]:
        """The previous turn's messages + the model's answer + this turn's tool result (the context grows)."""
        call = f"call_{turn.index}"
        return [*messages, {"role": "assistant", "content": answer},
                {"role": "tool", "tool_call_id": call, "content": turn.new_text}]

    def bodies(self, plan: SessionPlan, messages: list[dict[str, Any]], turn: TurnPlan) -> list[dict[str, Any]]:
        """The request bodies of one turn (several for a fan-out: same context, a sub-task line each)."""
        out = []
        for b in range(turn.fanout):
            msgs = messages if turn.fanout == 1 else [*messages, {"role": "user", "content": f"subtask {b}"}]
            body: dict[str, Any] = {"model": self.model, "messages": msgs, "max_tokens": self.spec.output_len,
                                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            if "user" in plan.carrier:
                body["user"] = plan.session_id
            if "prompt_cache_key" in plan.carrier:
                body["prompt_cache_key"] = plan.session_id
            if "metadata" in plan.carrier:
                body["metadata"] = {"session_id": plan.session_id}
            out.append(body)
        return out

    def headers(self, plan: SessionPlan) -> dict[str, str]:
        return {self.spec.session_header: plan.session_id} if "header" in plan.carrier else {}
