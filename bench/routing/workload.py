"""Shared-prefix workload generator (pure, seeded), after inference-perf's `shared_prefix` data type.

`num_groups` groups each own a system prompt of `system_prompt_len` tokens; each group has
`prompts_per_group` distinct questions of `question_len` tokens. A request picks a group (uniformly, or
Zipf-distributed with exponent `zipf_s` > 0), then one of its questions uniformly, and asks for
`output_len` tokens with ignore_eos. Arrivals are Poisson at `qps` (model time). Lengths are in
modelsim tokens (4 ASCII characters each); the chat JSON framing adds a few tokens.

With an `SloMix`, every planned request also draws (seeded, independently of the router) a TTFT SLO class and,
when the class has one, a TPOT SLO; the client sends them as `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms`.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "


@dataclass(frozen=True)
class WorkloadSpec:
    num_groups: int = 16
    prompts_per_group: int = 5
    system_prompt_len: int = 1024  # tokens
    question_len: int = 128  # tokens
    output_len: int = 64  # tokens
    zipf_s: float = 0.0  # 0 = uniform group popularity

    @property
    def distinct_prefix_tokens(self) -> int:
        return self.num_groups * self.system_prompt_len


@dataclass(frozen=True)
class SloClass:
    share: float  # of the requests
    ttft_ms: float  # model milliseconds
    tpot_ms: float | None = None


@dataclass(frozen=True)
class SloMix:
    classes: tuple[SloClass, ...]

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError("an SLO mix needs at least one class")
        for c in self.classes:
            if not (c.share > 0 and c.ttft_ms > 0) or (c.tpot_ms is not None and not c.tpot_ms > 0):
                raise ValueError(f"SLO class {c}: share, ttft and tpot must be > 0")

    @classmethod
    def parse(cls, text: str, tpot_ms: float | None = None) -> SloMix:
        """'0.3:250,0.7:2000' (share:TTFT ms), a class may add '/TPOT ms' ('0.3:250/40'); `tpot_ms` is the TPOT SLO
        of classes without one. Shares are normalized."""
        out = []
        for part in (p.strip() for p in text.split(",") if p.strip()):
            try:
                share, _, rest = part.partition(":")
                ttft, _, tpot = rest.partition("/")
                out.append(SloClass(float(share), float(ttft), float(tpot) if tpot else tpot_ms))
            except ValueError:
                raise ValueError(f"bad SLO class {part!r}: expected share:ttft_ms[/tpot_ms]") from None
        mix = cls(tuple(out))
        total = sum(c.share for c in mix.classes)
        return cls(tuple(SloClass(c.share / total, c.ttft_ms, c.tpot_ms) for c in mix.classes))

    @property
    def tight_ms(self) -> float:
        return min(c.ttft_ms for c in self.classes)

    def draw(self, rng: random.Random) -> SloClass:
        u, acc = rng.random(), 0.0
        for c in self.classes:
            acc += c.share
            if u < acc:
                return c
        return self.classes[-1]


@dataclass(frozen=True)
class Planned:
    at: float  # arrival, model seconds from the start of the stage
    group: int
    body: dict[str, Any]
    slo_ttft: float | None = None  # model seconds
    slo_tpot: float | None = None  # model seconds
    tight: bool = False  # the mix's tightest TTFT class


def _text(rng: random.Random, tokens: int) -> str:
    return "".join(rng.choices(_ALPHABET, k=4 * tokens))


class Workload:
    def __init__(self, spec: WorkloadSpec, model: str, seed: int = 0) -> None:
        self.spec = spec
        self.model = model
        self.seed = seed
        self._systems = [
            _labelled(f"group {g:05d}: ", _text(random.Random(f"{seed}/sys/{g}"), spec.system_prompt_len))
            for g in range(spec.num_groups)
        ]
        n = spec.num_groups
        weights = [1.0 / (k + 1) ** spec.zipf_s for k in range(n)] if spec.zipf_s > 0 else [1.0] * n
        total = sum(weights)
        self._cum = list(itertools.accumulate(w / total for w in weights))

    def question(self, group: int, idx: int) -> str:
        rng = random.Random(f"{self.seed}/q/{group}/{idx}")
        return _labelled(f"q{group}.{idx} ", _text(rng, self.spec.question_len))

    def body(self, group: int, idx: int) -> dict[str, Any]:
        msgs = []
        if self._systems[group]:
            msgs.append({"role": "system", "content": self._systems[group]})
        msgs.append({"role": "user", "content": self.question(group, idx)})
        return {"model": self.model, "messages": msgs, "max_tokens": self.spec.output_len, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}

    def pick_group(self, rng: random.Random) -> int:
        u = rng.random()
        lo, hi = 0, len(self._cum) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self._cum[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def warmup(self, qps: float) -> list[Planned]:
        """One request per group (its first question), evenly spaced at `qps`: every shared prefix computed once."""
        return [Planned(g / qps, g, self.body(g, 0)) for g in range(self.spec.num_groups)]

    def plan(self, qps: float, duration: float, max_requests: int, stage_seed: int = 0,
             slo: SloMix | None = None) -> list[Planned]:
        """Poisson arrivals at `qps` for `duration` model seconds, at most `max_requests`; with `slo`, each request's
        SLO class drawn from its own seeded stream (the arrivals and prompts do not change with the mix)."""
        rng = random.Random(f"{self.seed}/plan/{stage_seed}/{qps}")
        slo_rng = random.Random(f"{self.seed}/slo/{stage_seed}/{qps}")
        out: list[Planned] = []
        t = 0.0
        while len(out) < max_requests:
            t += -math.log(1.0 - rng.random()) / qps
            if t > duration:
                break
            g = self.pick_group(rng)
            idx = rng.randrange(self.spec.prompts_per_group)
            if slo is None:
                out.append(Planned(t, g, self.body(g, idx)))
                continue
            c = slo.draw(slo_rng)
            out.append(Planned(t, g, self.body(g, idx), c.ttft_ms / 1000.0,
                               None if c.tpot_ms is None else c.tpot_ms / 1000.0, c.ttft_ms == slo.tight_ms))
        return out


def _labelled(label: str, text: str) -> str:
    """`text` with its start replaced by `label` (same length; empty text stays empty)."""
    return (label + text[len(label):])[: len(text)] if text else ""
