"""Shared-prefix workload generator (pure, seeded), after inference-perf's `shared_prefix` data type.

`num_groups` groups each own a system prompt of `system_prompt_len` tokens; each group has
`prompts_per_group` distinct questions of `question_len` tokens. A request picks a group (uniformly, or
Zipf-distributed with exponent `zipf_s` > 0), then one of its questions uniformly, and asks for
`output_len` tokens with ignore_eos. Arrivals are Poisson at `qps` (model time). Lengths are in
modelsim tokens (4 ASCII characters each); the chat JSON framing adds a few tokens.

Media (`images` > 0): every request also shows an image, drawn from a pool of `images` shared by every group
(Zipf-distributed with exponent `image_zipf`, so a few images come back across users and turns); the user message
is the image (a data URL of `image_bytes` seeded bytes, or an https URL when 0) followed by the question. modelsim
gives each image its placeholder tokens and mm hash (vLLM's treatment), so a cached prefix covers the image only
when the image is the same.

With an `SloMix`, every planned request also draws (seeded, independently of the router) a TTFT SLO class and,
when the class has one, a TPOT SLO; the client sends them as `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms`.
"""

from __future__ import annotations

import base64
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
    images: int = 0  # a pool of images shown with the questions; 0 = text only
    image_bytes: int = 0  # an image's size, sent inline as a data URL; 0 = an https URL
    image_zipf: float = 1.0  # the images' popularity

    @property
    def distinct_prefix_tokens(self) -> int:
        """The system prompts, and each (system prompt, image) pair's image placeholders (modelsim's 256)."""
        return self.num_groups * (self.system_prompt_len + self.images * 256)


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
        iw = [1.0 / (k + 1) ** spec.image_zipf for k in range(spec.images)]
        self._image_cum = list(itertools.accumulate(w / sum(iw) for w in iw))

    def image(self, i: int) -> dict[str, Any]:
        if self.spec.image_bytes <= 0:
            return {"type": "image_url", "image_url": {"url": f"https://images.example/{self.seed}/{i}.png"}}
        raw = random.Random(f"{self.seed}/img/{i}").randbytes(self.spec.image_bytes)
        return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(raw).decode()}}

    def question(self, group: int, idx: int) -> str:
        rng = random.Random(f"{self.seed}/q/{group}/{idx}")
        return _labelled(f"q{group}.{idx} ", _text(rng, self.spec.question_len))

    def body(self, group: int, idx: int, image: int | None = None) -> dict[str, Any]:
        msgs: list[dict[str, Any]] = []
        if self._systems[group]:
            msgs.append({"role": "system", "content": self._systems[group]})
        if image is None:
            msgs.append({"role": "user", "content": self.question(group, idx)})
        else:
            msgs.append({"role": "user", "content": [self.image(image),
                                                     {"type": "text", "text": self.question(group, idx)}]})
        return {"model": self.model, "messages": msgs, "max_tokens": self.spec.output_len, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}

    def pick_group(self, rng: random.Random) -> int:
        return _pick(self._cum, rng.random())

    def pick_image(self, rng: random.Random) -> int | None:
        return _pick(self._image_cum, rng.random()) if self._image_cum else None

    def warmup(self, qps: float) -> list[Planned]:
        """One request per group (its first question), evenly spaced at `qps`: every shared prefix computed once."""
        return [Planned(g / qps, g, self.body(g, 0, 0 if self._image_cum else None))
                for g in range(self.spec.num_groups)]

    def plan(self, qps: float, duration: float, max_requests: int, stage_seed: int = 0,
             slo: SloMix | None = None) -> list[Planned]:
        """Poisson arrivals at `qps` for `duration` model seconds, at most `max_requests`; with `slo`, each request's
        SLO class drawn from its own seeded stream (the arrivals and prompts do not change with the mix)."""
        rng = random.Random(f"{self.seed}/plan/{stage_seed}/{qps}")
        img_rng = random.Random(f"{self.seed}/images/{stage_seed}/{qps}")
        slo_rng = random.Random(f"{self.seed}/slo/{stage_seed}/{qps}")
        out: list[Planned] = []
        t = 0.0
        while len(out) < max_requests:
            t += -math.log(1.0 - rng.random()) / qps
            if t > duration:
                break
            g = self.pick_group(rng)
            idx = rng.randrange(self.spec.prompts_per_group)
            body = self.body(g, idx, self.pick_image(img_rng))
            if slo is None:
                out.append(Planned(t, g, body))
                continue
            c = slo.draw(slo_rng)
            out.append(Planned(t, g, body, c.ttft_ms / 1000.0,
                               None if c.tpot_ms is None else c.tpot_ms / 1000.0, c.ttft_ms == slo.tight_ms))
        return out


def _pick(cum: list[float], u: float) -> int:
    """The index of the first cumulative weight at or past `u`."""
    lo, hi = 0, len(cum) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cum[mid] < u:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _labelled(label: str, text: str) -> str:
    """`text` with its start replaced by `label` (same length; empty text stays empty)."""
    return (label + text[len(label):])[: len(text)] if text else ""
