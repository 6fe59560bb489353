"""The latency model's settings (in seconds and tokens; the scorer maps its parameters onto them) and the slowdown
of a batch, which every part of the model shares:

    slowdown(n) = 1 + (loadFactor − 1) × min(n, maxNumSeqs − 1) / (maxNumSeqs − 1)     n: the other requests

The reference timings describe one request alone on a reference engine (the defaults: vLLM, an 8B model on an
H100); calibration and the fitted engine timings adapt them per endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduling.latency.estimates import Timings


@dataclass(frozen=True, slots=True)
class ModelConfig:
    reference: Timings = field(default_factory=lambda: Timings(0.03, 250e-6, 0.012))
    load_factor: float = 2.0  # F: how much slower a full batch makes every request
    max_num_seqs: int = 16  # S: the engine's batch; beyond it requests wait for a slot
    default_output_tokens: int = 128
    decode_weight: float = 1.0
    eviction_weight: float = 1.0
    initial_request_seconds: float = 1.0  # D(e) before a request finished on e
    duration_alpha: float = 0.1  # the EWMA of D(e)
    block_tokens: int = 16  # the prefix index's block: evictions are priced in these
    calibrate: bool = True
    calibration_alpha: float = 0.05
    fit_engine_timings: bool = True
    prefix_trust: bool = True
    trust_window: float = 30.0
    trust_agreement: float = 0.8
    trust_floor: float = 0.2

    def slowdown(self, n: int) -> float:
        """slowdown(e) for n(e) = n requests."""
        s1 = self.max_num_seqs - 1
        return 1.0 + (self.load_factor - 1.0) * min(n, s1) / s1

    def slowdown_at(self, n: float) -> float:
        """slowdown for a mean of n other requests (fractional: an interval's mean batch)."""
        s1 = self.max_num_seqs - 1
        return 1.0 + (self.load_factor - 1.0) * min(max(0.0, n), s1) / s1

    def output_tokens(self, body: Mapping[str, Any] | None) -> int:
        """The request's output budget: its own, else `default_output_tokens`."""
        return output_tokens(body, self.default_output_tokens)


def output_tokens(body: Mapping[str, Any] | None, default: int) -> int:
    """The request's own output budget when it states one (max_completion_tokens, max_tokens or
    max_output_tokens), else `default`."""
    if body:
        for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            v = body.get(key)
            if isinstance(v, int) and v > 0:
                return v
    return default
